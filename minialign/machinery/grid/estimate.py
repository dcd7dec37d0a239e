"""How a replicate grid runs on this machine: how many runs at once (--jobs, within the
memory), and how long it will take, measured before committing a night.

`replicate --dry-run` (and `replicate` itself, first, unless --no-estimate) starts, for each
objective, --jobs timing processes at once, each on --threads cores (jobs.start), so the
step time measured is the one under the contention the grid will see. Each times a few whole
training steps (bench.time_steps: objective, clipping, AdamW on one real batch) and one val
evaluation (monitor.evaluate: embed the val captions, text metrics, save them). Then

    one run  = reading the captions + steps x ms/step + val evaluations x their time
               + the final evaluation
    the grid = the runs not finished yet, started in replicate's order on --jobs slots
               (jobs.makespan), and, as the upper end of a range, the lr searches' possible
               extensions: max_extensions more runs per objective, one after another.

The final evaluation embeds the val, test and train captions; its time is taken as the val
evaluation's x (all photos / val photos), an upper bound (the train split is embedded only).
Not counted: checkpoint writes and image evaluation (seconds per run).
"""
import dataclasses
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ...data import sample_batch
from ...model import init_params
from ...train import prepare
from ..timing import bench
from . import jobs as jobs_
from ..run import monitor
from ..run.files import atomic_write_json, read_json
from ..run.machine import available_cores, describe
from ..experiment.protocol import planned_runs, run_config, run_name
from ..run.rundir import LOG, is_finished

MEASURE_WARMUP = 1   # untimed steps first (page faults, BLAS thread start-up)
MEASURE_STEPS = 3    # timed steps per process; the median is kept
BARRIER_TIMEOUT_S = 600   # a timing process waits this long for the others to be ready


def measure_child(cfg, warmup, steps, result_path, barrier):
    """A timing process (jobs.start): `warmup` + `steps` training steps of cfg on one batch and
    one val evaluation, started together with the other timing processes (barrier: a
    multiprocessing.Barrier) so that they contend as runs of the grid do; writes
    {"ms_per_step", "val_eval_s", "prepare_s", "photos": {split: n}, "peak_rss_mb"} to
    result_path (prepare_s: reading and tokenizing the captions, as each run does first)."""
    t0 = time.perf_counter()
    data = prepare(cfg)
    prepare_s = time.perf_counter() - t0
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(      # as train.train does
        cfg.model, vocab_size=data["tokenizer"].vocab_size))
    rng_init, rng_data, rng_mask = (np.random.default_rng(s)
                                    for s in np.random.SeedSequence(cfg.seed).spawn(3))
    params = init_params(cfg.model, rng_init)
    batch = sample_batch(data["tables"]["train"], cfg.batch_photos, rng_data)
    barrier.wait(BARRIER_TIMEOUT_S)
    seconds = bench.time_steps(cfg.objective, cfg, batch, params, rng_mask, warmup, steps)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "captions").mkdir()
        t0 = time.perf_counter()
        monitor.evaluate(params, cfg, data, tmp, 1, ("val",))
        val_eval_s = time.perf_counter() - t0
    atomic_write_json(result_path, {
        "ms_per_step": 1000 * statistics.median(seconds), "val_eval_s": val_eval_s,
        "prepare_s": prepare_s,
        "photos": {k: len(v) for k, v in data["split"].items()},
        "peak_rss_mb": bench.peak_rss_mb()})


