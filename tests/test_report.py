"""Tests of report.py: results.md rebuilt from saved runs alone, the figures, "pending".

A tiny grid (good_views and next_token x seeds 0, 1, 6 steps, D = 16, lr search 1e-3 .. 1e-2
without extensions) on a 300-scene SYNTHETIC world is trained text-only, as with
IMAGE_EVAL=off; the image columns are filled in later by evaluate, without retraining.
"""
import argparse
import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from minialign import train
from minialign.machinery.cli import add_report_args, run_report
from minialign.machinery.experiment.protocol import Protocol
from minialign.machinery.images import evaluate, synthetic
from minialign.machinery.experiment import figures, report
from minialign.machinery.grid import replicate
from minialign.machinery.images.embeddings import load_embeddings, save_embeddings
from minialign.model import ModelConfig

TINY = ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=64)
OUTPUTS = ("results.md", "results.json") + report.FIGURES


@pytest.fixture(scope="module")
def text_only(tmp_path_factory):
    """A grid directory trained without image evaluation, and the world's embeddings path."""
    root = tmp_path_factory.mktemp("report")
    captions, embeddings = synthetic.write_world(root / "world", n_scenes=300, seed=0, world="v1")
    base = train.TrainConfig(captions=str(captions), steps=6, batch_photos=16, eval_every=3,
                             warmup_steps=2, lr=1e-3, model=TINY)
    protocol = Protocol(base=base, objectives=("good_views", "next_token"),
                                  seeds=(0, 1), lr_min=1e-3, lr_max=1e-2, lr_per_decade=1,
                                  max_extensions=0)
    replicate.replicate(protocol, root / "grid", None, progress=False)
    return {"out": root / "grid", "embeddings": embeddings}


def cli(out):
    parser = argparse.ArgumentParser()
    add_report_args(parser)
    return run_report(parser.parse_args([str(out)]))


def outputs(out):
    return {name: (out / name).read_bytes() for name in OUTPUTS}


def test_pending_without_image_alignment(text_only, tmp_path, capsys):
    out = Path(shutil.copytree(text_only["out"], tmp_path / "grid"))
    results = cli(out)
    printed = capsys.readouterr().out
    md = (out / "results.md").read_text()
    assert results["image"] is False and results["metric"] == "paraphrase_R@1"
    for obj in ("good_views", "next_token"):
        row = next(l for l in md.splitlines() if l.startswith(f"| {obj} |"))
        assert row.count("pending") == 4                     # mkNN and R@1: mean, per seed
        para = results["objectives"][obj]["paraphrase_R@1"]
        assert f"{para['mean']:.3f} ± {para['std']:.3f}" in row
        lr_row = next(l for l in md.splitlines() if l.startswith(f"| {obj}, lr search ("))
        assert lr_row.count("pending") == 2
    assert "Image alignment pending: 0 of 6 finished runs" in md
    assert "selected on final val paraphrase R@1" in md
    assert "| good_views |" in printed and "results.md" in printed
    for name in report.FIGURES:
        assert Image.open(out / name).size == figures.FIG_SIZE


def test_evaluate_later_fills_in_the_image_columns(text_only, tmp_path):
    out = Path(shutil.copytree(text_only["out"], tmp_path / "grid"))
    before = {p: p.read_bytes() for p in (out / "runs").rglob("*.npz")}
    report.build_report(out)
    text_md = (out / "results.md").read_text()
    world = load_embeddings(text_only["embeddings"])
    save_embeddings(tmp_path / "pinned.npz", world.image_ids, world.embeddings,
                    {**world.meta, "revision": "abc123"})     # as export records DINOv2's
    emb = load_embeddings(tmp_path / "pinned.npz")
    for run in sorted((out / "runs").iterdir()):      # what `python -m minialign evaluate` does
        evaluate.evaluate_run(run, emb)
    results = report.build_report(out)
    md = (out / "results.md").read_text()
    assert results["image"] is True and "pending" not in md
    assert results["metric"] == "mutual_knn" and "selected on final val mutual-kNN@10" in md
    mk = results["objectives"]["good_views"]["mutual_knn"]
    assert f"{mk['mean']:.3f} ± {mk['std']:.3f}" in md
    assert "compare the ordering of the objectives with the replication's, not the values" in md
    assert f"Image embeddings: {world.meta['model']} at revision abc123." in md
    row = next(l for l in md.splitlines() if l.startswith("| good_views |")).split("|")
    assert row[4].strip() == row[7].strip() == "-"     # synthetic world: no published numbers
    pending = next(l for l in text_md.splitlines() if l.startswith("| good_views |"))
    assert "| 0.320 |" in pending and "| 0.084 |" in pending    # COCO-like, text-only: shown
    assert {p: p.read_bytes() for p in (out / "runs").rglob("*.npz")} == before  # no retraining


