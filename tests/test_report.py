"""Tests of report.py and figures.py: the noise rule and the table writer on hand-made numbers
(exact), compare's lines, the lr search's pick, the scaling trend, and the report of one tiny
grid trained here for the whole module (2 objectives x seeds 0, 1 + a two-point lr search,
D = 16, 2 steps, on a 150-scene synthetic world), text-only and with the world's images."""
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from minialign import train
from minialign.machinery import figures, grid, images, report, runs, synthetic
from minialign.model import ModelConfig

KEYS = ["mutual_knn", "R@1", "R@5", "R@10", "paraphrase_R@1"]
PROTOCOL = {"base": {"captions": "world/captions_synthetic.json", "steps": 500, "lr": 0.00316,
                     "model": {"d_model": 64, "layers": "fast", "dtype": "float32"}},
            "objectives": ["good_views", "bad_views", "next_token"], "seeds": [0, 1, 2],
            "lr_min": 0.001}


def table(rows, ceiling=0.38, untrained=None, **protocol):
    """A hand-made results table: rows {objective: {metric: per-seed values}}, seeds 0..n-1."""
    def row(values):
        return {"seeds": list(range(len(values["R@1"]))), **values}
    base = {**PROTOCOL["base"], **protocol.pop("base", {})}
    return {"protocol": {**PROTOCOL, **protocol, "base": base}, "captions_sha256": "c0ffee",
            "metrics": KEYS, "chance": {k: 0.025 for k in KEYS}, "ceiling": ceiling, "world": "v2",
            "objectives": {obj: row(v) for obj, v in rows.items()},
            "untrained": {a: {"objectives": ["good_views"], **row(v)}
                          for a, v in (untrained or {"bidirectional": same(0.04)}).items()}}


def same(value, n=3, **over):
    return {**{k: [value] * n for k in KEYS}, **over}


REPO = {"good_views": same(0.1, mutual_knn=[0.070, 0.066, 0.074]), "bad_views": same(0.03),
        "next_token": same(0.02)}


def compare(tmp_path, capsys, mine, ref):
    """(compare's verdict, its printed lines) of two hand-made tables."""
    for name, t in (("mine.json", mine), ("ref.json", ref)):
        (tmp_path / name).write_text(json.dumps(t))
    ok = report.compare(tmp_path / "mine.json", tmp_path / "ref.json")
    return ok, capsys.readouterr().out.splitlines()


def line_of(lines, row, metric):
    return next(l for l in lines if l.startswith(row) and f" {metric} " in l)


def test_the_noise_rule_is_two_standard_errors_of_the_pooled_spread():
    # x: one seed at 0.5; y: 0.1, 0.2, 0.3 (sample std 0.1): s^2 = (0 + 2 * 0.01) / 2
    diff, allowed, s = report.agreement([0.5], [0.1, 0.2, 0.3])
    assert (diff, s, allowed) == pytest.approx((0.3, 0.1, 2 * 0.1 * math.sqrt(1 + 1 / 3)))
    # unequal stds (0.01 and 0.02, n = m = 3): s^2 = (2 * 1e-4 + 2 * 4e-4) / 4; not the mean std
    diff, allowed, s = report.agreement([0.1, 0.11, 0.12], [0.1, 0.12, 0.14])
    assert (diff, s) == pytest.approx((0.01, math.sqrt(2.5e-4)))
    assert allowed == pytest.approx(2 * math.sqrt(2.5e-4) * math.sqrt(2 / 3))
    # no spread, or one seed a side: the floor alone
    assert report.agreement([0.5] * 3, [0.5] * 3) == (0.0, report.FLOOR, 0.0)
    assert report.agreement([0.5], [0.5]) == (0.0, report.FLOOR, 0.0)
    assert report.allowed(0.004, 1, 1) == pytest.approx(2 * 0.004 * math.sqrt(2))


