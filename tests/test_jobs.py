"""Tests of jobs.py, estimate.py and replicate --jobs: the grid's time on N slots, the memory
estimate and refusal, the default N, which runs may start (the lr search's extensions wait for
the runs they depend on), how the cores are split among the runs in progress (rebalance), and
end to end on a tiny SYNTHETIC grid: --jobs 2 (its runs' core counts changing as runs start
and end) gives the numbers of --jobs 1 --threads 1, also after a Ctrl-C and a rerun.
"""
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import NEEDS_FAST_PATH, POSIX_SIGNALS
from minialign import train
from minialign.machinery import cli
from minialign.machinery.grid import estimate, jobs, replicate
from minialign.machinery.images import synthetic
from minialign.machinery.run.dirlock import DirLock
from minialign.machinery.experiment.protocol import Protocol, run_name
from minialign.model import ModelConfig

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- time on N slots
@pytest.mark.parametrize("durations, slots, busy, expected", [
    ([3, 3, 3], 2, (), 6),           # two at once, then the third
    ([5, 1, 1, 1], 2, (), 5),        # the 1s share a slot while the 5 runs
    ([2, 2], 2, (4,), 4),            # a slot busy 4 s: both 2s run on the other one
    ([2, 2, 2], 1, (), 6),           # one slot: the sum
    ([], 2, (7,), 7),                # only a run in progress
    ([], 3, (), 0),
])
def test_makespan_by_hand(durations, slots, busy, expected):
    assert jobs.makespan(durations, slots, busy) == expected


def test_eta_line_counts_the_runs_in_progress_and_the_slots():
    tally = {"done": 1, "total": 4, "ms_per_step": {"good_views": [1000.0],
                                                    "next_token": [3000.0, 1000.0]},
             "pending": {"good_views-lr1.00e-03-seed1", "next_token-lr1.00e-03-seed0",
                         "next_token-lr1.00e-03-seed1"},
             "running": {"next_token-lr1.00e-03-seed0": None}}
    # waiting: good_views 100 steps x 1 s = 100 s, next_token 100 x 2 s (mean) = 200 s;
    # 2 slots, one busy 150 s more: 100 s on the free slot, then 200 s -> 300 s
    line = replicate.eta_line(tally, 100, jobs=2, busy=[150])
    assert line.startswith("1/4 runs done, ETA 5 min (")
    assert replicate.eta_line(tally, 100, jobs=1, busy=[150]) .startswith(
        "1/4 runs done, ETA 8 min (")                             # 150 + 100 + 200 = 450 s
    tally["extensions_left"] = 2                     # the lr search may add 2 runs
    assert replicate.eta_line(tally, 100, jobs=2, busy=[150]).startswith(
        "1/4 runs done (+ up to 2 if the lr search extends its grid), ETA 5 min (")


def test_run_seconds_and_grid_estimate_by_hand(tmp_path):
    base = train.TrainConfig(steps=100, eval_every=25)
    protocol = Protocol(base=base, objectives=("good_views",), seeds=(0, 1), lr_min=1e-3,
                        lr_max=1e-2, lr_per_decade=1, max_extensions=2)
    measured = {"good_views": {"ms_per_step": 1000.0, "val_eval_s": 10.0, "final_eval_s": 50.0}}
    # 100 steps x 1 s + 3 val evaluations (steps 25, 50, 75) x 10 s + the final 50 s
    assert estimate.run_seconds(base, measured["good_views"]) == 180.0
    # runs: seeds 0, 1 at 1e-3, and the search's 1e-2 (its 1e-3 is seed 0's run): 3 x 180 s
    # on 2 slots = 360 s; two extensions, one after the other: 2 x 180 s more at most
    found = estimate.grid_estimate(protocol, tmp_path, measured, jobs=2)
    assert found == {"runs": 3, "left": 3, "seconds": 360.0, "extensions": 2,
                     "seconds_max": 720.0}
    finished = tmp_path / "runs" / "good_views-lr1.00e-03-seed1"
    finished.mkdir(parents=True)
    (finished / "metrics.json").write_text(json.dumps({"final": {}}))
    assert estimate.grid_estimate(protocol, tmp_path, measured, jobs=2)["seconds"] == 180.0
    assert estimate.hours(40) == "40 s" and estimate.hours(720) == "12 min"
    assert estimate.hours(9.5 * 3600) == "9.5 h"


