"""Tests of replicate.py: the lr search as a pure function, and a tiny grid end to end.

The grid: good_views and next_token x seeds 0, 1, 6 steps of a 1-block D = 16 encoder on a
300-scene SYNTHETIC world, with image evaluation, and an lr search over 1e-3 .. 1e-2 (one
point per decade, one extension allowed). It is killed in its second run and run again.
"""
import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from minialign import train
from minialign.machinery.experiment.protocol import (Protocol, extend_side, grid_lr, lr_search,
                                                     run_config, run_name, selection_score)
from minialign.machinery import cli
from minialign.machinery.grid import estimate, replicate
from minialign.machinery.experiment import report
from minialign.machinery.run import rundir
from minialign.machinery.images import synthetic
from minialign.machinery.images.embeddings import load_embeddings, save_embeddings, sha256_file
from minialign.model import ModelConfig

TINY = ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=64)


def tiny_protocol(captions, **changes):
    base = train.TrainConfig(captions=str(captions), steps=6, batch_photos=16, eval_every=3,
                             warmup_steps=2, lr=1e-3, model=TINY)
    fields = dict(base=base, objectives=("good_views", "next_token"), seeds=(0, 1),
                  lr_min=1e-3, lr_max=1e-2, lr_per_decade=1, max_extensions=1)
    return Protocol(**{**fields, **changes})


# ---------------------------------------------------------------- the lr search, pure
def test_extend_side():
    assert extend_side([0.1, 0.3, 0.2], 0) is None             # interior: stop
    assert extend_side([0.3, 0.2, 0.1], 0) == "low"            # best on an edge
    assert extend_side([0.1, 0.2, 0.3], 1) == "high"
    assert extend_side([0.1, 0.2, 0.3], 2) is None             # at most twice
    assert extend_side([0.3, 0.3, 0.1], 0) == "low"            # ties: the lower lr


@pytest.mark.parametrize("best, lrs, chosen, interior", [
    (1e-3, [1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2], 1e-3, True),            # interior at once
    (3.16e-5, [1e-5, 3.16e-5, 1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2], 3.16e-5, True),  # 2 steps
    (1e-7, [1e-5, 3.16e-5, 1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2], 1e-5, False),  # budget spent
    (1.0, [1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2, 3.16e-2, 0.1], 0.1, False),
    (2e-2, [1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2, 3.16e-2], 3.16e-2, False),  # edge, 1 allowed
])
def test_lr_search_extends_on_the_edge_at_most_twice(best, lrs, chosen, interior):
    protocol = Protocol(base=train.TrainConfig(),
                                  max_extensions=1 if best == 2e-2 else 2)
    asked = []

    def score_of(lr):  # a hand-made score peaked at `best`, on a log scale
        asked.append(lr)
        return -abs(math.log10(lr) - math.log10(best))
    search = lr_search(protocol, score_of)
    assert search["lrs"] == lrs                     # exact: grid_lr never drifts
    assert search["chosen"] == chosen and search["interior"] == interior
    assert search["todo"] is None and set(asked) == set(lrs)


def test_lr_search_stops_at_the_first_unfinished_run():
    protocol = Protocol(base=train.TrainConfig())
    scores = {1e-4: 0.3, 3.16e-4: 0.2, 1e-3: 0.1, 3.16e-3: 0.0, 1e-2: 0.0}
    search = lr_search(protocol, scores.get)
    assert search["todo"] == 3.16e-5 and search["chosen"] is None      # the next to run
    assert search["missing"] == [3.16e-5]
    search = lr_search(protocol, {**scores, 1e-3: None, 1e-2: None}.get)
    assert search["todo"] == 1e-3 and search["missing"] == [1e-3, 1e-2]   # side by side


def test_grid_lr_and_run_names():
    protocol = Protocol(base=train.TrainConfig())
    assert [grid_lr(protocol, k) for k in range(-2, 7)] == [
        1e-5, 3.16e-5, 1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2, 3.16e-2, 0.1]
    assert grid_lr(protocol, 2) == train.TrainConfig().lr  # the seed grid's run
    cfg = run_config(protocol, "bad_views", 2, 3.16e-4)
    assert run_name(cfg) == "bad_views-lr3.16e-04-seed2"