def test_the_table_writer_and_its_cells():
    assert report.md_table(["row", "a", "b"], [["x", "1", "2"]], "lrl") == [
        "| row | a | b |", "|---|---:|---|", "| x | 1 | 2 |"]
    assert report.cells([0.070, 0.066, 0.074]) == ("0.070 ± 0.004", "0.070, 0.066, 0.074")
    assert report.cells([0.25]) == ("0.250 (1 seed)", "0.250")
    assert report.cells(0.0) == ("0.000", "") and report.cells(None) == ("-", "")
    assert report.cells([]) == ("-", "") and report.cells("diverged") == ("diverged", "")
    assert report.cells([-0.0004, 0.0002], sign=True)[0] == "+0.000 ± 0.000"   # never -0.000


def test_a_table_that_agrees_and_one_that_differs(tmp_path, capsys):
    mine = {**REPO, "good_views": same(0.1, mutual_knn=[0.075, 0.071, 0.079])}
    ok, lines = compare(tmp_path, capsys, table(mine), table(REPO))
    assert ok and "agree: |mean difference| <= max(2 x spread x sqrt(1/n + 1/m), 0.002)" in lines[0]
    assert len(lines) == 1 + 4 * 5 + 1 + 1 and lines[-1] == "all 21 agree"
    # 0.005 <= 2 * 0.004 * sqrt(2/3) = 0.0065; the same seed: 0.075 - 0.070
    assert line_of(lines, "good_views", "mutual-kNN@10").endswith(
        "agree: 0.0750 vs 0.0700 (allowed 0.0065; spread 0.0040, the difference 1.25 of it; "
        "seeds 3 and 3; same seed up to 0.0050)")
    assert line_of(lines, "world ceiling", "mutual-kNN@10").endswith(
        "agree: 0.3800 vs 0.3800 (allowed 0.0020; spread 0.0000; seeds 1 and 1)")
    mine = {**REPO, "good_views": same(0.1, mutual_knn=[0.080, 0.076, 0.084]),
            "bad_views": {**same(0.03), "R@1": [0.0322] * 3}}        # 0.0022 > the floor
    ok, lines = compare(tmp_path, capsys, table(mine), table(REPO))
    assert not ok and lines[-1] == "2 of 21 do not agree"
    assert line_of(lines, "good_views", "mutual-kNN@10").endswith(
        "differs by 0.0100: 0.0800 vs 0.0700 (allowed 0.0065; spread 0.0040, the difference "
        "2.50 of it; seeds 3 and 3; same seed up to 0.0100)")
    assert "differs by 0.0022: 0.0322 vs 0.0300 (allowed 0.0020; spread 0.0000;" in \
        line_of(lines, "bad_views", "R@1")


def test_missing_rows_and_the_ceiling_are_lines_of_their_own(tmp_path, capsys):
    mine = table({k: v for k, v in REPO.items() if k != "next_token"}, ceiling=0.383)
    mine["untrained"] = {}
    ok, lines = compare(tmp_path, capsys, mine, table(REPO))
    assert not ok and lines[-1] == "3 of 13 do not agree"
    assert [l for l in lines[1:] if " missing in " in l] == [
        f"next_token{' ' * 24}{' ' * 16}missing in {tmp_path / 'mine.json'}",
        f"untrained encoder, bidirectional  {' ' * 14}  missing in {tmp_path / 'mine.json'}"]
    assert "differs by 0.0030: 0.3830 vs 0.3800" in line_of(lines, "world ceiling", "mutual-kNN@10")


def test_fewer_seeds_and_the_same_seed_by_its_number(tmp_path, capsys):
    mine = {obj: {k: v[:1] for k, v in values.items()} for obj, values in REPO.items()}
    mine["good_views"]["mutual_knn"] = [0.071]
    ok, lines = compare(tmp_path, capsys, table(mine), table(REPO))
    # x = [0.071], y = 0.070, 0.066, 0.074: s = 0.004, allowed 2 * 0.004 * sqrt(1 + 1/3)
    assert ok and line_of(lines, "good_views", "mutual-kNN@10").endswith(
        "agree: 0.0710 vs 0.0700 (allowed 0.0092; spread 0.0040, the difference 0.25 of it; "
        "seeds 1 and 3; same seed up to 0.0010)")
    shuffled = table(REPO)
    shuffled["objectives"]["good_views"].update(seeds=[2, 0, 1], mutual_knn=[0.074, 0.070, 0.066])
    ok, lines = compare(tmp_path, capsys, shuffled, table(REPO))
    assert "same seed up to 0.0000)" in line_of(lines, "good_views", "mutual-kNN@10")