def test_report_rebuilds_identical_results_from_saved_runs(text_only, tmp_path):
    out = Path(shutil.copytree(text_only["out"], tmp_path / "grid"))
    report.build_report(out)
    first = outputs(out)
    for name in OUTPUTS:
        (out / name).unlink()
    report.build_report(out)
    assert outputs(out) == first                             # byte for byte, PNGs included
    assert json.loads(first["results.json"])["finished_runs"] == 6


def test_figures_have_the_expected_size_and_are_not_blank(text_only, tmp_path):
    out = Path(shutil.copytree(text_only["out"], tmp_path / "grid"))
    report.build_report(out)
    for name in report.FIGURES:
        img = Image.open(out / name)
        assert img.format == "PNG" and img.size == figures.FIG_SIZE == (1600, 900)
        colours = img.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 20, name     # text, lines and bars drawn


def test_axis_ticks_reach_past_the_largest_value_drawn():
    # the last tick is >= hi: fig_alignment's top * 1.15 leaves every marker below the frame
    assert figures.nice_ticks(0, 0.68) == [0, 0.2, 0.4, 0.6, 0.8]     # a 0.592 ceiling * 1.15
    assert figures.nice_ticks(0, 0.35) == [0, 0.1, 0.2, 0.3, 0.4]     # not 0.3 < 0.35 / 1.15
    assert figures.nice_ticks(0, 0.4) == [0, 0.1, 0.2, 0.3, 0.4]      # hi on a tick: no extra
    assert figures.nice_ticks(0.02, 0.031) == [0.02, 0.0225, 0.025, 0.0275, 0.03, 0.0325]  # 2.5e-3


def test_report_of_a_directory_without_protocol_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="protocol.json"):
        cli(tmp_path)


@pytest.mark.parametrize("name, text, message", [
    ("protocol.json", '{"base": {"objective": "good_', "not a valid replicate protocol "
     "(protocol.json) (truncated or edited? Unterminated string starting at: line 1 column 24 "
     "(char 23))"),
    ("protocol.json", "", "empty, expected a replicate protocol (protocol.json) (interrupted by "
     "an older minialign, or truncated?)"),
    ("protocol.json", '{"colour": 1}', "not a protocol of this minialign (Protocol.__init__() "
     "got an unexpected keyword argument 'colour')"),
    ("environment.json", "[]", "not a machine description (environment.json) (a JSON list, "
     "not an object)"),
    ("runs/good_views-lr1.00e-03-seed0/config.json", "{", "not a valid run config (config.json) "
     "(truncated or edited? Expecting property name enclosed in double quotes: line 1 column 2 "
     "(char 1))"),
    ("runs/good_views-lr1.00e-03-seed0/metrics.json", "", "empty, expected a run metrics file "
     "(metrics.json) (interrupted by an older minialign, or truncated?)"),
])
def test_damaged_json_is_one_line_and_changes_no_result(text_only, tmp_path, capsys, name,
                                                        text, message):
    from minialign.__main__ import main
    out = Path(shutil.copytree(text_only["out"], tmp_path / "grid"))
    report.build_report(out)
    (out / name).write_text(text)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [f"minialign report: error: {out / name}: {message}"]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_speed_table_follows_the_saved_curves(text_only):
    """results.json's "speed" per objective equals speed.py on each run's own saved val curve
    after step 0 (the untrained encoder, where the curve starts), with next_token's final value
    at the same seed as the target."""
    from minialign.machinery.experiment.speed import speed_numbers, trained
    results = report.collect(text_only["out"])
    runs, metric = results["runs"], results["metric"]
    final = {runs[n]["seed"]: runs[n]["curve"][metric][-1]
             for n in results["seed_runs"]["next_token"]}
    for obj, names in results["seed_runs"].items():
        assert all(runs[n]["curve"]["step"][0] == 0 for n in names)
        per_seed = [speed_numbers(*trained(runs[n]["curve"], metric), final[runs[n]["seed"]])
                    for n in names]
        row = results["speed"][obj]
        reached = [s["steps_to_target"] for s in per_seed if s["steps_to_target"] is not None]
        assert row["not_reached"] == len(per_seed) - len(reached)
        assert (row["steps_to_target"] or {"values": []})["values"] == reached
        assert row["auc"]["values"] == [s["auc"] for s in per_seed]
    # next_token reaches its own final value by its last evaluation at the latest
    assert results["speed"]["next_token"]["not_reached"] == 0
    assert "steps to reach next_token's final value" in report.format_markdown(results)