# ---------------------------------------------------------------- a tiny grid, end to end
@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """The tiny grid, killed in its second run, then run again to the end. Returns paths and
    the trainings of each attempt."""
    root = tmp_path_factory.mktemp("grid")
    captions, embeddings = synthetic.write_world(root / "world", n_scenes=300, seed=0, world="v1")
    protocol, out = tiny_protocol(captions), root / "results"
    real_train, calls = train.train, {"first": [], "second": []}

    def killed_in_second_run(cfg, run_dir, **kwargs):
        calls["first"].append(run_dir.name)
        if len(calls["first"]) == 2:
            real_train(cfg, run_dir, **kwargs, stop_after=4)   # checkpoint at 3, then "kill"
            raise KeyboardInterrupt
        return real_train(cfg, run_dir, **kwargs)

    def counted(cfg, run_dir, **kwargs):
        calls["second"].append(run_dir.name)
        return real_train(cfg, run_dir, **kwargs)
    emb = load_embeddings(embeddings)
    mp = pytest.MonkeyPatch()
    mp.setattr(train, "train", killed_in_second_run)
    with pytest.raises(KeyboardInterrupt):
        replicate.replicate(protocol, out, emb, progress=False)
    mp.setattr(train, "train", counted)
    searches = replicate.replicate(protocol, out, emb, progress=False)
    mp.undo()
    results = report.build_report(out)
    return {"out": out, "calls": calls, "searches": searches, "results": results,
            "protocol": protocol, "captions": captions, "embeddings": embeddings}


def test_rerun_skips_finished_runs_and_resumes_the_stopped_one(grid):
    runs = sorted(p.name for p in (grid["out"] / "runs").iterdir())
    first, second = grid["calls"]["first"], grid["calls"]["second"]
    assert first == ["good_views-lr1.00e-03-seed0", "next_token-lr1.00e-03-seed0"]
    assert first[0] not in second and sorted(second) == sorted(set(runs) - {first[0]})
    assert len(runs) in (6, 7, 8)              # 4 seed runs + 1e-2 each + <= 1 extension each
    log = (grid["out"] / "runs" / first[1] / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log] == list(range(1, 7))   # resumed cleanly
    for name in runs:
        assert "final" in json.loads((grid["out"] / "runs" / name / "metrics.json").read_text())
    again = []
    mp = pytest.MonkeyPatch()
    mp.setattr(train, "train", lambda *a, **k: again.append(a))
    replicate.replicate(grid["protocol"], grid["out"], None, progress=False)  # all finished
    mp.undo()
    assert again == []