@pytest.mark.parametrize("change, said", [
    ({"base": {"steps": 100}}, "steps (100 in MINE, 500 in REF)"),
    ({"seeds": [0]}, "seeds ([0] in MINE, [0, 1, 2] in REF)"),
    ({"base": {"model": {"d_model": 32, "layers": "fast"}}},
     "model.d_model (32 in MINE, 64 in REF)"),
])
def test_another_protocol_is_refused_in_one_line(tmp_path, capsys, change, said):
    with pytest.raises(ValueError) as err:
        compare(tmp_path, capsys, table(REPO, **change), table(REPO))
    mine, ref = tmp_path / "mine.json", tmp_path / "ref.json"
    assert str(err.value) == (f"{mine}: made under another protocol than {ref}: "
                              f"{said.replace('MINE', str(mine)).replace('REF', str(ref))}; "
                              f"compare tables made with the same settings")
    assert capsys.readouterr().out == ""


def test_layers_dtype_and_the_captions_spelling_may_differ_not_the_captions(tmp_path, capsys):
    other = {"captions": "elsewhere/c.json", "model": {"d_model": 64, "layers": "reference",
                                                       "dtype": "float64"}}
    mine = table(REPO, base=other, lr_per_decade=2)           # a setting the other lacks
    ok, lines = compare(tmp_path, capsys, mine, table(REPO))
    assert ok and lines[0].startswith(f"{tmp_path / 'mine.json'} (--layers reference, --dtype "
                                      f"float64) against {tmp_path / 'ref.json'} (--layers "
                                      f"fast, --dtype float32)")
    with pytest.raises(ValueError, match="the captions file .another sha256"):
        compare(tmp_path, capsys, {**mine, "captions_sha256": "bad"}, table(REPO))


def test_the_demo_table_reads_and_agrees_with_itself(capsys):
    assert report.compare(report.DEMO)                        # --against: the demo's own
    lines = capsys.readouterr().out.splitlines()[1:-1]
    assert len(lines) == 5 * 5 + 1 and all(" agree: " in l for l in lines)
    assert all(l.endswith("same seed up to 0.0000)") for l in lines[:-1])


def test_a_file_that_is_no_table_and_a_directory_without_protocol(tmp_path):
    (tmp_path / "x.json").write_text('{"base": {}}')
    with pytest.raises(ValueError, match=f"^{tmp_path / 'x.json'}: not a results table"):
        report.load_results(tmp_path / "x.json")
    with pytest.raises(FileNotFoundError, match="results.json: no such file"):
        report.load_results(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'protocol.json'}: no such file"):
        report.write_report(tmp_path)


def test_the_published_column_only_beside_dinov2_scores():
    results = {**table({"good_views": {k: [0.3, 0.34] for k in KEYS}}, ceiling=None),
               "published": report.PUBLISHED, "lr_search": {"good_views": {
                   "chosen": 1e-3, "test": {"mutual_knn": 0.33, "R@1": 0.09}}}}
    md = report.main_table(results)
    assert md[0] == ("| row | mutual-kNN@10 | per seed | published | R@1, caption → image | "
                     "per seed | published | paraphrase R@1 |")
    assert md[4] == ("| good_views | 0.320 ± 0.028 | 0.300, 0.340 | 0.320 | 0.320 ± 0.028 | "
                     "0.300, 0.340 | 0.084 | 0.320 ± 0.028 |")
    assert md[5] == ("| good_views, lr search (1.00e-03, seed 0) | 0.330 |  | 0.328 | 0.090 |  |  "
                     "| - |")
    assert "published" not in report.main_table({**results, "published": {}})[0]


def curve(*values):
    return {"step": [0, 50, 100], "mutual_knn": list(values)}