def test_protocol_line_says_float64_and_only_float64(text_only):
    """--dtype float64 runs (#29) say so in results.md's protocol line; float32 runs, the
    replication's arithmetic, say nothing."""
    results = report.collect(text_only["out"])
    model = results["protocol"]["base"]["model"]
    assert model["dtype"] == "float32"
    line = f"encoder D={model['d_model']} L={model['n_layers']}"
    assert f"{line}, word tokenizer" in report.format_markdown(results)
    model["dtype"] = "float64"
    assert f"{line} in float64, word tokenizer" in report.format_markdown(results)


# ---------------------------------------------------------------- context rows, side by side
@pytest.fixture(scope="module")
def evaluated(text_only, tmp_path_factory):
    """A copy of the text-only grid with every run scored against the world's embeddings."""
    out = Path(shutil.copytree(text_only["out"], tmp_path_factory.mktemp("ctx") / "grid"))
    emb = load_embeddings(text_only["embeddings"])
    for run in sorted((out / "runs").iterdir()):
        evaluate.evaluate_run(run, emb)
    return out


def table_rows(md):
    """The main table's body rows, in order."""
    lines = md.splitlines()
    first = lines.index("|---|---:|---|---:|---:|---|---:|---:|") + 1
    return lines[first:lines.index("", first)]


def test_context_rows_chance_untrained_ceiling(evaluated, text_only, tmp_path):
    out = Path(shutil.copytree(evaluated, tmp_path / "grid"))
    results = report.build_report(out)
    saved = json.loads((out / "baselines.json").read_text())
    captions = results["protocol"]["base"]["captions"]
    assert results["ceiling"] == synthetic.world_ceiling_of_files(
        captions, text_only["embeddings"], split_seed=results["protocol"]["base"]["split_seed"])
    rows = table_rows((out / "results.md").read_text())
    chance = results["chance"]
    assert rows[0] == (f"| chance | {chance['mutual_knn']:.3f} | | | {chance['R@1']:.3f} | | | "
                       f"{chance['paraphrase_R@1']:.3f} |")
    for row, (kind, objectives) in zip(rows[1:3], [("bidirectional", "good_views"),
                                                   ("causal", "next_token")]):
        tests = saved["untrained"][kind]["test"]                  # seeds 0, 1
        cells = []
        for key in ("mutual_knn", "R@1"):
            v = [t[key] for t in tests]
            cells += [f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}", f"{v[0]:.3f}, {v[1]:.3f}"]
        para = [t["paraphrase_R@1"] for t in tests]
        assert row == (f"| untrained encoder, {kind} ({objectives}) | {cells[0]} | {cells[1]} | "
                       f"| {cells[2]} | {cells[3]} | | {np.mean(para):.3f} ± "
                       f"{np.std(para, ddof=1):.3f} |")
    assert rows[3] == f"| world v1 ceiling (scene factors vs images) | {results['ceiling']:.3f} " \
                      f"| | | - | | | - |"
    assert rows[4].startswith("| good_views |") and rows[5].startswith("| next_token |")
    first = outputs(out)                      # baselines.json recomputed: the same bytes again
    (out / "baselines.json").unlink()
    report.build_report(out)
    assert outputs(out) == first and json.loads((out / "baselines.json").read_text()) == saved