def test_results_equal_numbers_recomputed_from_the_runs(grid):
    results, out = grid["results"], grid["out"]
    saved = json.loads((out / "results.json").read_text())
    md = (out / "results.md").read_text()
    assert saved["objectives"] == results["objectives"] and saved["image"] is True
    for obj in ("good_views", "next_token"):
        values = {}
        for seed in (0, 1):
            metrics = json.loads((out / "runs" / f"{obj}-lr1.00e-03-seed{seed}"
                                  / "metrics.json").read_text())
            test = metrics["image_alignment"]["steps"][-1]["test"]
            values.setdefault("mutual_knn", []).append(test["mutual_knn"]["mean"])
            values.setdefault("R@1", []).append(test["R@1"]["mean"])
            values.setdefault("paraphrase_R@1", []).append(metrics["final"]["test"]["paraphrase_R@1"])
        for key, v in values.items():
            row = saved["objectives"][obj][key]
            assert row["values"] == v
            assert row["mean"] == pytest.approx(np.mean(v), abs=1e-15)
            assert row["std"] == pytest.approx(np.std(v, ddof=1), abs=1e-15)
        line = next(l for l in md.splitlines() if l.startswith(f"| {obj} |"))
        mk = saved["objectives"][obj]["mutual_knn"]
        assert f"{mk['mean']:.3f} ± {mk['std']:.3f}" in line
        assert ", ".join(f"{x:.3f}" for x in mk["values"]) in line
        assert line.split("|")[4].strip() == "-"     # synthetic embeddings: no published value
        search = saved["lr_search"][obj]
        assert search["chosen"] == grid["searches"][obj]["chosen"]
        lr_line = next(l for l in md.splitlines() if l.startswith(f"| {obj}, lr search ("))
        assert lr_line.split("|")[4].strip() == "-"
    chance = saved["chance"]
    assert chance["mutual_knn"] == pytest.approx(10 / 59) and chance["R@1"] == pytest.approx(1 / 60)
    assert f"| chance | {10 / 59:.3f} | | | {1 / 60:.3f} |" in md
    d = saved["difference"]
    assert d["seeds"] == [0, 1] and d["per_seed"] == [
        saved["objectives"]["good_views"]["mutual_knn"]["values"][s]
        - saved["objectives"]["next_token"]["mutual_knn"]["values"][s] for s in (0, 1)]
    assert f"good_views is higher on {sum(x > 0 for x in d['per_seed'])} of 2 seeds" in md
    for text in ("numpy", "BLAS", "CPUs", "run(s) at a time", "add up to", "## Learning-rate search"):
        assert text in md


def test_missing_embeddings_stop_before_training(grid, tmp_path):
    parser = argparse.ArgumentParser()
    cli.add_replicate_args(parser)
    args = parser.parse_args(["--captions", str(grid["captions"]), "--out", str(tmp_path / "r"),
                              "--embeddings", str(tmp_path / "absent.npz"),
                              "--batch-photos", "16"])
    with pytest.raises(FileNotFoundError) as err:
        cli.run_replicate(args)
    world = Path(grid["captions"]).with_name("embeddings_synthetic.npz")
    assert str(err.value) == (
        f"{tmp_path / 'absent.npz'} does not exist: image alignment (mutual-kNN, R@1) needs "
        f"these image embeddings. A SYNTHETIC world's image embeddings are {world}, written "
        f"with its captions by `python -m minialign synthetic --out {world.parent}`: rerun "
        f"with --embeddings {world}. Or train text-only now with --image-eval off (make: "
        f"IMAGE_EVAL=off) and rerun with the file later: finished runs are scored without "
        f"retraining.")                                             # one line
    assert not (tmp_path / "r").exists()


def test_another_protocol_in_the_same_directory_is_refused(grid):
    other = tiny_protocol(grid["captions"], seeds=(0, 1, 2))
    with pytest.raises(ValueError, match=r"other settings \(seeds \(saved \[0, 1\], now \[0, 1, 2\]\)\)"):
        replicate.replicate(other, grid["out"], None, progress=False)


def test_the_same_captions_under_another_spelling_is_the_same_protocol(grid, tmp_path,
                                                                      monkeypatch):
    from minialign.machinery.experiment.protocol import check_protocol
    captions = Path(grid["captions"]).resolve()
    monkeypatch.chdir(captions.parent)
    check_protocol(grid["out"], tiny_protocol(captions.name))           # relative: the same
    copy = tmp_path / "copy.json"
    copy.write_bytes(captions.read_bytes())
    check_protocol(grid["out"], tiny_protocol(copy))                    # a copy: the same bytes
    other = tmp_path / "other.json"
    other.write_bytes(captions.read_bytes() + b" ")
    with pytest.raises(ValueError, match=f"captions \\(saved '.*', now '{other}'\\)"):
        check_protocol(grid["out"], tiny_protocol(other))


def test_other_settings_are_refused_before_the_estimate_times_anything(grid, monkeypatch):
    def timed(*args, **kwargs):
        raise AssertionError("the estimate ran before the settings were checked")
    monkeypatch.setattr(estimate, "measure", timed)
    parser = argparse.ArgumentParser()
    cli.add_replicate_args(parser)
    args = parser.parse_args(["--captions", str(grid["captions"]), "--out", str(grid["out"]),
                              "--image-eval", "off", "--steps", "7"])
    with pytest.raises(ValueError, match=r"other settings \(.*steps \(saved 6, now 7\)"):
        cli.run_replicate(args)


