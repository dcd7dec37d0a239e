"""Tests of machinery/grid.py: the lr search and its edge extension on made-up scores, the
protocol file, --jobs and the ETA by hand, and a tiny grid end to end (3 objectives x 1 seed
+ the lr search, a D = 16 encoder on a hand-made captions file), killed with kill -9 and run
again, against runs that were never stopped; the lock, the Slurm script."""
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import POSIX_SIGNALS, write_captions
from test_train import files

from minialign.machinery import grid, runs
from minialign.model import ModelConfig
from minialign.train import TrainConfig

TINY = ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=16, layers="reference")


def tiny_protocol(captions, **changes):
    base = TrainConfig(captions=str(captions), steps=30, batch_photos=8, eval_every=10,
                       warmup_steps=2, lr=1e-3, model=TINY)
    fields = dict(base=base, objectives=("good_views", "bad_views", "next_token"), seeds=(0,),
                  lr_min=1e-3, lr_max=1e-2, lr_per_decade=1, max_extensions=1)
    return grid.Protocol(**{**fields, **changes})


@pytest.mark.parametrize("best, lrs, chosen, interior", [
    (1e-3, [1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2], 1e-3, True),                  # interior at once
    (3.16e-5, [1e-5, 3.16e-5, 1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2], 3.16e-5, True),   # 2 steps
    (1e-7, [1e-5, 3.16e-5, 1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2], 1e-5, False),  # budget spent
    (1.0, [1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2, 3.16e-2, 0.1], 0.1, False),     # the high edge
])
def test_lr_search_extends_an_edge_at_most_max_extensions_times(best, lrs, chosen, interior):
    asked = []

    def score_of(lr):                       # peaked at `best` on a log scale
        asked.append(lr)
        return -abs(math.log10(lr) - math.log10(best))
    search = grid.lr_search(grid.Protocol(), score_of)
    assert search["lrs"] == lrs                         # exact: from integer k, no drift
    assert (search["chosen"], search["interior"], search["missing"]) == (chosen, interior, [])
    assert set(asked) == set(lrs)


def test_lr_search_ties_missing_and_diverged_runs_the_grid_run_names_and_sizes():
    p = grid.Protocol()
    flat = grid.lr_search(p, lambda lr: 0.5)            # ties: the lowest lr, so extend low
    assert flat["lrs"][0] == 1e-5 and flat["chosen"] == 1e-5 and not flat["interior"]
    scores = {1e-4: 0.3, 3.16e-4: 0.2, 1e-3: 0.1, 3.16e-3: 0.0, 1e-2: -math.inf}
    assert grid.lr_search(p, scores.get)["missing"] == [3.16e-5]        # the extension next
    half = grid.lr_search(p, {**scores, 1e-3: None, 1e-2: None}.get)
    assert half["missing"] == [1e-3, 1e-2] and half["chosen"] is None   # side by side, no more
    diverged_high = {**scores, 1e-4: 0.0, 1e-3: 0.4}
    assert grid.lr_search(p, diverged_high.get)["chosen"] == 1e-3
    low, high = grid.lr_search(p, lambda lr: -lr), grid.lr_search(p, lambda lr: lr)
    assert low["lrs"] + high["lrs"][-2:] == [                       # k = -2 .. 6, integer k
        1e-5, 3.16e-5, 1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2, 3.16e-2, 0.1]
    assert grid.run_name(p, grid.run_config(p, "bad_views", 2, 3.16e-4)) == \
        "bad_views-lr3.16e-04-seed2"
    assert len(grid.planned(p)) == 3 * 3 + 3 * 4        # 1e-3 is the seed grid's run
    assert grid.sweep_sizes() == ((64, 4), (128, 4), (256, 2), (256, 4), (256, 8), (512, 4))
    assert len(grid.sweep_sizes(grid="cross")) == 12
    sweep = grid.Protocol(sizes=((128, 4), (32, 1)), lr_per_decade=0, seeds=(0,))
    cfg = grid.run_config(sweep, "next_token", 0, size=(128, 4))
    assert (cfg.model.n_heads, cfg.model.mlp_ratio, sweep.kind) == (2, 4, "scaling")
    assert grid.run_name(sweep, cfg) == "next_token-d128-l4-lr1.00e-03-seed0"
    assert [c.model.d_model for c in grid.planned(sweep).values()] == [128] * 3 + [32] * 3


