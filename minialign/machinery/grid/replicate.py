"""The replication's whole protocol as one command that survives being stopped; the scaling
sweep (scaling_run.py) runs on the same machinery.

    python -m minialign replicate --captions C --embeddings E --out results/coco

1. The seed grid: every objective x every seed at one shared learning rate (the replication:
   3 objectives x seeds 0, 1, 2, 3000 steps, 256 photos per step, lr 1e-3 for all three),
   seed-major, so an early stop still leaves every objective with a seed.
2. The learning-rate search: per objective, the first seed over a log-spaced grid; the best
   final val mutual-kNN wins (val paraphrase R@1 without image embeddings). A best value on
   the edge of the grid extends it by one point on that side, at most MAX_EXTENSIONS times,
   so every chosen lr is interior. A grid point equal to the shared lr is the seed grid's run.
3. Image evaluation of every run (scoring.score_run, under the run's lock), then
   report.build_report. A run whose scores are of another embeddings file (refused before
   training unless --rescore) or stale (it trained further since: run/scores.py) is scored
   again (scored.needs_evaluation).

The output directory holds protocol.json (a rerun with another protocol is refused),
environment.json, and runs/<objective>-lr<lr>-seed<seed>/, each a train.train run directory.
Resuming is two-level: a finished run is skipped, the run in progress continues from its
last checkpoint (train.train(resume=True)), so a rerun of the same command loses at most
eval_every steps. A run whose loss diverged gets diverged.json and is not retried.

--jobs N runs N runs at once, each in its own process (jobs.py) on --threads cores (default
cores // N), its output in out/logs/<run>.log; a run starts as soon as a slot is free and the
runs it depends on are scored (wanted_runs: only the search's extensions depend on others).
A sweep (protocol kind "scaling") is the seed grid over its sizes, no search; the ETA times
each objective at each size apart (protocol.group_of).
A run's numbers depend on its --threads, not on --jobs. Before the grid, replicate prints how
long it will take (estimate.py; --dry-run: only that).
"""

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from ... import train
from . import estimate, jobs as jobs_
from ..images import evaluate
from ..experiment import report
from ..experiment.scaling import count_params
from ..images.embeddings import sha256_file
from ..run.dirlock import DirLock
from ..run.files import atomic_write_json
from ..run.machine import describe, use_cores
from ..experiment.protocol import (check_protocol, group_of, lr_search, planned_runs, run_config,
                                   run_name, save_protocol, seed_grid, selection_score)
from ..run.rundir import Diverged, is_finished, read_metrics
# scored's names, also as replicate.X (they were this module's before #28)
from .scored import (add_rescore_arg, check_scored_with, load_image_embeddings,  # noqa: F401
                     missing_embeddings_message, needs_evaluation, say_if_stale)

EXIT_DIVERGED = 3   # a --jobs child's exit code for a diverged run (as cli.EXIT_DIVERGED)


# ---------------------------------------------------------------- running
def eta_line(tally, steps, jobs=1, busy=()):
    """'runs done / total, ETA' for the runs in tally["pending"] (names) not yet started, each
    `steps` long, on `jobs` slots (jobs.makespan), after the runs in progress (busy: their
    seconds left), from the measured seconds per step of each objective (and size, in a
    sweep: protocol.group_of; their mean over the others, for one not measured yet). With
    jobs > 1 the measured s/step are those of runs sharing the machine, so the contention is
    in them."""
    rates = {obj: float(np.mean(ms)) / 1000 for obj, ms in tally["ms_per_step"].items()}
    line = f"{tally['done']}/{tally['total']} runs done"
    if tally.get("extensions_left"):           # the lr search may still add runs
        line += f" (+ up to {tally['extensions_left']} if the lr search extends its grid)"
    if not rates:
        return line + ", ETA after the first run"
    fallback = float(np.mean(list(rates.values())))
    waiting = sorted(tally["pending"] - set(tally.get("running", ())))
    seconds = jobs_.makespan([steps * rates.get(group_of(name), fallback)
                              for name in waiting], jobs, busy)
    measured = ", ".join(f"{obj} {s:.2f}" for obj, s in rates.items())
    if len(rates) > 3:                                    # a sweep: one range, not every size
        measured = f"{min(rates.values()):.2f}-{max(rates.values()):.2f} over {len(rates)} groups"
    return f"{line}, ETA {estimate.hours(seconds)} (measured s/step incl. evaluation: {measured})"