def test_a_diverged_run_is_recorded_and_not_retried(grid, tmp_path, monkeypatch, capsys):
    protocol = tiny_protocol(grid["captions"], objectives=("good_views",), seeds=(0,),
                             lr_per_decade=0)
    protocol = dataclasses.replace(protocol, base=dataclasses.replace(protocol.base, lr=1e6))
    tries, real_run = [], train.run

    def counted_run(*args, **kwargs):
        tries.append(args[1])
        return real_run(*args, **kwargs)
    monkeypatch.setattr(train, "run", counted_run)
    for _ in range(2):
        replicate.replicate(protocol, tmp_path, None, progress=False)
    run = tmp_path / "runs" / "good_views-lr1.00e+06-seed0"
    record = json.loads((run / rundir.DIVERGED).read_text())
    said = [line for line in capsys.readouterr().out.splitlines() if "; not retried" in line]
    assert said[0] == (f"[replicate] {run}: diverged ({record['error']}) at lr 1e+06; recorded "
                       f"in diverged.json. Lower --lr, or pass --force to start over; not "
                       f"retried")                                  # the run named once
    assert len(tries) == 1 and record["lr"] == 1e6 and 1 <= record["step"] <= protocol.base.steps
    assert any(word in record["error"] for word in ("nan", "inf", "float16"))
    assert selection_score(run, "mutual_knn") == -math.inf
    assert report.run_numbers(run)["status"] == "diverged"


def test_embeddings_of_another_captions_file_stop_before_training(grid, tmp_path):
    """Embeddings of another world (the bug of issue #9: train2017 captions, subset
    embeddings) are refused in one line, before --out is touched."""
    _, other = synthetic.write_world(tmp_path / "other", n_scenes=300, seed=1, world="v1")
    parser = argparse.ArgumentParser()
    cli.add_replicate_args(parser)
    args = parser.parse_args(["--captions", str(grid["captions"]), "--out", str(tmp_path / "r"),
                              "--embeddings", str(other), "--batch-photos", "16"])
    with pytest.raises(ValueError) as err:
        cli.run_replicate(args)
    made = load_embeddings(other).meta["captions_sha256"][:12]
    theirs = sha256_file(grid["captions"])[:12]
    assert str(err.value) == (
        f"{other}: made from a captions file (sha256 {made}...), but --captions "
        f"{grid['captions']} (sha256 {theirs}...) is another file: 60 of the 60 test photos "
        f"and 60 of the 60 val photos have no embedding; export the embeddings from "
        f"{grid['captions']} (`make embeddings`)")
    assert not (tmp_path / "r").exists()


def test_embeddings_of_some_photos_of_the_same_file_are_refused(grid, tmp_path):
    """The old `export --num-photos` on the very captions file used for training."""
    emb = load_embeddings(grid["embeddings"])
    keep = np.arange(len(emb.image_ids)) % 10 != 0                        # 30 photos gone
    meta = {**emb.meta, "captions_file": "captions_synthetic.json", "num_photos": 270,
            "count": 270}
    part = save_embeddings(tmp_path / "part.npz", emb.image_ids[keep], emb.embeddings[keep], meta)
    parser = argparse.ArgumentParser()
    cli.add_replicate_args(parser)
    args = parser.parse_args(["--captions", str(grid["captions"]), "--out", str(tmp_path / "r"),
                              "--embeddings", str(part)])
    with pytest.raises(ValueError, match=r"part.npz: made from this same captions file but only "
                       r"from some of its photos \(num_photos 270\), so for --captions .* "
                       r"\d+ of the 60 test photos and \d+ of the 60 val photos have no "
                       r"embedding; export the embeddings from .* \(`make embeddings`\)$"):
        replicate.load_image_embeddings(args)
