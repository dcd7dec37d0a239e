"""The scaling sweep: sizes, parameter counts and the gap's trend on hand-made data
(scaling.py); the plan and protocol.json of a sweep (protocol.py); the estimate from measured
times (scaling_run.py); bad flags; and a tiny sweep end to end on a 300-scene SYNTHETIC world
(2 sizes x 3 objectives x 2 seeds, 6 steps of a 1-block encoder): stopped and resumed, its
report recomputed from the runs, a rerun with the image embeddings, --jobs children."""
import argparse
import dataclasses
import json
import math

import numpy as np
import pytest

from minialign import train
from minialign.machinery.experiment import baselines, scaling_report
from minialign.machinery import cli
from minialign.machinery.grid import replicate, scaling_run
from minialign.machinery.images import synthetic
from minialign.machinery.images.embeddings import load_embeddings
from minialign.machinery.grid.jobs import makespan
from minialign.machinery.run.rundir import is_finished
from minialign.machinery.experiment.protocol import (Protocol, SizedConfig, load_protocol,
                                                     planned_runs, run_config, run_name,
                                                     save_protocol)
from minialign.machinery.experiment.scaling import (DEPTHS, WIDTHS, count_params, gap_trend, signed,
                                                    size_config, sweep_sizes, trend_sentence)
from minialign.model import init_params, param_count


