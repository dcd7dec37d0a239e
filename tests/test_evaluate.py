"""Tests of evaluate.py: saved caption embeddings of a trained run x image embeddings.

Runs are tiny models trained for 6 steps on a 300-scene SYNTHETIC world (synthetic.py), once
per module; every test that writes evaluates its own copy of a run.
"""
import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from minialign import train
from minialign.machinery.cli import add_evaluate_args, run_evaluate
from minialign.machinery.run import dirlock, encoder
from minialign.machinery.images import evaluate, synthetic
from minialign.machinery.images.embeddings import load_embeddings, save_embeddings, sha256_file
from minialign.metrics import (collapse_stats, fit_procrustes, mutual_knn, paraphrase_r_at_1,
                               rotated_recall)
from minialign.model import ModelConfig

TINY = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_len=64)
STEPS, EVAL_EVERY = 6, 3          # saves val at steps 0, 3 and 6, test and train at step 6
N_SCENES, N_SPLIT = 300, 60       # data.split_photos default: min(1000, 300 // 5) = 60
OBJECTIVES = ("good_views", "next_token")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """{"captions", "embeddings", "runs": {objective: run dir}}, never written to by tests."""
    root = tmp_path_factory.mktemp("world")
    captions, embeddings = synthetic.write_world(root, n_scenes=N_SCENES, seed=0, world="v1")
    runs = {}
    for objective in OBJECTIVES:
        cfg = train.TrainConfig(objective=objective, captions=captions, steps=STEPS,
                                eval_every=EVAL_EVERY, batch_photos=32, model=TINY)
        runs[objective] = root / f"{objective}-seed0"
        train.train(cfg, runs[objective], progress=False)
    return {"captions": captions, "embeddings": embeddings, "runs": runs}


def copy_run(world, objective, tmp_path):
    return Path(shutil.copytree(world["runs"][objective], tmp_path / objective))


def cli(*argv):
    """`python -m minialign evaluate ARGV` without the process: parse, then run_evaluate."""
    parser = argparse.ArgumentParser()
    add_evaluate_args(parser)
    return run_evaluate(parser.parse_args([str(a) for a in argv]))


def test_split_defaults_fit_300_photos(world):
    info = json.loads((world["runs"]["good_views"] / "config.json").read_text())["info"]
    assert info["photos"] == {"train": N_SCENES - 2 * N_SPLIT, "val": N_SPLIT, "test": N_SPLIT}


def test_end_to_end_on_synthetic_world(world, tmp_path, capsys):
    runs = [copy_run(world, objective, tmp_path) for objective in OBJECTIVES]
    before = [json.loads((run / "metrics.json").read_text()) for run in runs]
    cli("--run", runs[0], "--run", runs[1], "--embeddings", world["embeddings"])
    out = capsys.readouterr().out
    for run, old in zip(runs, before):
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["evals"] == old["evals"] and metrics["final"] == old["final"]  # kept
        ia = metrics["image_alignment"]
        assert ia["embeddings"]["sha256"] == sha256_file(world["embeddings"])
        assert [e["step"] for e in ia["steps"]] == [0, EVAL_EVERY, STEPS]  # every saved step
        n = N_SPLIT
        assert ia["chance"] == {"val": {"photos": n, "mutual_knn": 10 / (n - 1)},
                                "test": {"photos": n, "mutual_knn": 10 / (n - 1),
                                         "R@1": 1 / n, "R@5": 5 / n, "R@10": 10 / n}}
        assert ia["join"]["caption_ids_only"] == ia["join"]["embedding_ids_only"] == 0
        for entry in ia["steps"]:
            assert entry["val"]["photos"]["photos"] == n
            values = list(entry["val"]["mutual_knn"]["per_slot"])
            if entry["step"] == STEPS:
                test = entry["test"]
                assert test["photos"]["train_fit"] == N_SCENES - 2 * n
                for key in ("mutual_knn", "R@1", "R@5", "R@10"):
                    assert len(test[key]["per_slot"]) == 5
                    assert test[key]["mean"] == pytest.approx(np.mean(test[key]["per_slot"]))
                    values += test[key]["per_slot"]
            else:
                assert "test" not in entry
            assert all(0.0 <= v <= 1.0 for v in values)
        assert any(line.startswith(str(run)) and metrics["objective"] in line
                   for line in out.splitlines()), out
    assert f"{10 / 59:.3f}" in out and f"{1 / 60:.3f}" in out      # chance columns
    # a second evaluation gives identical numbers, hence an identical metrics.json
    first = [(run / "metrics.json").read_bytes() for run in runs]
    cli("--run", runs[0], "--run", runs[1], "--embeddings", world["embeddings"])
    assert [(run / "metrics.json").read_bytes() for run in runs] == first