def measure(protocol, jobs, threads, warmup=MEASURE_WARMUP, steps=MEASURE_STEPS):
    """Time each objective of the protocol with `jobs` timing processes at once, `threads`
    cores each. Returns {objective: {"ms_per_step": median over the processes, "val_eval_s":
    median, "final_eval_s", "peak_rss_mb": max}}. Raises OSError if a timing process fails."""
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for objective in protocol.objectives:
            cfg = dataclasses.replace(protocol.base, objective=objective,
                                      seed=protocol.seeds[0])
            paths = [Path(tmp) / f"{objective}-{i}.json" for i in range(jobs)]
            barrier = multiprocessing.get_context("spawn").Barrier(jobs)
            processes = []
            try:
                for path in paths:
                    jobs_.start(measure_child, (cfg, warmup, steps, path, barrier), threads,
                                None, processes)
                while alive := [p for p in processes if p.exitcode is None]:
                    if any(p.exitcode != 0 for p in jobs_.wait_any(alive)):
                        barrier.abort()             # the others stop waiting for it
            finally:
                jobs_.stop_all(processes)
            if any(p.exitcode == jobs_.EXIT_INTERRUPTED for p in processes):
                raise KeyboardInterrupt
            jobs_.raise_unfinished([p.exitcode for p in processes])   # an exercise stub
            if any(p.exitcode != 0 for p in processes):
                raise OSError(f"the {objective} timing process failed (exit codes "
                              f"{[p.exitcode for p in processes]}; its error is above)")
            found = [read_json(path, "timing result") for path in paths]
            photos = found[0]["photos"]
            val_eval_s = statistics.median(r["val_eval_s"] for r in found)
            measured[objective] = {
                "ms_per_step": statistics.median(r["ms_per_step"] for r in found),
                "val_eval_s": val_eval_s,
                "prepare_s": statistics.median(r["prepare_s"] for r in found),
                "final_eval_s": val_eval_s * sum(photos.values()) / photos["val"],
                "peak_rss_mb": bench.max_rss(r["peak_rss_mb"] for r in found)}
    return measured


def run_seconds(cfg, m):
    """Wall time of one run of cfg, s, from its objective's measurement m (measure's):
    preparing its data, its steps, its val evaluations and the final one."""
    val_evals = (cfg.steps - 1) // cfg.eval_every          # the last step's is the final one
    return (m.get("prepare_s", 0.0) + cfg.steps * m["ms_per_step"] / 1000
            + val_evals * m["val_eval_s"] + m["final_eval_s"])


def grid_estimate(protocol, out, measured, jobs):
    """The grid's wall time on `jobs` slots from `measured` (measure's), for the runs of
    protocol.planned_runs not finished in `out` yet. Returns {"runs", "left", "seconds",
    "extensions": most runs the searches may add, "seconds_max": with all of them}."""
    runs = list({run_name(cfg): cfg for cfg in planned_runs(protocol)}.values())
    left = [cfg for cfg in runs if not is_finished(Path(out) / "runs" / run_name(cfg))]
    seconds = jobs_.makespan([run_seconds(cfg, measured[cfg.objective]) for cfg in left], jobs)
    per_objective = [run_seconds(protocol.base, measured[obj]) for obj in protocol.objectives]
    extra = protocol.max_extensions if protocol.lr_per_decade else 0
    return {"runs": len(runs), "left": len(left), "seconds": seconds,
            "extensions": extra * len(protocol.objectives),
            "seconds_max": seconds + extra * jobs_.makespan(per_objective, jobs)}