@pytest.mark.parametrize("changes, words", [
    (dict(seeds=(0, 0)), "seeds"), (dict(objectives=()), "objectives"),
    (dict(lr_min=1e-2, lr_max=1e-3), "lr_min < lr_max"), (dict(objectives=("views",)), "unknown"),
    (dict(sizes=((129, 2),), lr_per_decade=0), "d_model 129 is not divisible by n_heads 2"),
])
def test_a_bad_protocol_is_one_line(changes, words):
    with pytest.raises(ValueError, match=words) as err:
        grid.Protocol(**changes)
    assert "\n" not in str(err.value)


def finish(out, name, score=None):
    """A made-up run: finished with val paraphrase R@1 `score`, or diverged (score None)."""
    run = out / "runs" / name
    run.mkdir(parents=True, exist_ok=True)
    if score is None:
        (run / "diverged.json").write_text("{}")
    runs.write_json(run / "metrics.json", {"evals": [], **(
        {} if score is None else {"final": {"val": {"paraphrase_R@1": score}}})})


def test_an_extension_is_wanted_once_every_run_it_depends_on_has_a_score(tmp_path):
    p = grid.Protocol(objectives=("good_views",), seeds=(0, 1), lr_min=1e-4, lr_max=1e-2,
                      lr_per_decade=1, max_extensions=1)
    wanted = lambda: list(grid.wanted_runs(p, tmp_path)[0])
    first = ["good_views-lr1.00e-03-seed0", "good_views-lr1.00e-03-seed1",
             "good_views-lr1.00e-04-seed0", "good_views-lr1.00e-02-seed0"]
    assert wanted() == first
    finish(tmp_path, "good_views-lr1.00e-04-seed0", 0.0)          # a tie: the lower lr is
    finish(tmp_path, "good_views-lr1.00e-03-seed0", 0.0)          # best, on the low edge ...
    assert wanted() == first                                      # ... 1e-2 not scored yet
    finish(tmp_path, "good_views-lr1.00e-02-seed0", 0.0)
    assert wanted() == first[:2] + ["good_views-lr1.00e-05-seed0"] + first[2:]
    finish(tmp_path, "good_views-lr1.00e-05-seed0")               # diverged: -inf, below 0
    assert wanted() == first[:2] + ["good_views-lr1.00e-05-seed0"] + first[2:]   # no more
    search = grid.wanted_runs(p, tmp_path)[1]["good_views"]
    assert (search["chosen"], search["interior"]) == (1e-4, True)


def test_inputs_are_checked_and_other_settings_refused_naming_the_first_that_differs(
        captions, tmp_path):
    p, out = tiny_protocol(captions), tmp_path / "out"
    ids = np.array(sorted({a["image_id"] for a in json.loads(captions.read_text())["annotations"]}))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "some.npz", image_ids=ids[:-1], embeddings=rng.random((len(ids) - 1, 4)))
    with pytest.raises(ValueError, match=r"some.npz: 1 of the 120 photos of .*captions.json"):
        grid.replicate(p, out, embeddings=tmp_path / "some.npz")
    assert not out.exists()                                       # checked before writing
    grid.check_inputs(p, out)                                     # nothing there yet
    np.savez(tmp_path / "all.npz", image_ids=ids, embeddings=rng.random((len(ids), 4)))
    out.mkdir()
    grid.save_protocol(out, p, tmp_path / "all.npz")              # what `report OUT` reads
    assert runs.read_json(out / "protocol.json")["embeddings"] == str(tmp_path / "all.npz")
    grid.save_protocol(out, p)                                    # kept when not given again
    assert runs.read_json(out / "protocol.json")["embeddings"] == str(tmp_path / "all.npz")
    assert grid.load_protocol(out) == p
    grid.check_inputs(dataclasses.replace(p, seeds=(0, 1)), out)  # no run started yet
    (out / "runs" / "x").mkdir(parents=True)
    (out / "runs" / "x" / "config.json").write_text("{}")
    grid.check_inputs(p, out)                           # the embeddings: not a setting of the runs
    with pytest.raises(ValueError, match=r"protocol.json: holds runs of other settings "
                                         r"\(steps: 30 -> 31\)"):
        grid.check_inputs(dataclasses.replace(p, base=dataclasses.replace(p.base, steps=31)), out)
    with pytest.raises(ValueError, match=r"seeds: \[0\] -> \[0, 1\]"):
        grid.check_inputs(dataclasses.replace(p, seeds=(0, 1)), out)
    other = write_captions(tmp_path / "other.json", seed=1)
    with pytest.raises(ValueError) as err:                        # a second dataset, one --out
        grid.replicate(dataclasses.replace(p, base=dataclasses.replace(
            p.base, captions=str(other))), out)
    assert str(err.value) == (f"{out}: holds runs of other captions ({captions}; now {other}, "
                              f"whose bytes differ); choose another --out")
    assert grid.load_protocol(out) == p                           # nothing written
    copy = tmp_path / "copy.json"                                 # same bytes, other spelling
    copy.write_bytes(Path(captions).read_bytes())
    grid.check_inputs(dataclasses.replace(p, base=dataclasses.replace(
        p.base, captions=str(copy))), out)