# ---------------------------------------------------------------- memory and the default N
@NEEDS_FAST_PATH                      # the fast set's memory, the default's
def test_run_memory_by_hand():
    cfg = train.TrainConfig()                          # 256 photos, D=256, L=4, F=1024
    # tokens n = 2 x 256 x 13.5 = 6912; activations 6912 x 256 x (4 x 86 + 104) B
    # = 792,723,456 B; weights 4 copies x 4 B x (5814 x 256 + 4 x 12 x 256^2) = 74,145,792 B
    expected = 1.15 * (105 + (792_723_456 + 74_145_792) / 2**20)
    assert jobs.run_memory_mb(cfg, vocab_size=5814) == pytest.approx(expected, rel=1e-12)
    # next_token's fused head: 17 partials of dtok_emb (rows.gemm_blocks(6912): 12 x 512, then
    # 256, 256, 128, 64, 64) + dtok_emb, each 5814 x 256 x 4 B, and 4 logits blocks of
    # 512 x 5814 x 4 B
    head = 1.15 * (18 * 5814 * 256 * 4 + 4 * 512 * 5814 * 4) / 2**20
    nt = train.TrainConfig(objective="next_token")
    assert jobs.run_memory_mb(nt, 5814) - jobs.run_memory_mb(cfg, 5814) == pytest.approx(head)
    # a tiny run, measured at 112 MB peak with image evaluation: n = 2 x 64 x 13.5 = 1728 tokens,
    # activations 1728 x 32 x (86 + 104) B = 10,506,240 B; weights 16 B x (122 x 32 + 12 x 32^2)
    tiny = train.TrainConfig(batch_photos=64, model=ModelConfig(d_model=32, n_layers=1))
    assert jobs.run_memory_mb(tiny, 122) == pytest.approx(
        1.15 * (105 + (10_506_240 + 16 * (122 * 32 + 12 * 32 ** 2)) / 2**20), rel=1e-12)
    assert jobs.run_memory_mb(tiny, 122) / 1.15 >= 112        # the fit alone covers the peak
    half = train.TrainConfig(batch_photos=128)         # activations halve, the rest stays
    assert jobs.run_memory_mb(cfg, 5814) - jobs.run_memory_mb(half, 5814) == pytest.approx(
        1.15 * 792_723_456 / 2 / 2**20)


def test_mem_available_reads_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684000 kB\nMemAvailable:    2048000 kB\n")
    assert jobs.mem_available_mb(meminfo) == 2000.0
    meminfo.write_text("MemTotal:       24684000 kB\n")
    assert jobs.mem_available_mb(meminfo) is None
    assert jobs.mem_available_mb(tmp_path / "absent") is None


def test_check_jobs_fit_refuses_in_one_line():
    jobs.check_jobs_fit(2, 1400, 3400)                  # 2 x 1400 + 500 kept free = 3300
    jobs.check_jobs_fit(64, 1400, None)                 # memory unknown: not checked
    with pytest.raises(ValueError) as err:
        jobs.check_jobs_fit(3, 1400, 3400)
    message = str(err.value)
    assert "\n" not in message and message.startswith("--jobs 3: 3 runs need ~4,200 MB")
    assert "~1,400 MB each" in message and "3,400 MB available" in message
    assert message.endswith("use --jobs 2 or fewer")


@pytest.mark.parametrize("cores, per_run, available, runs, expected", [
    (2, 1400, 23000, 21, 2),        # this machine: one run per core
    (8, 1000, 3600, 21, 3),         # memory: (3600 - 500) // 1000
    (8, 100, None, 3, 3),           # the grid has 3 runs
    (4, 5000, 1000, 21, 1),         # nothing fits: still 1 (check_jobs_fit refuses it)
    (1, 100, 23000, 21, 1),
])
def test_default_jobs(cores, per_run, available, runs, expected):
    assert jobs.default_jobs(cores, per_run, available, runs) == expected