def hours(seconds):
    """A duration for people: 40 s, 12 min, 9.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def format_estimate(protocol, estimate, measured, jobs, threads, per_run_mb):
    """The plan and the estimate, as the lines replicate prints."""
    b = protocol.base
    steps = ", ".join(f"{obj} {m['ms_per_step']:.0f} ms/step" for obj, m in measured.items())
    evals = ", ".join(f"{m['val_eval_s']:.1f} s" for m in measured.values())
    prep = max(m["prepare_s"] for m in measured.values())
    rss = bench.rss_text(bench.max_rss(m["peak_rss_mb"] for m in measured.values()))
    search = (f"lr search {protocol.lr_min:.2e}..{protocol.lr_max:.2e}, "
              f"{protocol.lr_per_decade}/decade" if protocol.lr_per_decade else "no lr search")
    extra = (f", up to {hours(estimate['seconds_max'])} if every lr search extends its grid "
             f"({estimate['extensions']} more runs)" if estimate["extensions"] else "")
    return "\n".join([
        f"[estimate] plan: {estimate['left']} of {estimate['runs']} runs left "
        f"({len(protocol.objectives)} objectives x {len(protocol.seeds)} seed{'s' if len(protocol.seeds) != 1 else ''}, {search}), "
        f"{b.steps} steps x {b.batch_photos} photos each, val evaluation every "
        f"{b.eval_every} steps; --jobs {jobs} x --threads {threads}",
        f"[estimate] measured with {jobs} timing process(es) at once, {threads} thread(s) "
        f"each: {steps}; one val evaluation {evals}; reading the captions {prep:.1f} s; "
        f"peak memory per run {rss} "
        f"(--jobs checks ~{per_run_mb:,.0f} MB)",
        f"[estimate] this grid on this machine: {hours(estimate['seconds'])}{extra}"])


def print_estimate(protocol, out, jobs, threads, per_run_mb):
    """Measure, estimate and print; returns the estimate (grid_estimate's, + "measured"), or
    None when every planned run has finished (nothing measured)."""
    runs = list({run_name(cfg): cfg for cfg in planned_runs(protocol)}.values())
    if all(is_finished(Path(out) / "runs" / run_name(cfg)) for cfg in runs):
        print(f"[estimate] all {len(runs)} planned runs have finished: nothing to time")
        return None
    print(f"[estimate] timing {MEASURE_WARMUP} + {MEASURE_STEPS} steps and one val "
          f"evaluation of each objective ({jobs} process(es) at once) ...", flush=True)
    measured = measure(protocol, jobs, threads)
    estimate = grid_estimate(protocol, out, measured, jobs)
    print(format_estimate(protocol, estimate, measured, jobs, threads, per_run_mb), flush=True)
    return {**estimate, "measured": json.loads(json.dumps(measured))}


# ---------------------------------------------------------------- --jobs and the ETA while running
def choose_jobs(protocol, args, vocab_size):
    """--jobs (default: jobs.default_jobs from the cores, the memory and the grid's runs) and
    --threads per run (default: cores // jobs; None with one job: numpy's own default).
    Returns (jobs, threads, per-run memory estimate in MB). Raises ValueError when jobs > 1
    runs would not fit in the machine's available memory (jobs.check_jobs_fit); one run that
    may not fit gets a warning (the estimate errs high; swap may hold the rest)."""
    per_run_mb = max(jobs_.run_memory_mb(run_config(protocol, obj, protocol.seeds[0]),
                                         vocab_size) for obj in protocol.objectives)
    (available_mb, source), cores = jobs_.available_memory(), available_cores()
    runs = len({run_name(cfg) for cfg in planned_runs(protocol)})
    jobs = args.jobs or jobs_.default_jobs(cores, per_run_mb, available_mb, runs)
    try:
        jobs_.check_jobs_fit(jobs, per_run_mb, available_mb)
    except ValueError as err:
        if jobs > 1:
            raise
        print(f"warning: {err}".replace("; use --jobs 1 or fewer", ""), file=sys.stderr)
    threads = args.threads or (jobs_.threads_per_run(jobs, cores) if jobs > 1 else None)
    memory = ("available memory not known here: --jobs is not checked against it"
              if available_mb is None else f"~{per_run_mb:,.0f} MB per run of "
              f"{available_mb:,.0f} MB available" + ("" if source == "MemAvailable"
                                                      else f" ({source})"))
    print(f"[{getattr(args, 'command', 'replicate')}] --jobs {jobs}{'' if args.jobs else ' (default)'} x --threads "
          f"{threads or describe()['blas_threads']}: {cores} cores, {memory}", flush=True)
    if jobs * (threads or 1) > cores:
        print(f"warning: --jobs {jobs} x --threads {threads or 1} > {cores} cores: the runs "
              f"will slow each other down", file=sys.stderr, flush=True)
    return jobs, threads, per_run_mb


def seconds_left(run_dir, cfg, tally):
    """Seconds a run in progress still needs: its steps not yet in log.jsonl x its
    objective's measured s/step (else every objective's; 0 before any measurement)."""
    ms = (tally["ms_per_step"].get(cfg.objective)
          or [v for vs in tally["ms_per_step"].values() for v in vs] or [0.0])
    try:
        with open(Path(run_dir) / LOG, "rb") as f:
            done = sum(1 for _ in f)
    except OSError:
        done = 0
    return max(0, cfg.steps - done) * float(np.mean(ms)) / 1000


def busy_seconds(out, tally):
    """Seconds left of each run in progress (seconds_left)."""
    return [seconds_left(Path(out) / "runs" / name, cfg, tally)
            for name, (_, cfg) in tally["running"].items()]
