"""Tests of agreement.py (`python -m minialign compare`): the rule "within the seeds' spread" on
hand-made summaries with hand-computed thresholds, the one-line refusals, the docs' table, and a
summary exported from a tiny real grid that agrees with its own directory.

The docs' demo table and the committed summary are checked in test_demo_table.py."""
import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

from minialign.machinery.cli import main
from minialign.machinery.experiment import agreement
from minialign.machinery.experiment.protocol import Protocol
from minialign.machinery.grid import replicate
from minialign.machinery.images import synthetic
from minialign.machinery.images.embeddings import load_embeddings
from minialign.machinery.run.files import read_json
from minialign.model import DEFAULT_LAYERS, ModelConfig
from minialign.train import TrainConfig

KEYS = ["mutual_knn", "R@1", "R@5", "R@10", "paraphrase_R@1"]


def protocol(**changes):
    base = TrainConfig(captions="world/captions_synthetic.json", steps=500, lr=3.16e-3,
                       model=ModelConfig(d_model=64, n_layers=1, n_heads=4))
    base = dataclasses.replace(base, **changes.pop("base", {}))
    return json.loads(json.dumps(dataclasses.asdict(Protocol(base=base, **changes))))


def summary(rows, untrained=None, ceiling=0.38, **protocol_changes):
    """A hand-made summary: rows {objective: {metric: per-seed values}}, seeds 0..n-1."""
    def row(values):
        n = len(next(iter(values.values())))
        return {"seeds": list(range(n)), **values}
    untrained = untrained or {"bidirectional": {k: [0.04, 0.04, 0.04] for k in KEYS}}
    return {"summary": agreement.KIND, "source": "hand-made", "commit": "abc1234",
            "protocol": protocol(**protocol_changes), "captions_sha256": "c0ffee",
            "world": "v2", "metrics": KEYS,
            "chance": {"mutual_knn": 0.025, "R@1": 0.0025, "R@5": 0.0125, "R@10": 0.025,
                       "paraphrase_R@1": 0.0025},
            "ceiling": ceiling, "objectives": {obj: row(v) for obj, v in rows.items()},
            "untrained": {kind: {"objectives": ["good_views", "bad_views"], **row(v)}
                          for kind, v in untrained.items()}}


def same(value, n=3):
    return {k: [value] * n for k in KEYS}


REPO = {"good_views": {**same(0.1), "mutual_knn": [0.070, 0.066, 0.074]},
        "bad_views": same(0.03), "next_token": same(0.02)}


def write(tmp_path, name, s):
    path = tmp_path / name
    path.write_text(json.dumps(s))
    return str(path)