@pytest.mark.parametrize("durations, slots, expected", [
    ([], 2, 0.0), ([3, 1, 1], 1, 5.0), ([3, 1, 1, 1], 2, 3.0), ([2, 2, 2], 2, 4.0),
    ([5, 1, 1], 2, 5.0), ([1, 3, 4], 2, 5.0)])
def test_makespan_by_hand(durations, slots, expected):
    assert grid.makespan(durations, slots) == expected


def test_jobs_by_cores_runs_and_memory():
    assert grid.choose_jobs(None, 1000, 9, cores=4, free_mb=2600) == 2      # memory
    assert grid.choose_jobs(None, 1000, 3, cores=8, free_mb=99999) == 3     # runs
    assert grid.choose_jobs(None, 100, 9, cores=2, free_mb=99999) == 2      # cores
    assert grid.choose_jobs(None, 9999, 9, cores=2, free_mb=100) == 1       # at least one
    assert grid.choose_jobs(1, 9999, 9, cores=2, free_mb=100) == 1          # one: always
    with pytest.raises(ValueError, match=r"^--jobs 3: .* use --jobs 2 or fewer$"):
        grid.choose_jobs(3, 1000, 9, cores=4, free_mb=2600)
    cfg = TrainConfig()
    mb = lambda **c: grid.run_memory_mb(dataclasses.replace(cfg, **c), 30522)
    assert mb(objective="next_token") > mb() > mb(batch_photos=128) > grid.MEM_BASE_MB
    assert mb(model=dataclasses.replace(cfg.model, dtype="float64")) > 1.9 * (mb() - 180)


def test_eta_times_each_objective_and_writes_nothing(captions, tmp_path, capsys):
    timed = {"fixed_s": 4.0, "step_s": 0.5, "val_share": 0.1}            # one run, by hand
    assert grid.run_seconds(TrainConfig(steps=100, eval_every=30), timed) == \
        4.0 * 2 + 3 * 4.0 * 0.1 + 100 * 0.5
    p, out = tiny_protocol(captions, objectives=("good_views", "next_token")), tmp_path / "out"
    found = grid.estimate(p, out, 2, grid.planned(p))
    assert not out.exists()
    assert found["left"] == 4
    assert 0 < found["seconds"] < found["seconds_max"]          # an extension may come on top
    said = capsys.readouterr().out
    assert "[eta] good_views:" in said and "[eta] next_token:" in said
    assert "[eta] 4 of 4 runs left, --jobs 2:" in said