def test_untrained_row_is_init_params_scored_by_hand(evaluated, text_only):
    """Seed 1's untrained scores = its init_params (train.run's first stream) encoding the test
    captions (float16, as runs save them), scored with metrics.py directly."""
    from minialign.machinery.run.monitor import prepare
    from minialign.machinery.experiment.protocol import load_protocol, run_config
    from minialign.metrics import fit_procrustes, mutual_knn, paraphrase_r_at_1, rotated_recall
    from minialign.model import encode, init_params
    report.collect(evaluated)
    saved = json.loads((evaluated / "baselines.json").read_text())["untrained"]
    cfg = run_config(load_protocol(evaluated), "good_views", 1)
    data = prepare(cfg)
    model = dataclasses.replace(cfg.model, vocab_size=data["tokenizer"].vocab_size)
    params = init_params(model, np.random.default_rng(np.random.SeedSequence(1).spawn(3)[0]))
    emb = load_embeddings(text_only["embeddings"])
    image_of = dict(zip(emb.image_ids.tolist(), emb.embeddings))

    def slot(split, s, causal):                       # (ids, z) of caption s, ids ascending
        t = data["tables"][split]
        assert (t.counts == 5).all()                  # every synthetic scene has 5 captions
        rows = t.offsets + s
        z, _, _ = encode(params, t.tokens[rows, :t.lengths[rows].max()], model, causal=causal)
        ids = data["captions"].image_ids[t.photo_idx]
        order = np.argsort(ids, kind="stable")
        return ids[order], z.astype(np.float16).astype(np.float32)[order]

    for attention, causal in (("bidirectional", False), ("causal", True)):
        test = [slot("test", s, causal) for s in range(5)]
        img = np.stack([image_of[i] for i in test[0][0].tolist()])
        train_ids, train_z = slot("train", 0, causal)
        rotation = fit_procrustes(train_z, np.stack([image_of[i] for i in train_ids.tolist()]))
        got = saved[attention]["test"][1]
        assert got["paraphrase_R@1"] == pytest.approx(paraphrase_r_at_1(test[0][1], test[1][1]),
                                                      abs=1e-12)
        assert got["mutual_knn"] == pytest.approx(np.mean([mutual_knn(z, img) for _, z in test]),
                                                  abs=1e-12)
        assert got["R@1"] == pytest.approx(
            np.mean([rotated_recall(rotation, z, img)["R@1"] for _, z in test]), abs=1e-12)


def test_untrained_row_without_image_embeddings(text_only, tmp_path):
    out = Path(shutil.copytree(text_only["out"], tmp_path / "grid"))
    results = report.build_report(out)
    rows = table_rows((out / "results.md").read_text())
    assert rows[1].startswith("| untrained encoder, bidirectional (good_views) | pending | "
                              "pending | | pending | pending | |")
    para = results["untrained"]["causal"]["paraphrase_R@1"]
    assert rows[2].endswith(f"| {para['mean']:.3f} ± {para['std']:.3f} |")
    assert results["ceiling"] is None and not any("world ceiling" in r for r in rows)


def test_a_missing_results_directory_says_how_to_make_it(tmp_path, monkeypatch, capsys):
    from minialign.__main__ import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "synthetic").mkdir(parents=True)
    (tmp_path / "results" / "synthetic" / "protocol.json").write_text("{}")   # `make demo` ran
    for argv, line in [
            (["results/synthetic", "results/synthetic-sigreg"],           # make demo-compare
             "results/synthetic-sigreg: no such directory; make it first with `make demo "
             "ANTICOLLAPSE=sigreg`"),
            (["results/coco-quick"],
             "results/coco-quick: no such directory; make it first with `make replicate-quick`"),
            (["mine/grid"], "mine/grid: no such directory; make it first with `python -m "
             "minialign replicate ... --out mine/grid`")]:
        assert main(["report"] + argv) == 2
        assert capsys.readouterr().err == f"minialign report: error: {line}\n"


def test_report_of_one_train_run_names_evaluate(text_only, capsys):
    from minialign.__main__ import main
    run = sorted((text_only["out"] / "runs").iterdir())[0]
    assert main(["report", str(run)]) == 2
    assert capsys.readouterr().err == (
        f"minialign report: error: {run}: no protocol.json; not a `replicate` results directory: "
        f"one run is read by `python -m minialign evaluate --run {run}`\n")