def saved(run, split, step):
    with np.load(run / "captions" / f"{split}_step{step:05d}.npz") as npz:
        return [(npz[f"slot{s}_image_ids"], npz[f"slot{s}_z"]) for s in range(5)]


def test_numbers_equal_metrics_on_saved_arrays(world):
    run = world["runs"]["next_token"]
    emb = load_embeddings(world["embeddings"])
    row = {image_id: r for r, image_id in enumerate(emb.image_ids.tolist())}

    def images(ids):  # (P,) image ids -> (P, D_img) their rows of the embeddings file
        return emb.embeddings[[row[i] for i in ids.tolist()]]

    result = evaluate.evaluate_run(run, emb, write=False)
    by_step = {e["step"]: e for e in result["steps"]}                   # steps 0, 3, 6
    val3, final = by_step[EVAL_EVERY]["val"], by_step[STEPS]
    for s, (ids, z) in enumerate(saved(run, "val", EVAL_EVERY)):
        assert val3["mutual_knn"]["per_slot"][s] == mutual_knn(z, images(ids), k=10)
    train_ids, train_z = saved(run, "train", STEPS)[0]
    test_slots = saved(run, "test", STEPS)
    for s, (ids, z) in enumerate(test_slots):
        assert final["test"]["mutual_knn"]["per_slot"][s] == mutual_knn(z, images(ids), k=10)
        direct = rotated_recall(fit_procrustes(train_z, images(train_ids)), z, images(ids))
        for k in (1, 5, 10):
            assert final["test"][f"R@{k}"]["per_slot"][s] == direct[f"R@{k}"]
    text = final["test"]["text"]
    assert text["paraphrase_R@1"] == paraphrase_r_at_1(test_slots[0][1], test_slots[1][1])
    assert text["std"] == collapse_stats(test_slots[0][1])["std"]
    # recomputed from float16 files, the text side agrees with training's float32 numbers
    trained = json.loads((run / "metrics.json").read_text())["final"]["test"]
    assert text["std"] == pytest.approx(trained["std"], rel=1e-2)
    assert text["effective_rank"] == pytest.approx(trained["effective_rank"], rel=1e-2)


def fake_run(root, ids, width=8, seed=0):
    """A hand-made run directory (one step, 2) whose photos `ids` (P,) have 5 captions each,
    except the first photo of each split, which has 4 (no slot 4)."""
    rng = np.random.default_rng(seed)
    (root / "captions").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(
        {"config": {"objective": "good_views", "seed": 0, "captions": "c.json"}, "info": {}}))
    (root / "metrics.json").write_text(json.dumps({"objective": "good_views", "seed": 0}))
    for split, part in zip(("val", "test", "train"), np.split(ids, [20, 40])):
        arrays = {}
        for s in range(5):
            part_s = part[1:] if s == 4 else part
            arrays[f"slot{s}_image_ids"] = part_s
            arrays[f"slot{s}_z"] = rng.standard_normal((len(part_s), width)).astype(np.float16)
        np.savez(root / "captions" / f"{split}_step00002.npz", **arrays)
    return root


def fake_embeddings(path, ids, dim=16, seed=1):
    meta = {"model": "test", "preprocessing": "none", "pooling": "none", "captions_sha256": ""}
    rng = np.random.default_rng(seed)
    return save_embeddings(path, ids, rng.standard_normal((len(ids), dim)), meta)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_evaluate_gives_the_text_numbers_training_wrote(world, objective):
    """One run, one number: training scores the float16 captions it saves, as evaluate does."""
    run = world["runs"][objective]
    metrics = json.loads((run / "metrics.json").read_text())
    result = evaluate.evaluate_run(run, None, write=False)
    by_step = {e["step"]: e for e in result["steps"]}
    for entry in metrics["evals"]:
        for split in ("val", "test"):
            if split in entry:
                assert by_step[entry["step"]][split]["text"] == entry[split]