@POSIX_SIGNALS
def test_killed_grid_reruns_to_the_bits_of_runs_never_stopped(captions, tmp_path, monkeypatch,
                                                               capfd):
    p, out = tiny_protocol(captions), tmp_path / "out"
    code = ("import json, sys; from minialign.machinery import grid; "
            "grid.replicate(grid.Protocol(**json.loads(sys.argv[1])), sys.argv[2], jobs=2)")
    argv = [sys.executable, "-c", code, json.dumps(dataclasses.asdict(p)), str(out)]
    with open(tmp_path / "first.txt", "wb") as said:
        parent = subprocess.Popen(argv, stdout=said, stderr=said, start_new_session=True)
        stopped = None
        while stopped is None and parent.poll() is None:
            done = [d for d in out.glob("runs/*") if grid.state(d) == "finished"]
            going = [d for d in out.glob("runs/*") if not grid.state(d) and
                     (d / "log.jsonl").is_file() and
                     (d / "log.jsonl").read_bytes().count(b"\n") >= 12]
            if done and going:
                os.killpg(parent.pid, signal.SIGKILL)     # the grid and its runs, at once
                stopped = going
            time.sleep(0.01)
        parent.wait()
    assert stopped, (tmp_path / "first.txt").read_text()
    assert all((d / "checkpoint.npz").is_file() and not grid.state(d) for d in stopped)
    before = {d.name: (d / "log.jsonl").stat().st_mtime_ns for d in done}
    capfd.readouterr()
    result = grid.replicate(p, out, jobs=2)
    said = capfd.readouterr().out
    assert all(f"{name}: finished earlier, skipped" in said for name in before)
    assert all((out / "runs" / n / "log.jsonl").stat().st_mtime_ns == t for n, t in before.items())
    names = sorted(d.name for d in (out / "runs").iterdir())
    assert sorted(result["runs"]) == names and set(result["runs"].values()) == {"finished"}
    assert 6 <= len(names) <= 9                   # 3 seed runs, 3 at 1e-2, <= 1 extension each
    for obj, search in result["lr_search"].items():               # every lr it read, run
        assert search["chosen"] in search["lrs"] and all(grid.run_name(
            p, grid.run_config(p, obj, 0, lr)) in names for lr in search["lrs"])
    for d in stopped:                             # the stopped runs, against never-stopped ones
        reference = tmp_path / "reference" / d.name
        cfg = grid.wanted_runs(p, out)[0][d.name]
        subprocess.run(grid.train_argv(cfg, reference), check=True, capture_output=True,
                       env={**os.environ, **{name: "1" for name in grid.THREAD_ENV}})
        assert files(d) == files(reference)
    again = grid.replicate(p, out, jobs=2)
    said = capfd.readouterr().out
    assert "[replicate] start" not in said and again["runs"] == result["runs"]


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_run_stops_when_the_grid_process_is_killed(captions, tmp_path):
    cfg = dataclasses.replace(tiny_protocol(captions).base, steps=10**6, eval_every=10**5)
    code = ("import json, sys, time; from minialign.machinery import grid; "
            "child = grid.start(grid.TrainConfig(**json.loads(sys.argv[1])), sys.argv[2], None); "
            "print(child.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code, json.dumps(dataclasses.asdict(cfg)),
                               str(tmp_path / "run")],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    pid = int(parent.stdout.readline())
    while not (tmp_path / "run" / "log.jsonl").is_file():
        time.sleep(0.05)
    parent.kill()
    parent.wait()
    for _ in range(600):                           # gone within a minute, its lock released
        try:
            with runs.lock(tmp_path / "run"):
                break
        except runs.Locked:
            time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the run outlived the grid's process")


def test_a_second_holder_of_the_results_directory_is_refused(captions, tmp_path):
    """Another open file description holding the OS's lock, as another process would."""
    out = tmp_path / "out"
    with runs.lock(out), pytest.raises(runs.Locked, match=r"^\S*out: in use by another "
                                                          r"minialign process"):
        grid.replicate(tiny_protocol(captions), out, jobs=1)
    assert sorted(p.name for p in out.iterdir()) == [".lock"]          # nothing written


def test_slurm_script_one_task_per_run_each_a_train_command(captions, tmp_path):
    from minialign.machinery import cli
    p, out = tiny_protocol(captions, objectives=("good_views", "next_token")), tmp_path / "out"
    script = grid.slurm_script(p, out)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh" and "#SBATCH --array=0-3" in lines
    assert "#SBATCH --cpus-per-task=1" in lines
    assert "export OPENBLAS_NUM_THREADS=1" in lines and (out / "protocol.json").is_file()
    wanted = grid.wanted_runs(p, out)[0]
    cases = [line for line in lines if line[:1].isdigit()]
    assert len(cases) == len(wanted) == 4
    for i, (case, (name, cfg)) in enumerate(zip(cases, wanted.items())):
        argv = case.split(" exec ", 1)[1].removesuffix(" ;;").split()
        assert case.startswith(f"{i}) ") and argv[3:7] == ["train", "--out",
                                                          str(out / "runs" / name), "--resume"]
        assert cli.config_from_args(cli.parser().parse_args(argv[3:])) == cfg   # exact
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "1"}
    subprocess.run(["sh", "-c", script], env=env, check=True, capture_output=True)
    name, cfg = list(wanted.items())[1]
    saved = runs.read_json(out / "runs" / name / "config.json")
    model = dataclasses.replace(cfg.model, vocab_size=saved["info"]["vocab_size"])
    assert saved["config"] == json.loads(json.dumps(dataclasses.asdict(
        dataclasses.replace(cfg, model=model))))
    assert grid.state(out / "runs" / name) == "finished"
    assert "#SBATCH --array=0-2" in grid.slurm_script(p, out)        # what is still missing