def test_side_by_side_table_of_two_directories(evaluated, text_only, tmp_path, capsys):
    a = Path(shutil.copytree(evaluated, tmp_path / "grid"))
    b = Path(shutil.copytree(text_only["out"], tmp_path / "grid-sigreg"))
    protocol = json.loads((b / "protocol.json").read_text())
    protocol["base"]["loss"]["anticollapse"] = "sigreg"          # as if trained with SIGReg
    (b / "protocol.json").write_text(json.dumps(protocol))
    parser = argparse.ArgumentParser()
    add_report_args(parser)
    capsys.readouterr()
    text = run_report(parser.parse_args([str(a), str(b)]))
    assert capsys.readouterr().out == text + f"\nwrote {tmp_path / 'compare_grid_grid-sigreg.md'}\n"
    assert (tmp_path / "compare_grid_grid-sigreg.md").read_text() == text
    ra, rb = report.collect(a), report.collect(b)
    lines = text.splitlines()
    assert "The protocols differ in the anti-collapse term only." in lines
    assert ("| | mutual-kNN@10, vicreg | mutual-kNN@10, sigreg | R@1, vicreg | R@1, sigreg | "
            "paraphrase R@1 (text only), vicreg | paraphrase R@1 (text only), sigreg |") in lines
    mean_std = lambda s: f"{s['mean']:.3f} ± {s['std']:.3f}"
    ga, gb = ra["objectives"]["good_views"], rb["objectives"]["good_views"]
    assert (f"| good_views | {mean_std(ga['mutual_knn'])} | pending | {mean_std(ga['R@1'])} | "
            f"pending | {mean_std(ga['paraphrase_R@1'])} | {mean_std(gb['paraphrase_R@1'])} |"
            ) in lines
    assert f"| chance | {ra['chance']['mutual_knn']:.3f} | pending |" in text
    assert f"| world ceiling (scene factors vs images) | {ra['ceiling']:.3f} | - | - | - |" in text
    ua = ra["untrained"]["causal"]["R@1"]
    assert f"| untrained encoder, causal (next_token) | {mean_std(ra['untrained']['causal']['mutual_knn'])} | pending | {mean_std(ua)} |" in text
    with pytest.raises(ValueError, match="only for a side-by-side table"):
        run_report(parser.parse_args([str(a), "--out", str(tmp_path / "x.md")]))
    protocol.update(kind="scaling", sizes=[[16, 1]])               # as if `scaling` wrote it
    (b / "protocol.json").write_text(json.dumps(protocol))
    with pytest.raises(ValueError, match=f"^{b}: a scaling sweep; `report DIR_A DIR_B` compares"):
        run_report(parser.parse_args([str(a), str(b)]))


def test_replicate_refuses_to_mix_regularisers_in_one_directory(text_only, tmp_path, capsys):
    from minialign.__main__ import main
    out = Path(shutil.copytree(text_only["out"], tmp_path / "grid"))
    captions = json.loads((out / "protocol.json").read_text())["base"]["captions"]
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["replicate", "--captions", captions, "--out", str(out), "--image-eval", "off",
                 "--anticollapse", "sigreg", "--no-estimate"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"minialign replicate: error: {out}: holds runs trained with --anticollapse vicreg; "
        f"--anticollapse sigreg needs its own results directory, e.g. --out {out}-sigreg "
        f"(`make ... ANTICOLLAPSE=sigreg` uses one)"]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_objectives_below_the_untrained_encoder_are_named():
    ms = lambda mean: {"mean": mean, "std": 0.0}
    results = {"untrained": {"bidirectional": {"objectives": ["good_views", "bad_views"],
                                               "mutual_knn": ms(0.085), "R@1": ms(0.576)},
                             "causal": {"objectives": ["next_token"], "mutual_knn": ms(0.079),
                                        "R@1": None}},
               "objectives": {"good_views": {"mutual_knn": ms(0.092), "R@1": ms(0.162)},
                              "bad_views": {"mutual_knn": ms(0.040), "R@1": ms(0.022)},
                              "next_token": {"mutual_knn": ms(0.053), "R@1": ms(0.048)}}}
    assert report.below_untrained_lines(results) == [
        "", "Below the untrained encoder: bad_views, next_token in mutual-kNN@10; good_views, "
        "bad_views in R@1, caption → image. Training with these moved the text embeddings away "
        "from an alignment the architecture already has at random initialisation; read every "
        "gain against that row, not against chance."]
    results["objectives"]["bad_views"] = results["objectives"]["next_token"] = {}
    results["untrained"]["bidirectional"]["R@1"] = ms(0.1)
    assert report.below_untrained_lines(results) == []