def test_photos_missing_a_slot_or_an_embedding_are_left_out_and_reported(tmp_path):
    ids = np.arange(100, 200, dtype=np.int64)                   # val 20, test 20, train 60
    run = fake_run(tmp_path / "run", ids)
    embedded = np.concatenate([np.delete(ids, [5, 6, 25]), [900, 901]])  # 2 val, 1 test gone
    emb = load_embeddings(fake_embeddings(tmp_path / "e.npz", embedded))
    result = evaluate.evaluate_run(run, emb)
    val, test = result["steps"][0]["val"], result["steps"][0]["test"]
    assert val["photos"] == {"photos": 17, "split_photos": 20, "without_all_slots": 1,
                             "without_embedding": 2}
    assert test["photos"] == {"photos": 18, "split_photos": 20, "without_all_slots": 1,
                              "without_embedding": 1, "train_fit": 60}
    assert result["join"]["caption_ids_only_examples"] == [105, 106, 125]
    assert result["join"]["embedding_ids_only_examples"] == [900, 901]
    assert result["chance"]["test"]["R@1"] == 1 / 18
    assert "image_alignment" in json.loads((run / "metrics.json").read_text())


def test_no_embeddings_option_gives_text_only_and_names_the_worlds_file(world, tmp_path, capsys):
    run = copy_run(world, "good_views", tmp_path)
    before = (run / "metrics.json").read_bytes()
    summary = cli("--run", run)                                 # returns: exit status 0
    out = capsys.readouterr().out
    assert "image alignment not computed" in out and "--embeddings was not given" in out
    embeddings = world["embeddings"]                  # the synthetic world's, beside its captions
    assert f"{embeddings} exists: rerun with --embeddings {embeddings}." in out
    assert "para R@1" in out and "good_views" in out
    assert summary["embeddings"] is None and "mutual_knn" not in summary["runs"][0]
    assert (run / "metrics.json").read_bytes() == before        # nothing written


def test_given_embeddings_file_that_does_not_exist_is_an_error(world, tmp_path, capsys):
    run = copy_run(world, "good_views", tmp_path)
    before = (run / "metrics.json").read_bytes()
    absent = tmp_path / "absent.npz"
    with pytest.raises(FileNotFoundError) as info:
        cli("--run", run, "--embeddings", absent)
    world = Path(world["embeddings"])                 # the synthetic world's, beside its captions
    assert str(info.value) == (
        f"--embeddings {absent}: no such file. A SYNTHETIC world's image embeddings are "
        f"{world}, written with its captions by `python -m minialign synthetic --out "
        f"{world.parent}`: rerun with --embeddings {world}.")     # one line, no DINOv2 export
    assert capsys.readouterr().out == ""                        # fails before any table
    assert (run / "metrics.json").read_bytes() == before        # nothing written


def test_json_summary(world, tmp_path, capsys):
    run = copy_run(world, "good_views", tmp_path)
    cli("--run", run, "--embeddings", world["embeddings"], "--json")
    summary = json.loads(capsys.readouterr().out)
    (row,) = summary["runs"]
    assert row["step"] == STEPS and row["R@1_chance"] == 1 / N_SPLIT
    assert 0 <= row["mutual_knn"] <= 1 and summary["note"] is None


def test_corrupt_embeddings_file_is_an_error_naming_it(world, tmp_path):
    bad = tmp_path / "corrupt.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="corrupt.npz"):
        cli("--run", world["runs"]["good_views"], "--embeddings", bad)


def test_not_a_run_directory_is_an_error_naming_it(tmp_path):
    for name in ("empty", "no_captions"):
        (tmp_path / name).mkdir()
    (tmp_path / "no_captions" / "config.json").write_text("{}")
    for name in ("empty", "no_captions"):
        with pytest.raises(ValueError, match=f"{name}: not a run directory"):
            cli("--run", tmp_path / name)
    with pytest.raises(FileNotFoundError, match="absent: no such run directory"):
        cli("--run", tmp_path / "absent")


def test_embeddings_of_other_photos_are_an_error(world, tmp_path):
    run = copy_run(world, "good_views", tmp_path)
    other = fake_embeddings(tmp_path / "other.npz", np.arange(10**7, 10**7 + 50), dim=64)
    with pytest.raises(ValueError, match="other.npz: made from an unknown captions file, and "
                       "for the run's captions .* 60 of the 60 test photos and 60 of the 60 val "
                       "photos have no embedding"):
        cli("--run", run, "--embeddings", other)
    assert "image_alignment" not in json.loads((run / "metrics.json").read_text())
    narrow = fake_embeddings(tmp_path / "narrow.npz", np.arange(1, 50), dim=TINY.d_model - 1)
    with pytest.raises(ValueError, match="narrow.npz: image embeddings are 31-d"):
        cli("--run", run, "--embeddings", narrow)