def test_wait_any_on_no_process_returns_at_once():
    assert jobs.wait_any([]) == []          # poll() on no file would block forever


def test_threads_per_run():
    assert [jobs.threads_per_run(n, 2) for n in (1, 2, 3)] == [2, 1, 1]
    assert jobs.threads_per_run(3, 8) == 2


@pytest.mark.parametrize("running, cores, expected", [
    (0, 2, []),
    (1, 2, [2]),                     # the last lone run gets every core
    (2, 2, [1, 1]),
    (3, 2, [1, 1, 1]),               # more runs than cores: one each, never 0
    (3, 5, [2, 2, 1]),               # the remainder to the oldest
    (2, 7, [4, 3]),
])
def test_split_cores_by_hand(running, cores, expected):
    assert jobs.split_cores(running, cores) == expected


def test_rebalance_writes_each_childs_shared_count():
    """Runs start at 1 core each; the oldest finishes; the one left gets both cores."""
    ctx = multiprocessing.get_context("spawn")
    a, b = (SimpleNamespace(cores=ctx.Value("i", 1)) for _ in range(2))
    assert jobs.rebalance([a, b], 2) == [1, 1] and (a.cores.value, b.cores.value) == (1, 1)
    assert jobs.rebalance([b], 2) == [2] and b.cores.value == 2
    assert jobs.rebalance([a, b], 5) == [3, 2] and (a.cores.value, b.cores.value) == (3, 2)


# ---------------------------------------------------------------- which runs may start
def finish(out, name, score):
    """A fake finished run whose final val paraphrase R@1 is `score`."""
    run = Path(out) / "runs" / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.json").write_text(json.dumps(
        {"objective": name.split("-lr")[0], "final": {"val": {"paraphrase_R@1": score}}}))


def test_an_extension_waits_for_every_run_it_depends_on(tmp_path):
    protocol = Protocol(base=train.TrainConfig(), objectives=("good_views",), seeds=(0, 1),
                        lr_min=1e-3, lr_max=1e-2, lr_per_decade=1, max_extensions=1)

    def wanted():
        return [run_name(cfg) for cfg in replicate.wanted_runs(protocol, tmp_path, None,
                                                                "paraphrase_R@1")]
    seeds = ["good_views-lr1.00e-03-seed0", "good_views-lr1.00e-03-seed1"]
    assert wanted() == seeds + ["good_views-lr1.00e-03-seed0", "good_views-lr1.00e-02-seed0"]
    finish(tmp_path, "good_views-lr1.00e-02-seed0", 0.5)      # the best so far, on the edge
    assert wanted() == seeds + ["good_views-lr1.00e-03-seed0"]  # no extension before 1e-3
    finish(tmp_path, "good_views-lr1.00e-03-seed0", 0.1)
    assert wanted() == seeds + ["good_views-lr1.00e-01-seed0"]  # now: one point higher
    finish(tmp_path, "good_views-lr1.00e-01-seed0", 0.2)
    assert wanted() == seeds                                    # search complete (interior)


# ---------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("jobs")
    return synthetic.write_world(root / "world", n_scenes=300, seed=0, world="v1")


def grid_argv(world, out, *extra):
    captions, embeddings = world
    return ["replicate", "--captions", str(captions), "--embeddings", str(embeddings),
            "--out", str(out), "--objectives", "good_views", "next_token", "--seeds", "0",
            "--steps", "24", "--batch-photos", "16", "--warmup-steps", "2", "--eval-every", "6",
            "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--lr-min", "1e-3",
            "--lr-max", "1e-2", "--lr-per-decade", "1", "--max-extensions", "1",
            "--no-estimate", *extra]


def run_cli(argv, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "minialign", *argv], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            **kwargs)