def demo_like(curves):
    """The demo's shape by hand: next_token ends above bad_views by mutual-kNN (the published
    order reversed), bad_views below its untrained encoder; curves {objective: [(v0, v1, v2)]}."""
    t = table({**REPO, "bad_views": same(0.03, mutual_knn=[0.027, 0.028, 0.026]),
               "next_token": {**same(0.02, mutual_knn=[0.030, 0.031, 0.029]),
                              "paraphrase_R@1": [0.031] * 3}},
              untrained={"bidirectional": same(0.04, objectives=["good_views", "bad_views"]),
                         "causal": same(0.021, mutual_knn=[0.035] * 3, objectives=["next_token"])})
    t.update(metric="mutual_knn", embeddings={"path": "e.npz", "model": "DINOv2"})
    for o, cs in curves.items():
        t["objectives"][o]["curves"] = [curve(*c) for c in cs]
    t["speed"] = report.speed(t)
    return t


CURVES = {"good_views": [(0.04, 0.05, 0.07), (0.04, 0.06, 0.07)],       # reach 0.055 at 100, 50
          "bad_views": [(0.04, 0.03, 0.028)] * 2,                       # falls: never
          "next_token": [(0.035, 0.05, 0.056), (0.035, 0.04, 0.045)]}   # one seed of two


def test_the_finding_states_the_order_and_the_untrained_encoder_computed():
    lines = report.finding(demo_like(CURVES), "../docs/results.md")
    assert lines[2] == ("Test split; ≈: within noise by the noise rule; published: COCO with "
                        "DINOv2 (paraphrase R@1, never published: beside mutual-kNN@10's "
                        "order).")
    pub = "published good_views 0.320 > bad_views 0.192 > next_token 0.148"
    # next_token 0.030 against bad_views 0.027: 0.003 > max(2 x 0.001 x sqrt(2/3), 0.002)
    assert lines[4:7] == [
        f"- mutual-kNN@10: good_views 0.070 > next_token 0.030 > bad_views 0.027; {pub}. "
        "**Not the published order**: next_token above bad_views.",
        "- R@1: good_views 0.100 > bad_views 0.030 > next_token 0.020; published good_views "
        "0.084 > bad_views 0.063 > next_token 0.057.",             # the published order: no more
        # 0.031 against 0.030 is within the floor: ≈, so no order is claimed against the paper
        f"- paraphrase R@1: good_views 0.100 > next_token 0.031 ≈ bad_views 0.030; {pub}."]
    assert lines[10:15] == [
        "| objective | mutual-kNN@10 | R@1 | paraphrase R@1 | steps to val mutual-kNN@10 0.055 |",
        "|---|---|---|---|---|",
        "| good_views | above (+0.030) | above (+0.060) | above (+0.060) | 75 ± 35 |",
        "| bad_views | below (-0.013) | below (-0.010) | below (-0.010) | never |",
        "| next_token | below (-0.005) | within noise (-0.001) | above (+0.010) | 100 (1 of 2 "
        "seeds) |"]
    assert lines[16].startswith("Steps: the first evaluation at which a seed's val mutual-kNN@10 "
                                "reaches 0.055, halfway from the curves' highest start (0.040, "
                                "step 0: untrained) to the best final seed mean (0.070)")
    assert lines[16].endswith("[docs/results.md](../docs/results.md#where-the-results-part-from-"
                              "the-claim).")
    sp = demo_like(CURVES)["speed"]
    assert (sp["start"], sp["best"], sp["level"]) == pytest.approx((0.04, 0.07, 0.055))
    assert sp["steps"] == {"good_views": [100, 50], "bad_views": [None, None],
                           "next_token": [100, None]}
    assert report.steps([100, 50]) == "75 ± 35" and report.steps([None]) == "never"
    # every curve falls: no level, every objective never, and the finding says none aligns
    falling = demo_like({o: [(0.04, 0.03, 0.02)] for o in CURVES})
    assert falling["speed"]["level"] is None
    assert falling["speed"]["steps"] == {o: [None] for o in CURVES}
    lines = report.finding(falling, "x")
    assert lines[10:12] == ["| objective | mutual-kNN@10 | R@1 | paraphrase R@1 |",
                            "|---|---|---|---|"]
    assert lines[16].startswith("No val mutual-kNN@10 ends above the curves' highest start "
                                "(0.040, step 0: untrained): none aligns, faster or slower.")