def test_disagreeing_image_metrics_are_said():
    """mutual-kNN and R@1 in another order, or one objective above its untrained encoder by one
    metric and below it by the other: results.md says so; agreeing metrics: nothing."""
    ms = lambda mean: {"mean": mean, "std": 0.0}
    results = {"image": True,
               "untrained": {"bidirectional": {"objectives": ["good_views"],
                                               "mutual_knn": ms(0.04), "R@1": ms(0.06)},
                             "causal": {"objectives": ["next_token"], "mutual_knn": ms(0.04),
                                        "R@1": ms(0.05)}},
               "objectives": {"good_views": {"mutual_knn": ms(0.07), "R@1": ms(0.03)},
                              "next_token": {"mutual_knn": ms(0.03), "R@1": ms(0.01)}}}
    line = report.disagreement_lines(results)[1]
    assert line.startswith("The two image metrics disagree: both order the objectives "
                           "good_views > next_token, but good_views is above the untrained "
                           "encoder in mutual-kNN@10 and below it in R@1, caption → image. ")
    assert "docs/results.md" in line
    results["objectives"]["next_token"]["R@1"] = ms(0.04)          # R@1: the other order
    assert "by mutual-kNN@10 the order is good_views > next_token; by R@1, caption → image the " \
           "order is next_token > good_views; good_views is above" in report.disagreement_lines(
               results)[1]
    results["objectives"]["good_views"]["R@1"] = ms(0.08)          # both above, same order
    results["objectives"]["next_token"]["R@1"] = ms(0.01)
    assert report.disagreement_lines(results) == []
    assert report.disagreement_lines({**results, "image": False}) == []


# ---------------------------------------------------------------- is the lr search's pick resolved
def test_pick_margin_and_its_words_by_hand():
    """The chosen lr's score minus the best other finite one, against two standard errors of a
    difference of two one-seed scores, 2 sqrt(2) x the seed grid's sample std (#29)."""
    from minialign.machinery.experiment.report import pick_margin
    from minialign.machinery.experiment.results_md import search_lines
    search = {"lrs": [1e-3, 3e-3, 1e-2, 3e-2], "scores": [0.030, 0.050, 0.041, -math.inf],
              "chosen": 3e-3}
    # seed scores 0.030, 0.032, 0.034: sample std 0.002 -> noise 2 sqrt(2) 0.002 = 0.00566
    got = pick_margin(search, [0.030, 0.032, 0.034, None])
    assert got["margin"] == pytest.approx(0.050 - 0.041)              # not the diverged -inf
    assert got["val_spread"] == pytest.approx(0.002)
    close = pick_margin({**search, "scores": [0.030, 0.050, 0.045, None]}, [0.030, 0.032, 0.034])
    assert close["margin"] == pytest.approx(0.005)
    assert pick_margin(search, [0.03])["val_spread"] is None            # one seed: no spread
    assert pick_margin({**search, "chosen": None}, [0.03, 0.04])["margin"] is None
    assert pick_margin({**search, "scores": [None, 0.05, None, None]}, [0.03, 0.04])["margin"] is None
    # every other lr diverged: nothing to beat, no margin (not +inf)
    diverged = {**search, "scores": [-math.inf, 0.05, None, -math.inf]}
    assert pick_margin(diverged, [0.03, 0.04])["margin"] is None
    protocol = {"seeds": [0, 1, 2], "lr_min": 1e-3, "lr_max": 1e-2, "lr_per_decade": 2,
                "max_extensions": 2}
    results = {"protocol": protocol, "metric": "mutual_knn",
               "lr_search": {"good_views": {**search, "interior": True, "todo": None, **got},
                             "next_token": {**search, "interior": True, "todo": None, **close}}}
    lines = search_lines(results)
    row = {obj: next(l for l in lines if l.startswith(f"| {obj} |")) for obj in results["lr_search"]}
    assert row["good_views"].endswith("| 3.00e-03 | yes | +0.009 (resolved: noise < 0.006) |")
    assert row["next_token"].endswith(
        "| 3.00e-03 | yes | +0.005 (not resolved: noise up to 0.006) |")
    assert [l for l in lines if l.startswith("Not resolved")] == [next(
        l for l in lines if l.startswith("Not resolved: next_token. Each lr is scored on one"))]