def test_embeddings_of_another_captions_file_are_one_line_naming_both(world, tmp_path):
    """A run trained on one world, scored against the embeddings of another (issue #9)."""
    run = copy_run(world, "good_views", tmp_path)
    _, other = synthetic.write_world(tmp_path / "other", n_scenes=N_SCENES, seed=1, world="v1")
    with pytest.raises(ValueError) as err:
        cli("--run", run, "--embeddings", other)
    made = load_embeddings(other).meta["captions_sha256"][:12]
    assert str(err.value) == (
        f"{other}: made from a captions file (sha256 {made}...), but the run's captions "
        f"{world['captions']} (sha256 {sha256_file(world['captions'])[:12]}...) is another "
        f"file: 60 of the 60 test photos and 60 of the 60 val photos have no embedding; "
        f"export the embeddings from {world['captions']} (`make embeddings`)")
    assert "image_alignment" not in json.loads((run / "metrics.json").read_text())


def test_command_line_exit_codes(world, tmp_path, capsys):
    from minialign.__main__ import main
    run = copy_run(world, "good_views", tmp_path)
    assert main(["evaluate", "--run", str(run)]) == 0                       # text only
    assert main(["evaluate", "--run", str(run), "--embeddings", str(world["embeddings"])]) == 0
    assert main(["evaluate", "--run", str(tmp_path)]) == 2                  # not a run
    assert f"{tmp_path}: not a run directory" in capsys.readouterr().err
    assert main(["evaluate", "--run", str(tmp_path / "tyr")]) == 2          # no such dir
    assert f"{tmp_path / 'tyr'}: no such run directory" in capsys.readouterr().err
    absent = tmp_path / "absent.npz"                                        # given, absent
    assert main(["evaluate", "--run", str(run), "--embeddings", str(absent)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"minialign evaluate: error: --embeddings {absent}: no such file. ")
    assert err.count("\n") == 1 and "minialign export" not in err      # one line; no photos


def snapshot(run):
    """{relative path: bytes} of every file under a run directory; the lock file (which names
    its last holder: evaluate locks the run) only by name."""
    return {p.relative_to(run): p.read_bytes() if p.name != dirlock.LOCK_FILE else None
            for p in sorted(run.rglob("*")) if p.is_file()}


def one_error_line(capsys):
    """The single stderr line of a refused command (and no traceback)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.endswith("\n")
    (line,) = err.splitlines()
    return line


@pytest.mark.parametrize("damage, message", [
    ("half", "not a readable saved caption embeddings file (.npz) (empty, truncated or not an "
             ".npz)"),
    ("empty", "not a readable saved caption embeddings file (.npz) (empty, truncated or not an "
              ".npz)"),
    ("wrong_arrays", "expected slot0_z, slot1_z, ... of one width, has ['x']"),
])
def test_damaged_caption_file_is_one_line_naming_it(world, tmp_path, capsys, damage, message):
    from minialign.__main__ import main
    run = copy_run(world, "good_views", tmp_path)
    path = run / "captions" / f"val_step{EVAL_EVERY:05d}.npz"
    good = path.read_bytes()
    if damage == "half":
        path.write_bytes(good[:len(good) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        np.savez(path, x=np.zeros(3))
    before = snapshot(run)
    assert main(["evaluate", "--run", str(run)]) == 2
    assert one_error_line(capsys) == f"minialign evaluate: error: {path}: {message}"
    assert main(["evaluate", "--run", str(run), "--embeddings", str(world["embeddings"])]) == 2
    assert one_error_line(capsys) == f"minialign evaluate: error: {path}: {message}"
    assert snapshot(run) == before                           # nothing written


BAD_JSON = {  # what the file holds -> what the one error line says after "<path>: "
    "": "empty, expected a {kind} (interrupted by an older minialign, or truncated?)",
    '{"config": {"objective": "good_': "not a valid {kind} (truncated or edited? Unterminated "
                                       "string starting at: line 1 column 26 (char 25))",
    "[1, 2]": "not a {kind} (a JSON list, not an object)",
}


@pytest.mark.parametrize("name, kind", [("config.json", "run config (config.json)"),
                                        ("metrics.json", "run metrics file (metrics.json)")])
@pytest.mark.parametrize("text", list(BAD_JSON))
def test_damaged_run_json_is_one_line_naming_it(world, tmp_path, capsys, name, kind, text):
    from minialign.__main__ import main
    runs = [copy_run(world, objective, tmp_path) for objective in OBJECTIVES]
    path = runs[1] / name                        # the second run: the first must stay unwritten
    path.write_text(text)
    before = [snapshot(run) for run in runs]
    argv = ["evaluate", "--run", str(runs[0]), "--run", str(runs[1]),
            "--embeddings", str(world["embeddings"])]
    assert main(argv) == 2
    message = BAD_JSON[text].format(kind=kind)
    assert one_error_line(capsys) == f"minialign evaluate: error: {path}: {message}"
    assert [snapshot(run) for run in runs] == before          # neither metrics.json changed
    if name == "config.json":                                 # also without --embeddings
        assert main(argv[:5]) == 2
        assert one_error_line(capsys) == f"minialign evaluate: error: {path}: {message}"
        with pytest.raises(ValueError) as info:
            encoder.load_model(runs[1])
        assert str(info.value) == f"{path}: {message}"


def test_run_of_a_newer_minialign_is_refused(world, tmp_path, capsys):
    from minialign.__main__ import main
    from minialign.machinery.run.rundir import RUN_FORMAT
    run = copy_run(world, "good_views", tmp_path)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "format": RUN_FORMAT + 1}))
    before = snapshot(run)
    message = (f"{run / 'config.json'}: written by a newer minialign (run format 2, this one "
               f"reads 1); upgrade minialign")
    assert main(["evaluate", "--run", str(run), "--embeddings", str(world["embeddings"])]) == 2
    assert one_error_line(capsys) == f"minialign evaluate: error: {message}"
    with pytest.raises(ValueError) as info:
        encoder.load_model(run)
    assert str(info.value) == message
    assert snapshot(run) == before
    (run / "config.json").write_text(json.dumps({**config, "format": RUN_FORMAT}))
    assert encoder.load_model(run)[2].objective == "good_views"        # the current format reads


def test_config_without_config_object_is_one_line(world, tmp_path, capsys):
    from minialign.__main__ import main
    run = copy_run(world, "good_views", tmp_path)
    (run / "config.json").write_text('{"info": {}}')
    assert main(["evaluate", "--run", str(run)]) == 2
    assert one_error_line(capsys) == (f"minialign evaluate: error: {run / 'config.json'}: not a "
                                      f"minialign run config (no \"config\" object with "
                                      f"objective and seed)")


def test_embeddings_without_meta_are_scored_as_model_unknown(world, tmp_path, capsys):
    run = copy_run(world, "good_views", tmp_path)
    emb = load_embeddings(world["embeddings"])
    plain = tmp_path / "other_tool.npz"
    np.savez(plain, image_ids=emb.image_ids.astype(np.int32),
             embeddings=emb.embeddings.astype(np.float16))
    capsys.readouterr()
    summary = cli("--run", run, "--embeddings", plain, "--json")
    captured = capsys.readouterr()
    assert f"note: {plain}: has no meta entry" in captured.err
    assert summary["embeddings"]["model"] == "unknown (no meta in file)"
    assert summary["embeddings"]["revision"] is None
    assert summary["embeddings"]["count"] == len(emb.image_ids)
    ia = json.loads((run / "metrics.json").read_text())["image_alignment"]
    assert ia["embeddings"]["model"] == "unknown (no meta in file)"
    assert 0 <= summary["runs"][0]["mutual_knn"] <= 1


def test_the_revision_of_the_embeddings_is_printed_and_stored(world, tmp_path, capsys):
    run = copy_run(world, "good_views", tmp_path)
    emb = load_embeddings(world["embeddings"])
    pinned = tmp_path / "pinned.npz"
    save_embeddings(pinned, emb.image_ids, emb.embeddings, {**emb.meta, "revision": "abc123"})
    unpinned = tmp_path / "unpinned.npz"                # another tool's file: no revision
    save_embeddings(unpinned, emb.image_ids, emb.embeddings, {**emb.meta, "model": "dinov2"})
    for path, said in ((world["embeddings"], emb.meta["model"]),  # a synthetic world: no weights
                       (unpinned, "dinov2 (revision not recorded)"),
                       (pinned, f"{emb.meta['model']} at revision abc123")):
        cli("--run", run, "--embeddings", path, "--rescore")    # each file replaces the last
        assert f"image embeddings {path} ({said}, sha256 " in capsys.readouterr().out
    ia = json.loads((run / "metrics.json").read_text())["image_alignment"]
    assert ia["embeddings"]["revision"] == "abc123"


def test_slot_summary():
    from minialign.machinery.images.evaluate import slot_summary
    out = slot_summary(np.float64(2.0 * s) for s in range(5))
    assert out == {"mean": 4.0, "slot0": 0.0, "per_slot": [0.0, 2.0, 4.0, 6.0, 8.0]}
    assert all(type(v) is float for v in out["per_slot"])