def test_one_seed_states_the_difference_and_makes_no_call_on_noise():
    assert report.versus([0.0405], [0.04]) == ("above", pytest.approx(0.0005))   # < the floor
    assert report.versus([0.03], [0.04])[0] == "below"
    assert report.versus([0.0405] * 2, [0.04] * 2)[0] == "within noise"
    one = demo_like(CURVES)
    for row in [*one["objectives"].values(), *one["untrained"].values()]:
        row.update({k: row[k][:1] for k in KEYS}, seeds=[0])
    lines = report.finding(one, "x")
    assert "(one seed: no spread, so a difference is stated, never judged against noise)" in \
        lines[2]
    assert lines[4].startswith("- mutual-kNN@10: good_views 0.070 > next_token 0.030 > bad_views")
    assert lines[14].startswith("| next_token | below (-0.005) | below (-0.001) | above (+0.010) |")


def test_figures_show_the_bars_and_no_empty_lr_search(tmp_path):
    results = {**demo_like(CURVES), "dataset": "hand", "lr_search": {}, "world": None,
               "ceiling": None, "published": report.PUBLISHED}
    assert figures.draw(results, tmp_path) == ["fig_alignment.png", "fig_curves.png"]
    assert not (tmp_path / "fig_lr_search.png").exists()
    # published (0.148 .. 0.320) is over 1.5 times the tallest seed (0.074): written at the top; the
    # axis spans the bars: good_views' bar reaches the upper half of the panel (y 150 .. 760)
    pixels = np.array(Image.open(tmp_path / "fig_alignment.png"))[:, :800]
    rows = np.nonzero((pixels == figures.COLOURS["good_views"]).all(-1).any(1))[0]
    assert rows.min() < (150 + 760) / 2 and rows.max() == pytest.approx(760, abs=3)


def test_a_pick_is_resolved_by_the_noise_rule():
    """margin = the pick's val score - the best other finite one; noise = 2 sqrt(2) x the
    sample std of the seed grid's val scores (0.030, 0.032, 0.034: 0.002), at least FLOOR."""
    protocol = grid.Protocol(base=train.TrainConfig(lr=3.16e-3), objectives=("good_views",),
                             lr_min=1e-3, lr_max=1e-2, lr_per_decade=2, max_extensions=0)

    def fake(scores):
        vals = {**dict(zip((1e-3, 3.16e-3, 1e-2), scores))}
        return lambda obj, seed, lr=None: (
            {"status": "diverged"} if vals.get(lr) == -math.inf else
            {"status": "finished", "val": vals[lr], "test": {"R@1": lr}} if lr else
            {"status": "finished", "val": 0.030 + 0.002 * seed})
    picked = report.search(protocol, "good_views", fake([0.041, 0.050, -math.inf]))
    assert picked["chosen"] == 3.16e-3 and picked["scores"] == [0.041, 0.050, "diverged"]
    assert picked["margin"] == pytest.approx(0.009) and picked["test"] == {"R@1": 3.16e-3}
    assert picked["noise"] == pytest.approx(2 * math.sqrt(2) * 0.002)
    close = report.search(protocol, "good_views", fake([0.045, 0.050, 0.030]))
    results = {"protocol": json.loads(json.dumps(grid.protocol_json(protocol))),
               "metric": "mutual_knn", "lr_search": {"good_views": picked, "next_token": close}}
    rows = [l for l in report.search_lines(results) if l.startswith("| good_views")
            or l.startswith("| next_token")]
    assert rows == [
        "| good_views | 1.00e-03: 0.041, **3.16e-03: 0.050**, 1.00e-02: diverged | 3.16e-03 | yes "
        "| +0.009 (resolved: noise < 0.006) |",
        "| next_token | 1.00e-03: 0.045, **3.16e-03: 0.050**, 1.00e-02: 0.030 | 3.16e-03 | yes "
        "| +0.005 (not resolved: noise up to 0.006) |"]