def numbers(out):
    """results.json without the fields that differ run to run: wall times, the folder's
    name, the machine (its "jobs")."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()
                    if k not in ("wall_seconds", "dataset", "environment")}
        return [strip(v) for v in x] if isinstance(x, list) else x
    return strip(json.loads((Path(out) / "results.json").read_text()))


@POSIX_SIGNALS
def test_jobs_2_gives_the_numbers_of_jobs_1_also_after_ctrl_c(world, tmp_path):
    one = run_cli(grid_argv(world, tmp_path / "one", "--jobs", "1", "--threads", "1"))
    assert one.wait() == 0, one.stderr.read()
    two = run_cli(grid_argv(world, tmp_path / "two", "--jobs", "2", "--threads", "1"))
    assert two.wait() == 0, two.stderr.read()
    assert numbers(tmp_path / "two") == numbers(tmp_path / "one")
    assert len(list((tmp_path / "two" / "logs").glob("*.log"))) >= 4   # each child's output

    # Ctrl-C (SIGINT to the whole process group, as a terminal does) in the middle of a run
    cut = tmp_path / "cut"
    stopped = run_cli(grid_argv(world, cut, "--jobs", "2", "--threads", "1"), start_new_session=True)
    deadline = time.monotonic() + 120
    while not any(len(p.read_text().splitlines()) > 6 for p in cut.glob("runs/*/log.jsonl")):
        assert stopped.poll() is None and time.monotonic() < deadline, "never got to step 7"
        time.sleep(0.01)
    os.killpg(stopped.pid, signal.SIGINT)
    assert stopped.wait(60) == 130
    assert "interrupted; rerun the same command" in stopped.stderr.read()
    assert not (cut / "results.json").exists()
    again = run_cli(grid_argv(world, cut, "--jobs", "2", "--threads", "1"))
    assert again.wait() == 0, again.stderr.read()
    assert numbers(cut) == numbers(tmp_path / "one")


def test_too_many_jobs_for_the_memory_are_refused_before_anything_is_written(
        world, tmp_path, capsys):
    out = tmp_path / "results"
    assert cli.main(grid_argv(world, out, "--jobs", "100000")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("minialign replicate: error: --jobs 100000:")
    assert "MB available" in err[0] and not out.exists()


def test_a_run_locked_by_another_process_stops_the_grid_in_one_line(world, tmp_path):
    captions, _ = world
    base = train.TrainConfig(captions=str(captions), steps=6, batch_photos=16, eval_every=3,
                             warmup_steps=2, model=ModelConfig(d_model=16, n_layers=1,
                                                               n_heads=2, max_len=64))
    protocol = Protocol(base=base, objectives=("good_views", "next_token"), seeds=(0,),
                        lr_per_decade=0)
    locked = tmp_path / "runs" / "good_views-lr1.00e-03-seed0"
    with DirLock(locked):                             # as a `train --out` of that folder would
        with pytest.raises(OSError) as err:
            replicate.replicate(protocol, tmp_path, None, progress=False, jobs=2, threads=1)
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "good_views-lr1.00e-03-seed0: the run's process failed (exit code 2): error: ")
    assert "in use by another minialign process" in message


def test_dry_run_times_each_objective_prints_the_plan_and_writes_nothing(world, tmp_path,
                                                                        capsys):
    out = tmp_path / "results"
    assert cli.main(grid_argv(world, out, "--jobs", "2", "--threads", "1", "--dry-run")) == 0
    lines = capsys.readouterr().out.splitlines()
    plan = next(line for line in lines if line.startswith("[estimate] plan:"))
    assert plan.startswith("[estimate] plan: 4 of 4 runs left (2 objectives x 1 seed, lr "
                           "search 1.00e-03..1.00e-02, 1/decade), 24 steps x 16 photos each")
    assert plan.endswith("--jobs 2 x --threads 1")
    measured = next(line for line in lines if line.startswith("[estimate] measured with 2 "))
    assert "good_views" in measured and "next_token" in measured
    assert any(line.startswith("[estimate] this grid on this machine: ") and
               "if every lr search extends its grid (2 more runs)" in line for line in lines)
    assert not out.exists()