@pytest.mark.parametrize("d_model, n_layers", [(64, 2), (128, 4), (96, 1)])
def test_count_params_equals_the_allocated_model(d_model, n_layers):
    cfg = size_config(d_model, n_layers, vocab_size=50, max_len=12)
    assert cfg.n_heads == max(1, d_model // 64) and cfg.mlp_ratio == 4
    assert count_params(cfg) == param_count(init_params(cfg, np.random.default_rng(0)))


def test_trend_slope_and_se_match_a_hand_computed_fit():
    # x = log10(params) = 1, 2, 3 (mean 2, sum of squares about it 2); gaps 0.1, 0.2, 0.4:
    # b = sum (x - 2)(g - gbar) / 2 = ((-1)(0.1) + (0)(0.2) + (1)(0.4)) / 2 = 0.15
    t = gap_trend([(10, 0.1), (100, 0.2), (1000, 0.4)])
    assert t["slope"] == pytest.approx(0.15, abs=1e-12)
    # residuals: g - gbar - b (x - 2) = 0.1-0.2333+0.15, 0.2-0.2333, 0.4-0.2333-0.15
    r = np.array([0.1 - 0.7 / 3 + 0.15, 0.2 - 0.7 / 3, 0.4 - 0.7 / 3 - 0.15])
    assert t["se"] == pytest.approx(math.sqrt(r @ r / 1 / 2), abs=1e-12)
    assert t["verdict"] == ("grows" if 0.15 > 2 * t["se"] else "not resolved at these sizes")
    assert t["n"] == 3 and t["sizes"] == 3


def test_trend_verdicts():
    rng = np.random.default_rng(0)
    sizes = [1e5, 1e6, 1e7, 1e8]
    shrinking = [(p, 0.3 - 0.05 * math.log10(p) + 0.001 * rng.standard_normal())
                 for p in sizes for _ in range(3)]
    assert gap_trend(shrinking)["verdict"] == "shrinks"
    flat = gap_trend([(p, sign * 0.1) for p in sizes for sign in (1, -1)])  # slope 0, se > 0
    assert flat["slope"] == pytest.approx(0.0, abs=1e-15) and flat["se"] > 0
    assert flat["verdict"] == "not resolved at these sizes"
    one_size = gap_trend([(1e6, 0.1), (1e6, 0.2), (1e6, 0.15)])
    assert one_size["slope"] is None and one_size["sizes"] == 1
    assert "not resolved" in trend_sentence(one_size, "mutual_knn")
    assert "shrinks with encoder size" in trend_sentence(gap_trend(shrinking), "mutual_knn")
    assert trend_sentence(flat, "mutual_knn").startswith(
        "The good_views − next_token gap in mutual_knn is not resolved at these sizes: slope +0.0000 ±")
    for rounding in (-1e-17, 0.0, 1e-17):     # the fit's slope of a flat gap, on any BLAS
        assert "slope +0.0000 ±" in trend_sentence({**flat, "slope": rounding}, "mutual_knn")
    assert [signed(x, 3) for x in (-0.0004, -0.0006, 0.0, 0.25)] == [
        "+0.000", "-0.001", "+0.000", "+0.250"]


# ---------------------------------------------------------------- planning
def test_sweep_sizes_plus_and_cross():
    assert sweep_sizes() == ((64, 4), (128, 4), (256, 2), (256, 4), (256, 8), (512, 4))
    cross = sweep_sizes(grid="cross")
    assert len(cross) == 12 and set(cross) == {(d, n) for d in WIDTHS for n in DEPTHS}
    # the center need not be in the lists: its width's arm and its depth's arm
    assert sweep_sizes((16, 32), (1, 2), "plus", (64, 3)) == ((16, 3), (32, 3), (64, 1), (64, 2))
    with pytest.raises(ValueError, match="sweep grid 'diag'"):
        sweep_sizes(grid="diag")


def sweep_protocol(captions="c.json", sizes=((8, 1), (16, 1)), seeds=(0, 1), **base):
    cfg = train.TrainConfig(captions=str(captions), steps=6, batch_photos=16, eval_every=3,
                            warmup_steps=2, **base)
    return Protocol(base=cfg, seeds=seeds, lr_per_decade=0, kind="scaling", sizes=sizes)


def test_sweep_plan_names_sizes_and_counts(tmp_path):
    protocol = sweep_protocol(sizes=((64, 2), (128, 4)), seeds=(0, 1, 2))
    runs = planned_runs(protocol)
    assert len(runs) == 2 * 3 * 3 == len({run_name(cfg) for cfg in runs})
    assert [run_name(cfg) for cfg in runs[:6]] == [     # seed-major, then size, then objective
        f"{obj}-d{d}-l{n}-lr1.00e-03-seed0" for d, n in ((64, 2), (128, 4))
        for obj in ("good_views", "bad_views", "next_token")]
    for cfg in runs:
        D = cfg.model.d_model
        assert isinstance(cfg, SizedConfig) and cfg.model.n_heads == max(1, D // 64)
        assert cfg.model.mlp_ratio == 4 and cfg.steps == 6 and cfg.lr == 1e-3
    assert [run_name(c) for c in replicate.wanted_runs(protocol, tmp_path, None,
                                                       "paraphrase_R@1")] == \
        [run_name(c) for c in runs]                        # no lr search: the plan is all
    save_protocol(tmp_path, protocol)
    assert load_protocol(tmp_path) == protocol
    saved = json.loads((tmp_path / "protocol.json").read_text())
    assert saved["kind"] == "scaling" and saved["sizes"] == [[64, 2], [128, 4]]
    # a replicate protocol keeps its names, and one saved before the sweep reads as replicate
    plain = Protocol(base=protocol.base)
    assert run_name(run_config(plain, "good_views", 0)) == "good_views-lr1.00e-03-seed0"
    old = {k: v for k, v in dataclasses.asdict(plain).items() if k not in ("kind", "sizes")}
    (tmp_path / "protocol.json").write_text(json.dumps(old))
    assert load_protocol(tmp_path) == plain


@pytest.mark.parametrize("fields, message", [
    (dict(kind="scaling"), "a scaling protocol needs encoder sizes"),
    (dict(sizes=((64, 2),)), "a replicate protocol takes no encoder sizes"),
    (dict(kind="scaling", sizes=((64, 2),)), "no lr search"),
    (dict(kind="scaling", sizes=((200, 2),), lr_per_decade=0),
     "encoder size D=200, L=2: d_model=200 is not divisible by n_heads=3"),
    (dict(kind="grid"), "protocol kind 'grid'"),
])
def test_protocols_that_disagree_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Protocol(base=train.TrainConfig(), **fields)


def test_sweep_estimate_from_measured_times(tmp_path):
    """Hand-computed: run = prepare + steps x s/step + (steps - 1) // eval_every val
    evaluations + the final one; 4 runs per size (2 objectives x 2 seeds) on 2 slots."""
    protocol = dataclasses.replace(sweep_protocol(), objectives=("good_views", "next_token"))
    m = lambda ms: {"ms_per_step": ms, "val_eval_s": 0.5, "final_eval_s": 2.0, "prepare_s": 1.0}
    measured = {(8, 1): {"good_views": m(100), "next_token": m(300)},
                (16, 1): {"good_views": m(200), "next_token": m(500)}}
    # 6 steps, eval_every 3: (6 - 1) // 3 = 1 val evaluation; run = 1 + 0.006 ms + 0.5 + 2
    run = {(d, obj): 3.5 + 6 * measured[d, 1][obj]["ms_per_step"] / 1000
           for d in (8, 16) for obj in ("good_views", "next_token")}
    order = [run[d, obj] for _ in (0, 1) for d in (8, 16) for obj in ("good_views", "next_token")]
    found = scaling_run.sweep_estimate(protocol, tmp_path, measured, jobs=2, threads=1)
    assert found["runs"] == found["left"] == 8
    assert found["seconds"] == pytest.approx(makespan(order, 2), abs=1e-12)
    assert found["cluster_seconds"] == pytest.approx(run[16, "next_token"], abs=1e-12)
    assert found["core_hours"] == pytest.approx(sum(order) / 3600, abs=1e-12)


def test_bad_flags_give_one_line(tmp_path, capsys):
    captions, _ = synthetic.write_world(tmp_path / "world", n_scenes=300, seed=0, world="v1")
    out = tmp_path / "r"
    common = ["scaling", "--captions", str(captions), "--out", str(out), "--image-eval", "off"]
    assert cli.main(common + ["--widths", "200", "--depths", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("minialign scaling: error: --widths/--depths/--center: encoder size D=200, "
                   "L=4: d_model=200 is not divisible by n_heads=3")
    for flags, text in ((["--widths", "0"], "argument --widths: must be an integer >= 1"),
                        (["--depths", "2", "2"], "argument --depths: each value at most once"),
                        (["--grid", "diag"], "argument --grid: invalid choice")):
        with pytest.raises(SystemExit) as stop:
            cli.main(common + flags)
        assert stop.value.code == 2 and text in capsys.readouterr().err
    assert not out.exists()


# ---------------------------------------------------------------- a tiny sweep, end to end
@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """2 sizes x 3 objectives x seeds 0, 1, text-only, killed in its second run and run again;
    then a rerun with the image embeddings. Returns paths, trainings and both reports."""
    root = tmp_path_factory.mktemp("sweep")
    captions, embeddings = synthetic.write_world(root / "world", n_scenes=300, seed=0, world="v1")
    protocol, out = sweep_protocol(captions), root / "results"
    real_train, calls = train.train, {"first": [], "second": [], "third": []}

    def killed_in_second_run(cfg, run_dir, **kwargs):
        calls["first"].append(run_dir.name)
        if len(calls["first"]) == 2:
            real_train(cfg, run_dir, **kwargs, stop_after=4)   # checkpoint at 3, then "kill"
            raise KeyboardInterrupt
        return real_train(cfg, run_dir, **kwargs)

    def counted(key):
        def train_(cfg, run_dir, **kwargs):
            calls[key].append((run_dir.name, is_finished(run_dir)))
            return real_train(cfg, run_dir, **kwargs)
        return train_
    mp = pytest.MonkeyPatch()
    mp.setattr(train, "train", killed_in_second_run)
    with pytest.raises(KeyboardInterrupt):
        replicate.replicate(protocol, out, None, progress=False)
    mp.setattr(train, "train", counted("second"))
    replicate.replicate(protocol, out, None, progress=False)
    text_only = scaling_report.build_report(out)
    md_text_only = (out / "results.md").read_text()
    mp.setattr(train, "train", counted("third"))
    replicate.replicate(protocol, out, load_embeddings(embeddings), progress=False)
    mp.undo()
    assert cli.main(["report", str(out)]) == 0          # the report command finds the sweep
    return {"out": out, "calls": calls, "protocol": protocol, "text_only": text_only,
            "md_text_only": md_text_only, "results": json.loads((out / "results.json").read_text()),
            "embeddings": embeddings}


def test_rerun_skips_finished_runs_and_resumes_the_stopped_one(sweep):
    first, second = sweep["calls"]["first"], sweep["calls"]["second"]
    assert first == ["good_views-d8-l1-lr1.00e-03-seed0", "bad_views-d8-l1-lr1.00e-03-seed0"]
    names = sorted(p.name for p in (sweep["out"] / "runs").iterdir())
    assert len(names) == 12 and first[0] not in [n for n, _ in second]
    assert sorted(second) == sorted((n, False) for n in set(names) - {first[0]})
    log = (sweep["out"] / "runs" / first[1] / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log] == list(range(1, 7))  # resumed cleanly
    assert sweep["calls"]["third"] == []      # the rerun with embeddings only scores the runs
    for name in names:
        assert len((sweep["out"] / "runs" / name / "log.jsonl").read_text().splitlines()) == 6


def test_text_only_report_has_pending_image_columns_and_a_computed_trend(sweep):
    results, md = sweep["text_only"], sweep["md_text_only"]
    assert results["metric"] == "paraphrase_R@1" and not results["image"]
    check_rows_and_trend(sweep, results, "paraphrase_R@1")
    for d in (8, 16):
        line = next(l for l in md.splitlines() if l.startswith(f"| {d} | 1 | 1 |"))
        assert line.count("pending") == 4        # 3 objectives' and the untrained encoder's
    assert results["trend_sentence"] in md and "Image alignment pending: 0 of 12" in md


def test_rerun_with_embeddings_fills_the_image_columns(sweep):
    results, md = sweep["results"], (sweep["out"] / "results.md").read_text()
    assert results["image"] and results["metric"] == "mutual_knn"
    check_rows_and_trend(sweep, results, "mutual_knn")
    assert "pending" not in md and results["trend_sentence"] in md
    assert (sweep["out"] / "fig_scaling.png").stat().st_size > 10_000
    # the untrained encoder of each size, computed afresh: each seed's step-0 weights
    emb = load_embeddings(sweep["embeddings"])
    for row in results["sizes"]:
        size = (row["d_model"], row["n_layers"])
        fresh = baselines.untrained_scores(sweep["protocol"], emb, size)
        for kind in ("bidirectional", "causal"):
            want = [t["mutual_knn"] for t in fresh[kind]["test"]]
            assert row["untrained"][kind]["mutual_knn"]["values"] == want
        cells = [f"{np.mean([t['mutual_knn'] for t in fresh[k]['test']]):.3f} ± "
                 f"{np.std([t['mutual_knn'] for t in fresh[k]['test']], ddof=1):.3f}"
                 for k in ("bidirectional", "causal")]
        assert f"| {' / '.join(cells)} |" in md


def check_rows_and_trend(sweep, results, metric):
    """Each size's row and the trend, recomputed from every run's metrics.json."""
    out, V = sweep["out"], results["vocab_size"]

    def test_metric(obj, d, seed):
        m = json.loads((out / "runs" / f"{obj}-d{d}-l1-lr1.00e-03-seed{seed}" / "metrics.json")
                       .read_text())
        if metric == "mutual_knn":
            return m["image_alignment"]["steps"][-1]["test"]["mutual_knn"]["mean"]
        return m["final"]["test"]["paraphrase_R@1"]
    points = []
    assert [(r["d_model"], r["n_layers"], r["n_heads"]) for r in results["sizes"]] == [
        (8, 1, 1), (16, 1, 1)]
    for row in results["sizes"]:
        d = row["d_model"]
        params = count_params(size_config(d, 1, V, 64))
        assert row["params"] == params == json.loads((out / "runs" / f"good_views-d{d}-l1-lr"
                                                      f"1.00e-03-seed0" / "config.json")
                                                     .read_text())["info"]["parameters"]
        for obj in ("good_views", "bad_views", "next_token"):
            values = [test_metric(obj, d, s) for s in (0, 1)]
            assert row["objectives"][obj][metric]["values"] == values
            assert row["objectives"][obj][metric]["std"] == pytest.approx(
                np.std(values, ddof=1), abs=1e-15)
        gaps = [test_metric("good_views", d, s) - test_metric("next_token", d, s) for s in (0, 1)]
        assert row["gap"]["per_seed"] == gaps
        points += [(params, g) for g in gaps]
    assert results["trend"] == json.loads(json.dumps(gap_trend(points)))
    assert results["trend"]["n"] == 4 and results["trend"]["slope"] is not None


def test_jobs_children_train_the_sized_runs(sweep, tmp_path, capsys):
    """--jobs 2: each run in its own process (a SizedConfig pickled to the child) lands in
    its sized directory, and gives the numbers of the in-process run (--threads 1); the
    grid's lines say [scaling], not [replicate]."""
    protocol = dataclasses.replace(sweep["protocol"], objectives=("good_views",), seeds=(0,))
    capsys.readouterr()
    replicate.replicate(protocol, tmp_path, None, jobs=2, threads=1)
    lines = capsys.readouterr().out.splitlines()
    first = "good_views-d8-l1-lr1.00e-03-seed0"
    assert lines[0] == (f"[scaling] start 1/2: {first} (1 thread(s), output in "
                        f"{tmp_path / 'logs' / first}.log) | 0/2 runs done, ETA after the "
                        f"first run")
    assert {line.split()[0] for line in lines} == {"[scaling]"}
    replicate.load_image_embeddings(argparse.Namespace(command="scaling", image_eval="off"))
    assert capsys.readouterr().out == ("[scaling] image evaluation off: mutual-kNN and R@1 "
                                       "will read 'pending'\n")
    for d in (8, 16):
        name = f"good_views-d{d}-l1-lr1.00e-03-seed0"
        mine = json.loads((tmp_path / "runs" / name / "metrics.json").read_text())
        theirs = json.loads((sweep["out"] / "runs" / name / "metrics.json").read_text())
        assert mine["final"]["test"] == theirs["final"]["test"]
        assert (tmp_path / "logs" / f"{name}.log").is_file()


def test_a_replicate_protocol_in_a_sweep_directory_is_refused(sweep):
    plain = dataclasses.replace(sweep["protocol"], kind="replicate", sizes=())
    with pytest.raises(ValueError, match=r"other settings \(kind \(saved 'scaling', now 'replicate'\); sizes "):
        replicate.replicate(plain, sweep["out"], None, progress=False)


def test_a_float64_sweep_trains_every_size_in_float64():
    """--dtype float64 (#29) reaches each sized run's model, as --layers does."""
    base = train.TrainConfig().model
    wide = sweep_protocol(sizes=((64, 2), (128, 4)),
                          model=dataclasses.replace(base, dtype="float64", layers="reference"))
    assert {(c.model.dtype, c.model.layers) for c in planned_runs(wide)} == {("float64", "reference")}
    assert {c.model.dtype for c in planned_runs(sweep_protocol())} == {"float32"}