def train_and_score(cfg, run_dir, emb, progress=None, tag="[replicate]"):
    """Train (or resume, or skip when finished) one run, then score it against the image
    embeddings if it has not been yet. What a --jobs child runs (jobs.start), and run_one's
    work in this process. tag: the command's, tally["tag"]. Returns EXIT_DIVERGED for a
    diverged run, else 0."""
    code = 0
    try:
        train.train(cfg, run_dir, resume=True, progress=progress)
    except Diverged as err:                    # train wrote diverged.json
        print(f"{tag} {err}; not retried", flush=True)      # err names the run
        code = EXIT_DIVERGED
    if needs_evaluation(run_dir, emb):
        say_if_stale(run_dir, tag)
        evaluate.score_run(run_dir, emb["data"], tag=tag)
    return code


def record_finished(run_dir, tally):
    """A run this session ran is done: its measured ms/step into the tally."""
    metrics = read_metrics(run_dir)
    if "ms_per_step" in metrics:
        tally["ms_per_step"].setdefault(group_of(run_dir.name), []).append(
            metrics["ms_per_step"])
    tally["pending"].discard(run_dir.name)
    tally["done"] += 1


def run_one(out, cfg, emb, tally, progress):
    """Train (or skip, or resume) one run in this process, then score it against the image
    embeddings. emb: {"data": ImageEmbeddings, "sha256"} or None; tally: the grid's bookkeeping
    {"done", "total", "pending": run names, "ms_per_step": {objective: [ms]}}, updated here;
    progress: train.train's (tqdm bar, plain lines, or None: by terminal)."""
    run_dir = Path(out) / "runs" / run_name(cfg)
    if is_finished(run_dir):
        print(f"{tally['tag']} {run_dir.name}: finished earlier, skipped", flush=True)
        if needs_evaluation(run_dir, emb):
            say_if_stale(run_dir, tally["tag"])
            evaluate.score_run(run_dir, emb["data"], tag=tally["tag"])
        tally["pending"].discard(run_dir.name)
        tally["done"] += 1
        return
    print(f"{tally['tag']} run {tally['done'] + 1}/{tally['total']}: {run_dir.name} | "
          f"{eta_line(tally, cfg.steps)}", flush=True)
    train_and_score(cfg, run_dir, emb, progress, tally["tag"])
    record_finished(run_dir, tally)


def replicate(protocol, out, emb=None, progress=None, jobs=1, threads=None):
    """Run the whole protocol into `out` (see the module docstring). emb: loaded
    ImageEmbeddings, or None to train text-only (the search then selects on paraphrase R@1).
    progress: train.train's. jobs: runs at once, each in its own process on `threads` cores
    (default: cores // jobs); jobs = 1 runs them here, on `threads` cores if given.
    Returns {objective: lr_search result}."""
    out = Path(out)
    with DirLock(out):
        (out / "runs").mkdir(exist_ok=True)
        save_protocol(out, protocol)
        threads = threads or (jobs_.threads_per_run(jobs) if jobs > 1 else None)
        atomic_write_json(out / "environment.json",
                          {**describe(), "jobs": jobs, "threads_per_run": threads})
        if jobs == 1 and threads:
            use_cores(threads)
        return run_grid(protocol, out, emb, progress, jobs, threads)


def wanted_runs(protocol, out, emb, metric):
    """The runs the protocol needs now, as TrainConfigs in start order (each one's directory:
    out/runs/protocol.run_name(cfg)): the seed grid (protocol.seed_grid, over the sizes of a
    sweep), then for each objective every lr of its search replayed so far that has no score
    yet (protocol.lr_search's "missing"): an extension appears once the runs it depends on
    are scored. emb: {"data", "sha256"} or None; metric: the search's selection metric."""
    wanted = seed_grid(protocol)
    for objective in protocol.objectives if protocol.lr_per_decade else ():
        search = lr_search(protocol, score_function(protocol, out, emb, metric, objective))
        wanted += [run_config(protocol, objective, protocol.seeds[0], lr)
                   for lr in search["missing"]]
    return wanted