def test_the_gap_trend_by_hand():
    # gaps 0.01, 0.03, 0.05 at 1e4, 1e5, 1e6 parameters: slope 0.02 per decade, no residual
    t = report.gap_trend([(1e4, 0.01), (1e5, 0.03), (1e6, 0.05)])
    assert t["slope"] == pytest.approx(0.02) and t["se"] == pytest.approx(0, abs=1e-12)
    assert t["verdict"] == "grows"
    # residuals +-0.01: se = sqrt(RSS / (n - 2) / Sxx) = sqrt(4e-4 / 2 / 2): not resolved
    t = report.gap_trend([(1e4, 0.0), (1e4, 0.02), (1e6, 0.05), (1e6, 0.03)])
    assert (t["slope"], t["se"]) == pytest.approx((0.015, math.sqrt(4e-4 / 2 / 4)))
    assert t["verdict"] == "grows" and report.gap_trend([(1e4, 0.1)])["slope"] is None
    assert report.gap_trend([(1e4, 0.1), (1e5, -0.1), (1e6, 0.1)])["verdict"] == \
        "not resolved at these sizes"


def test_the_scaling_report_and_figure(tmp_path):
    def size(d, params, gaps):
        return {"d_model": d, "n_layers": 2, "params": params, "gap": {"seeds": [0, 1],
                                                                      "values": gaps},
                "objectives": {"good_views": {"seeds": [0, 1], "paraphrase_R@1": [0.2, 0.3]},
                               "next_token": {"seeds": [0, 1], "paraphrase_R@1": [0.1, 0.1]}},
                "untrained": {"bidirectional": {"paraphrase_R@1": [0.05, 0.07]}}}
    sizes = [size(64, 41_200, [0.1, 0.2]), size(128, 4_660_000, [0.2, 0.3])]
    results = {"dataset": "sweep", "metric": "paraphrase_R@1", "world": None, "embeddings": None,
               "chance": {"paraphrase_R@1": 0.01}, "sizes": sizes, "trend": report.gap_trend(
                   [(s["params"], g) for s in sizes for g in s["gap"]["values"]]),
               "protocol": {**PROTOCOL, "objectives": ["good_views", "next_token"],
                            "base": {**PROTOCOL["base"], "batch_photos": 64,
                                     "model": {**PROTOCOL["base"]["model"], "n_layers": 2}}}}
    md = report.format_scaling(results)
    assert "| 64 | 2 | 41.2k | 0.250 ± 0.071 | 0.100 ± 0.000 | 0.060 ± 0.014 | - | +0.150 ± " \
           "0.071 |" in md and "| 128 | 2 | 4.66M |" in md
    assert "gap in test paraphrase R@1 not resolved at these sizes" in md
    assert figures.draw(results, tmp_path) == ["fig_scaling.png"]
    assert Image.open(tmp_path / "fig_scaling.png").size == figures.SIZE
    # the axis' ticks reach past the largest value
    assert figures.ticks(0, 0.68) == [0, 0.2, 0.4, 0.6, 0.8]
    assert figures.ticks(0, 0.4) == [0, 0.1, 0.2, 0.3, 0.4]
    assert figures.ticks(0.02, 0.031) == [0.02, 0.0225, 0.025, 0.0275, 0.03, 0.0325]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    captions, embeddings = synthetic.write_world(root / "world", n_scenes=150, seed=0)
    base = train.TrainConfig(captions=str(captions), steps=2, batch_photos=16, eval_every=2,
                             warmup_steps=1, lr=1e-3,
                             model=ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=64))
    protocol = grid.Protocol(base=base, objectives=("good_views", "next_token"), seeds=(0, 1),
                             lr_min=1e-3, lr_max=1e-2, lr_per_decade=1, max_extensions=0)
    runs.write_json(root / "grid" / "protocol.json", grid.protocol_json(protocol))
    for name, cfg in grid.planned(protocol).items():
        train.train(cfg, root / "grid" / "runs" / name, progress=False)
    return {"out": root / "grid", "embeddings": embeddings}


def copy(out, tmp_path, name="grid"):
    return Path(shutil.copytree(out, tmp_path / name))


def body(md):
    lines = md.splitlines()
    first = next(i for i, l in enumerate(lines) if l.startswith("| row |")) + 2
    return lines[first:lines.index("", first)]