def compare(tmp_path, mine, repo, capsys):
    """(exit code, stdout lines, stderr) of `compare MINE --against REPO`."""
    code = main(["compare", write(tmp_path, "mine.json", mine), "--against",
                 write(tmp_path, "repo.json", repo)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def line_of(lines, row, metric):
    return next(l for l in lines if l.startswith(row) and f" {metric} " in l)


# ---------------------------------------------------------------- the rule, by hand
def test_the_threshold_is_two_standard_errors_of_the_pooled_spread():
    # x: mean 0.5, one seed; y: 0.1, 0.2, 0.3, sample std 0.1. Pooled: (0 + 2 * 0.01) / 2
    diff, allowed, s = agreement.agreement([0.5], [0.1, 0.2, 0.3])
    assert s == pytest.approx(0.1) and diff == pytest.approx(0.3)
    assert allowed == pytest.approx(2 * 0.1 * math.sqrt(1 + 1 / 3))      # 0.2309
    # equal stds 0.004 (n = m = 3): s = 0.004, allowed 2 * 0.004 * sqrt(2/3) = 0.006532
    diff, allowed, s = agreement.agreement([0.080, 0.076, 0.084], [0.070, 0.066, 0.074])
    assert (diff, s, allowed) == pytest.approx((0.010, 0.004, 0.008 * math.sqrt(2 / 3)))
    # different stds: ((2 * 0.0001) + (2 * 0.0004)) / 4 = 0.00025 -> s = 0.015811
    diff, allowed, s = agreement.agreement([0.1, 0.11, 0.12], [0.1, 0.12, 0.14])
    assert s == pytest.approx(math.sqrt(0.00025)) and diff == pytest.approx(0.01)
    assert allowed == pytest.approx(2 * math.sqrt(0.00025) * math.sqrt(2 / 3))


def test_no_spread_allows_the_floor_only():
    assert agreement.agreement([0.5] * 3, [0.5] * 3) == (0.0, agreement.FLOOR, 0.0)
    assert agreement.agreement([0.5], [0.5]) == (0.0, agreement.FLOOR, 0.0)   # n + m = 2
    diff, allowed, s = agreement.agreement([0.5025] * 3, [0.5] * 3)
    assert s == pytest.approx(0.0, abs=1e-15) and diff == pytest.approx(0.0025)
    assert diff > allowed == agreement.FLOOR


def test_a_difference_equal_to_the_allowed_one_agrees(tmp_path, capsys):
    # 0.0035 - 0.0015 is exactly the float 0.002, and so is the difference of their means
    mine = {**REPO, "bad_views": {**same(0.03), "R@1": [0.0035] * 3}}
    repo = {**REPO, "bad_views": {**same(0.03), "R@1": [0.0015] * 3}}
    code, lines, _ = compare(tmp_path, summary(mine), summary(repo), capsys)
    assert code == 0 and line_of(lines, "bad_views", "R@1").endswith(
        "agree: 0.0035 vs 0.0015 (allowed 0.0020; spread 0.0000; seeds 3 and 3; same seed up "
        "to 0.0020)")


# ---------------------------------------------------------------- the command
def test_a_table_that_agrees_exits_0(tmp_path, capsys):
    mine = {**REPO, "good_views": {**same(0.1), "mutual_knn": [0.075, 0.071, 0.079]}}
    code, lines, err = compare(tmp_path, summary(mine), summary(REPO), capsys)
    assert code == 0 and err == ""
    assert "agree: |mean difference| <= max(2 x spread x sqrt(1/n + 1/m), 0.002)" in lines[0]
    body = lines[1:-1]                       # 3 objectives + 1 untrained row, 5 metrics; ceiling
    assert len(body) == 4 * 5 + 1 and all("  agree: " in l for l in body)
    assert lines[-1] == "all 21 agree"
    # diff 0.005 <= 0.00653: agrees, and says by how much it could have differed
    assert line_of(lines, "good_views", "mutual-kNN@10").endswith(
        "agree: 0.0750 vs 0.0700 (allowed 0.0065; spread 0.0040, the difference 1.25 of it; "
        "seeds 3 and 3; same seed up "
        "to 0.0050)")


def test_one_metric_off_is_named_and_exits_1(tmp_path, capsys):
    mine = {**REPO, "good_views": {**same(0.1), "mutual_knn": [0.080, 0.076, 0.084]}}
    code, lines, err = compare(tmp_path, summary(mine), summary(REPO), capsys)
    assert code == 1 and err == ""
    assert line_of(lines, "good_views", "mutual-kNN@10").endswith(
        "differs by 0.0100: 0.0800 vs 0.0700 (allowed 0.0065; spread 0.0040, the difference "
        "2.50 of it; seeds 3 and 3; same seed up to 0.0100)")
    assert sum("differs by" in l for l in lines) == 1 and lines[-1] == "1 of 21 do not agree"


def test_a_missing_objective_and_a_wrong_ceiling_are_lines_of_their_own(tmp_path, capsys):
    mine = {k: v for k, v in REPO.items() if k != "next_token"}
    code, lines, _ = compare(tmp_path, summary(mine, ceiling=0.383), summary(REPO), capsys)
    assert code == 1
    missing = [l for l in lines[1:] if "missing" in l]
    assert missing == [f"next_token{' ' * 22}  missing in {tmp_path / 'mine.json'} "
                       f"(no finished run)"]
    assert line_of(lines, "world ceiling", "mutual-kNN@10").endswith(
        "differs by 0.0030: 0.3830 vs 0.3800 (allowed 0.0020; one number, no seeds)")
    assert lines[-1] == "2 of 17 do not agree"


def test_fewer_seeds_compare_by_the_same_rule(tmp_path, capsys):
    mine = {obj: {k: v[:1] for k, v in values.items()} for obj, values in REPO.items()}
    mine["good_views"]["mutual_knn"] = [0.071]
    code, lines, _ = compare(tmp_path, summary(mine), summary(REPO), capsys)
    assert code == 0
    # x = [0.071], y = 0.070, 0.066, 0.074: s = sqrt(2 * 0.004^2 / 2) = 0.004,
    # allowed 2 * 0.004 * sqrt(1 + 1/3) = 0.0092; seed 0 is in both: 0.071 - 0.070
    assert line_of(lines, "good_views", "mutual-kNN@10").endswith(
        "agree: 0.0710 vs 0.0700 (allowed 0.0092; spread 0.0040, the difference 0.25 of it; "
        "seeds 1 and 3; same seed up "
        "to 0.0010)")


def test_the_same_seed_pairs_by_seed_number_and_says_nothing_without_one():
    got = {"seeds": [2, 0], "m": [0.5, 0.25]}
    assert agreement.same_seed(got, {"seeds": [0, 1, 2], "m": [0.125, 0.0, 0.5]}, "m") == \
        "; same seed up to 0.1250"                      # seed 0: 0.25 - 0.125; seed 2: 0
    assert agreement.same_seed(got, {"seeds": [1], "m": [0.5]}, "m") == ""


@pytest.mark.parametrize("changes, said", [
    ({"base": {"steps": 100}}, "steps (100 in MINE, 500 in REPO)"),
    ({"seeds": (0,)}, "seeds ([0] in MINE, [0, 1, 2] in REPO)"),
    ({"base": {"loss": dataclasses.replace(TrainConfig().loss, anticollapse="sigreg")}},
     "loss.anticollapse ('sigreg' in MINE, 'vicreg' in REPO)"),
    ({"lr_per_decade": 0, "lr_min": 1e-3, "seeds": (0,)},     # the seed grid's difference first
     "seeds ([0] in MINE, [0, 1, 2] in REPO); lr_min (0.001 in MINE, 0.0001 in REPO) (lr search "
     "only); lr_per_decade (0 in MINE, 2 in REPO) (lr search only)"),
])
def test_another_protocol_is_refused_in_one_line(tmp_path, capsys, changes, said):
    code, lines, err = compare(tmp_path, summary(REPO, **changes), summary(REPO), capsys)
    mine, repo = tmp_path / "mine.json", tmp_path / "repo.json"
    assert code == 2 and lines == []
    assert err == (f"minialign compare: error: {mine}: made under another protocol than {repo}: "
                   f"{said.replace('MINE', str(mine)).replace('REPO', str(repo))}; compare "
                   f"tables made with the same settings (`make demo`)\n")


def test_the_layer_set_dtype_and_captions_spelling_may_differ_not_the_world(tmp_path, capsys):
    layers = ModelConfig(d_model=64, n_layers=1, n_heads=4, layers="reference", dtype="float64")
    mine = summary(REPO, base={"model": layers, "captions": "elsewhere/captions.json"})
    code, lines, _ = compare(tmp_path, mine, summary(REPO), capsys)
    assert code == 0 and "(--layers reference, --dtype float64) against" in lines[0]
    assert "(--layers fast, --dtype float32, commit" in lines[0]
    code, _, err = compare(tmp_path, {**mine, "captions_sha256": "bad"}, summary(REPO), capsys)
    assert code == 2 and err.count("\n") == 1
    assert "the captions file (another sha256: another synthetic world?)" in err


def test_a_setting_added_since_a_summary_was_saved_reads_as_its_default(tmp_path, capsys):
    older = summary(REPO)                            # saved before --tokenizer existed
    del older["protocol"]["base"]["tokenizer"], older["protocol"]["base"]["vocab"]
    code, lines, err = compare(tmp_path, summary(REPO), older, capsys)
    assert code == 0 and err == "" and lines[-1].endswith("agree")
    code, _, err = compare(tmp_path, summary(REPO, base={"tokenizer": "wordpiece",
                                                          "vocab": "v.txt"}), older, capsys)
    assert code == 2 and "tokenizer ('wordpiece' in" in err and "'words' in" in err


@pytest.mark.parametrize("argv, said", [
    (["--write", "page.md"], "--write: only with --table"),
    (["--table", "--write", "page.md"], "page.md: no such file (--write: the page"),
    (["--export", "out.json"], "{mine}: --export needs a results directory"),
    (["--against", "nowhere.json"], "nowhere.json: no such file"),
    (["--against", "{tmp}/notes.md"], "{tmp}/notes.md: neither a results directory nor a "),
])
def test_bad_arguments_are_one_line(tmp_path, capsys, argv, said):
    mine = write(tmp_path, "mine.json", summary(REPO))
    (tmp_path / "notes.md").write_text("notes\n")
    assert main(["compare", mine, *(a.format(tmp=tmp_path) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minialign compare: error: " + said.format(mine=mine, tmp=tmp_path))
    assert err.count("\n") == 1


def test_a_json_that_is_no_summary_and_a_missing_directory(tmp_path, capsys):
    other = write(tmp_path, "other.json", {"base": {}})
    assert main(["compare", other]) == 2
    assert f"{other}: not a results summary" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "results")]) == 2
    assert "results: no such directory; make it first with" in capsys.readouterr().err
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "protocol.json").write_text('{"kind": "scaling"}')
    assert main(["compare", str(sweep)]) == 2
    assert f"{sweep}: a scaling sweep; `compare` reads replicate" in capsys.readouterr().err


# ---------------------------------------------------------------- the docs' table
TABLE = f"""\
D=64, 1 block, 500 steps of 256 photos, lr 0.00316 for the seed grid, `--layers {DEFAULT_LAYERS}`, \
commit `abc1234`; test split, mean ± sample std (ddof 1) over seeds 0, 1, 2 and each seed's value:

| row | mutual-kNN@10 | per seed | R@1, caption -> image | per seed | paraphrase R@1 |
|---|---:|---|---:|---|---:|
| chance | 0.025 | | 0.003 | | 0.003 |
| untrained encoder, bidirectional (good_views, bad_views) | 0.040 ± 0.000 | 0.040, 0.040, \
0.040 | 0.040 ± 0.000 | 0.040, 0.040, 0.040 | 0.040 ± 0.000 |
| world v2 ceiling (scene factors vs images) | 0.380 | | - | | - |
| good_views | 0.070 ± 0.004 | 0.070, 0.066, 0.074 | 0.100 ± 0.000 | 0.100, 0.100, 0.100 \
| 0.100 ± 0.000 |
| bad_views | 0.030 ± 0.000 | 0.030, 0.030, 0.030 | 0.030 ± 0.000 | 0.030, 0.030, 0.030 \
| 0.030 ± 0.000 |
| next_token | 0.020 ± 0.000 | 0.020, 0.020, 0.020 | 0.020 ± 0.000 | 0.020, 0.020, 0.020 \
| 0.020 ± 0.000 |
"""


def test_the_table_of_a_summary(tmp_path, capsys):
    assert agreement.format_table(summary(REPO)) == TABLE
    assert main(["compare", write(tmp_path, "s.json", summary(REPO)), "--table"]) == 0
    assert capsys.readouterr().out == TABLE


def test_the_table_goes_between_the_markers_and_nowhere_else(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\ntext\n{agreement.BEGIN}\nold table\n{agreement.END}\nafter\n")
    source = write(tmp_path, "s.json", summary(REPO))
    assert main(["compare", source, "--table", "--write", str(page)]) == 0
    assert page.read_text() == (f"# Title\n\ntext\n{agreement.BEGIN}\n{TABLE}\n{agreement.END}"
                                f"\nafter\n")
    assert agreement.table_in(page) == TABLE
    assert capsys.readouterr().out == TABLE + f"\nwrote the table into {page}\n"
    page.write_text("no markers\n")
    assert main(["compare", source, "--table", "--write", str(page)]) == 2
    assert f"{page}: needs the line" in capsys.readouterr().err
    assert page.read_text() == "no markers\n"


# ---------------------------------------------------------------- a real grid, exported
@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """Two objectives x seeds 0, 1, 4 steps of a D = 16 encoder on a 300-scene world, scored
    against its images."""
    root = tmp_path_factory.mktemp("agreement")
    captions, embeddings = synthetic.write_world(root / "world", n_scenes=300, seed=0)
    base = TrainConfig(captions=str(captions), steps=4, batch_photos=16, eval_every=2,
                       warmup_steps=1, model=ModelConfig(d_model=16, n_layers=1, n_heads=2))
    protocol = Protocol(base=base, objectives=("good_views", "next_token"), seeds=(0, 1),
                        lr_per_decade=0)
    replicate.replicate(protocol, root / "grid", load_embeddings(embeddings), progress=False)
    return root / "grid"


def test_export_keeps_each_runs_test_numbers_and_agrees_with_its_directory(grid, tmp_path,
                                                                          capsys):
    out = tmp_path / "summary.json"
    assert main(["compare", str(grid), "--export", str(tmp_path / "no" / "s.json")]) == 2
    assert f"s.json: no such directory {tmp_path / 'no'}" in capsys.readouterr().err
    assert main(["compare", str(grid), "--export", str(out)]) == 0
    assert capsys.readouterr().out.endswith(
        "--table --write docs/results.md` puts its table in the docs)\n")
    s = read_json(out)
    assert s["protocol"] == read_json(grid / "protocol.json") and s["metrics"] == KEYS
    for obj in ("good_views", "next_token"):
        assert s["objectives"][obj]["seeds"] == [0, 1]
        for seed in (0, 1):
            run = grid / "runs" / f"{obj}-lr1.00e-03-seed{seed}"
            metrics = read_json(run / "metrics.json")
            test = metrics["image_alignment"]["steps"][-1]["test"]
            assert s["objectives"][obj]["mutual_knn"][seed] == test["mutual_knn"]["mean"]
            assert s["objectives"][obj]["R@1"][seed] == test["R@1"]["mean"]
            assert s["objectives"][obj]["paraphrase_R@1"][seed] == \
                metrics["final"]["test"]["paraphrase_R@1"]
    assert set(s["untrained"]) == {"bidirectional", "causal"} and s["ceiling"] is not None
    capsys.readouterr()
    assert main(["compare", str(grid), "--against", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "all 21 agree"              # 2 objectives + 2 untrained rows x 5; ceiling
    assert all(": " in l and "agree: " in l for l in lines[1:-1])


def test_a_float64_export_does_not_offer_the_float32_docs(grid, tmp_path, capsys):
    wide = Path(shutil.copytree(grid, tmp_path / "grid-float64"))
    protocol = read_json(wide / "protocol.json")
    protocol["base"]["model"]["dtype"] = "float64"
    (wide / "protocol.json").write_text(json.dumps(protocol))
    assert main(["compare", str(wide), "--export", str(tmp_path / "s.json")]) == 0
    said = capsys.readouterr().out
    assert "docs/results.md" not in said and "a float64 table: `python -m minialign compare " \
        f"SOURCE --against {tmp_path / 's.json'}` compares another with it" in said