def score_function(protocol, out, emb, metric, objective):
    """score_of(lr) of lr_search for `objective`'s runs in `out`: None also for a run not yet
    scored against these embeddings."""
    def score_of(lr):
        run_dir = out / "runs" / run_name(run_config(protocol, objective, protocol.seeds[0], lr))
        return None if needs_evaluation(run_dir, emb) else selection_score(run_dir, metric)
    return score_of


def new_tally(protocol, out):
    """The grid's bookkeeping: runs planned, done, pending, the ms/step of every planned
    run measured in an earlier session, and the tag of its lines ([replicate], [scaling])."""
    planned = {run_name(cfg) for cfg in planned_runs(protocol)}
    searched = len(protocol.objectives) if protocol.lr_per_decade else 0
    tally = {"done": 0, "total": len(planned), "pending": set(planned), "ms_per_step": {},
             "running": {}, "extensions_left": searched * protocol.max_extensions,
             "tag": f"[{protocol.kind}]"}
    for name in sorted(planned):
        metrics = read_metrics(out / "runs" / name)
        if "ms_per_step" in metrics:                       # measured in an earlier session
            tally["ms_per_step"].setdefault(group_of(name), []).append(
                metrics["ms_per_step"])
    return tally


def run_grid(protocol, out, emb, progress, jobs=1, threads=None):
    """replicate()'s body, in the locked results directory `out`: start each wanted run as
    soon as a slot is free, in wanted_runs' order, until nothing is wanted or running."""
    emb = emb and {"data": emb, "sha256": sha256_file(emb.path)}
    metric = "mutual_knn" if emb else "paraphrase_R@1"
    tally, handled, t0 = new_tally(protocol, out), set(), time.perf_counter()
    running, children = tally["running"], []      # name: (process, cfg); every child started
    try:
        while True:
            ready = [cfg for cfg in wanted_runs(protocol, out, emb, metric)
                     if run_name(cfg) not in handled | set(running)]
            if ready and len(running) < jobs:
                cfg, name = ready[0], run_name(ready[0])
                if name not in tally["pending"]:           # an extension of the lr grid
                    tally["pending"].add(name)
                    tally["total"] += 1
                    tally["extensions_left"] = max(0, tally["extensions_left"] - 1)
                if jobs == 1 or is_finished(out / "runs" / name) and not needs_evaluation(
                        out / "runs" / name, emb):
                    run_one(out, cfg, emb, tally, progress)
                    handled.add(name)
                else:
                    running[name] = (start_child(out, cfg, emb, threads, tally, jobs,
                                                 children), cfg)
                continue
            if not running:
                break
            finished = jobs_.wait_any([p for p, _ in running.values()])
            for name in [n for n, (p, _) in running.items() if p in finished]:
                process, cfg = running.pop(name)
                finish_child(out, name, process.exitcode, tally, jobs, cfg.steps)
                handled.add(name)
            jobs_.rebalance([p for p, _ in running.values()], threads * jobs)   # freed cores
    finally:
        jobs_.stop_all(children)                  # those still running: SIGINT, then wait
    searches = {}
    for objective in protocol.objectives if protocol.lr_per_decade else ():
        searches[objective] = search = lr_search(
            protocol, score_function(protocol, out, emb, metric, objective))
        if search["todo"] is not None:
            print(f"{tally['tag']} lr search {objective}: incomplete, {search['todo']:.2e} has "
                  f"no val {metric}", flush=True)
            continue
        print(f"{tally['tag']} lr search {objective}: chosen {search['chosen']:.2e} "
              f"({'interior' if search['interior'] else 'ON THE EDGE'}) of "
              f"{', '.join(f'{lr:.2e}' for lr in search['lrs'])} on val {metric}", flush=True)
    print(f"{tally['tag']} grid done in {(time.perf_counter() - t0) / 60:.1f} min this session",
          flush=True)
    return searches