def test_a_text_only_report(tiny, tmp_path, capsys):
    out = copy(tiny["out"], tmp_path)
    returned = report.write_report(out)
    md, results = (out / "results.md").read_text(), runs.read_json(out / "results.json")
    assert json.loads(json.dumps(returned)) == results
    printed = capsys.readouterr().out
    assert "| good_views |" in printed and printed.endswith(
        f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'fig_alignment.png'}, "
        f"{out / 'fig_curves.png'}, {out / 'fig_lr_search.png'}, {out / 'fig_diagnose.png'}\n")
    run = out / "runs" / "good_views-lr1.00e-03-seed1"
    assert results["objectives"]["good_views"]["paraphrase_R@1"][1] == \
        images.score_run(run)["test"]["paraphrase_R@1"]
    u = [images.score_run(out / "runs" / f"next_token-lr1.00e-03-seed{s}", step=0)["test"]
         ["paraphrase_R@1"] for s in (0, 1)]
    chance = results["chance"]["paraphrase_R@1"]
    g = results["objectives"]["good_views"]["paraphrase_R@1"]
    bi = report.cells(results["untrained"]["bidirectional"]["paraphrase_R@1"])
    assert body(md)[:4] == [
        f"| chance | {chance:.3f} |  |",
        f"| untrained encoder, bidirectional (good_views) | {bi[0]} | {bi[1]} |",
        f"| untrained encoder, causal (next_token) | {np.mean(u):.3f} ± {np.std(u, ddof=1):.3f} "
        f"| {u[0]:.3f}, {u[1]:.3f} |",
        f"| good_views | {np.mean(g):.3f} ± {np.std(g, ddof=1):.3f} | {g[0]:.3f}, {g[1]:.3f} |"]
    assert body(md)[5].startswith("| good_views, lr search (1.00e-0")
    assert "text only (`report --embeddings FILE` adds the image columns)" in md
    assert "on final val paraphrase R@1" in md
    for name in ("fig_alignment.png", "fig_curves.png", "fig_lr_search.png", "fig_diagnose.png"):
        assert f"({name})" in md
        img = Image.open(out / name)
        assert img.size == figures.SIZE and len(img.getcolors(1 << 16)) > 20, name


def test_a_report_with_the_worlds_images(tiny, tmp_path):
    report.write_report(out := copy(tiny["out"], tmp_path / "a"), tiny["embeddings"])
    md, results = (out / "results.md").read_text(), runs.read_json(out / "results.json")
    emb = images.load_embeddings(tiny["embeddings"])
    run = out / "runs" / "next_token-lr1.00e-03-seed0"
    test, step0 = images.score_run(run, emb)["test"], images.score_run(run, emb, 0)["test"]
    assert results["objectives"]["next_token"]["R@1"][0] == test["R@1"]
    assert results["untrained"]["causal"]["mutual_knn"][0] == step0["mutual_knn"]
    assert results["ceiling"] == synthetic.world_ceiling_of_files(
        results["protocol"]["base"]["captions"], tiny["embeddings"])
    rows = body(md)
    assert rows[0] == (f"| chance | {test['chance']['mutual_knn']:.3f} |  | "
                       f"{test['chance']['R@1']:.3f} |  | {test['chance']['paraphrase_R@1']:.3f} |")
    assert rows[3] == f"| world v2 ceiling (scene factors vs images) | {results['ceiling']:.3f} " \
                      f"|  | - |  | - |"
    assert [r.split(" |")[0] for r in rows[4:6]] == ["| good_views", "| next_token"]
    assert "published" not in md.splitlines()[4] and "\n## The finding against the claim\n" in md
    assert "\n## What the encoders learned\n" in md
    link = md.split("[docs/results.md](")[1].split("#")[0]      # relative to the directory
    assert (out / link).resolve() == Path(report.__file__).parents[2] / "docs" / "results.md"
    again = copy(out, tmp_path / "b")
    report.write_report(again, tiny["embeddings"])          # the same runs: the same bytes
    assert {p.name: p.read_bytes() for p in again.iterdir() if p.is_file()} == \
        {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