def child_log(out, name):
    """Where a --jobs child's output goes: out/logs/<run name>.log (appended on resume)."""
    (Path(out) / "logs").mkdir(exist_ok=True)
    return Path(out) / "logs" / f"{name}.log"


def start_child(out, cfg, emb, threads, tally, jobs, children):
    """Start train_and_score of one run in its own process (jobs.start, which appends it to
    `children`), saying so with the grid's ETA."""
    run_dir = Path(out) / "runs" / run_name(cfg)
    busy = estimate.busy_seconds(out, tally)
    print(f"{tally['tag']} start {tally['done'] + len(tally['running']) + 1}/{tally['total']}: "
          f"{run_dir.name} ({threads} thread(s), output in {child_log(out, run_dir.name)}) | "
          f"{eta_line(tally, cfg.steps, jobs, busy)}", flush=True)
    process = jobs_.start(train_and_score, (cfg, run_dir, emb, False, tally["tag"]), threads,
                          child_log(out, run_dir.name), children)
    jobs_.rebalance([p for p in children if p.exitcode is None], threads * jobs)
    return process


def finish_child(out, name, exitcode, tally, jobs, steps):
    """Book a child's end: done (0, or diverged: 3), or stop the grid with one line (the
    others are stopped by run_grid, resumable)."""
    log = child_log(out, name)
    if exitcode == jobs_.EXIT_INTERRUPTED:
        raise KeyboardInterrupt
    jobs_.raise_unfinished([exitcode])           # an exercise not done yet, in a student copy
    if exitcode not in (0, EXIT_DIVERGED):
        how = f"killed by signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"
        raise OSError(f"{name}: the run's process failed ({how}): "
                      f"{jobs_.log_tail(log) or 'no output'} (all of it: {log})")
    record_finished(Path(out) / "runs" / name, tally)
    state = "diverged, not retried" if exitcode == EXIT_DIVERGED else "finished"
    busy = estimate.busy_seconds(out, tally)
    print(f"{tally['tag']} {state}: {name} | {eta_line(tally, steps, jobs, busy)}", flush=True)


def print_encoder(protocol, vocab_size):
    """One line: the encoder's size, from its tokenizer's vocabulary (scaling.count_params)."""
    model = protocol.base.model
    size = count_params(dataclasses.replace(model, vocab_size=vocab_size))
    print(f"[replicate] encoder: {size:,} parameters (D="
          f"{model.d_model}, L={model.n_layers}, {protocol.base.tokenizer} vocabulary of "
          f"{vocab_size})", flush=True)


def run_replicate(protocol, args):
    """`python -m minialign replicate`: the estimate (unless --no-estimate), the grid, then
    results.md, results.json and figures; --dry-run: the estimate only, nothing written.
    Every input (flags, captions, embeddings, --jobs against memory) is read and checked
    before --out is touched."""
    check_protocol(args.out, protocol)                        # before a minute of timing
    data = train.prepare(run_config(protocol, protocol.objectives[0], protocol.seeds[0]))
    emb = load_image_embeddings(args)
    check_scored_with(args, emb)
    jobs, threads, per_run_mb = estimate.choose_jobs(protocol, args, data["tokenizer"].vocab_size)
    print_encoder(protocol, data["tokenizer"].vocab_size)
    del data
    if args.dry_run or not args.no_estimate:
        found = estimate.print_estimate(protocol, args.out, jobs,
                                        threads or describe()["blas_threads"], per_run_mb)
        if args.dry_run:
            return found
    t0 = time.perf_counter()
    replicate(protocol, args.out, emb, jobs=jobs, threads=threads)
    results = report.build_report(args.out)
    print(report.format_markdown(results).split("\n## ")[0])
    print(f"[replicate] {time.perf_counter() - t0:.0f} s this session; wrote "
          f"{Path(args.out) / 'results.md'}, results.json and {len(report.FIGURES)} figures",
          file=sys.stderr, flush=True)
    return results
