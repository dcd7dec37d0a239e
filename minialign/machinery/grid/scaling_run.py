"""The scaling sweep as one command that survives being stopped: replicate's machinery over a
protocol of kind "scaling" (protocol.py), its own estimate per size and its own report.

    python -m minialign scaling --captions C --embeddings E --out results/coco-scaling

Everything that runs is replicate's: run directories runs/<objective>-d<D>-l<L>-lr<lr>-seed<s>,
the lock, finished runs skipped and the one in progress resumed, --jobs children, the ETA,
Ctrl-C (a rerun continues), and "evaluate later": a rerun with --embeddings only scores the
finished runs (replicate.needs_evaluation). This module adds what differs: the memory check
at the sweep's largest size, the time estimate measured at every size (estimate.measure, one
size at a time), and scaling_report instead of report.
"""
import dataclasses
import sys
import time
from pathlib import Path

from ... import train
from ...objectives import OBJECTIVES
from ..timing import bench
from . import estimate, jobs as jobs_, replicate
from ..images import evaluate
from ..experiment import scaling_report
from ..run.flags import (UniqueList, add_config_flags, add_grid_run_flags, config_from_args,
                         nonnegative_int, positive_int)
from ..run.machine import describe
from ..experiment.protocol import (OBJECTIVE_ORDER, SEEDS, Protocol, check_protocol, run_config,
                                   run_name, seed_grid)
from ..run.rundir import is_finished
from ..experiment.scaling import (CENTER, DEPTHS, GRIDS, WIDTHS, count_params, size_config,
                                  sweep_sizes)

# the training flags `scaling` exposes (flags.TRAIN_FLAGS); the sizes come from --widths,
# --depths, --grid and --center, heads and MLP width from scaling.size_config
FIELDS = ("steps", "batch_photos", "lr", "warmup_steps", "eval_every", "max_len",
          "anticollapse", "sigreg_weight", "layers", "dtype", "tokenizer", "vocab")


# ---------------------------------------------------------------- the command line
def add_scaling_args(p):
    p.add_argument("--captions", required=True, help="COCO captions JSON")
    p.add_argument("--embeddings", default=evaluate.DEFAULT_EMBEDDINGS,
                   help="frozen DINOv2 image embeddings .npz; a rerun with them scores the "
                        "finished runs without retraining")
    p.add_argument("--image-eval", choices=("on", "off"), default="on",
                   help="off: train text-only when the embeddings do not exist yet")
    p.add_argument("--out", required=True, help="results directory, e.g. results/coco-scaling")
    replicate.add_rescore_arg(p)
    p.add_argument("--widths", nargs="+", type=positive_int, default=list(WIDTHS),
                   action=UniqueList, metavar="D", help="encoder widths D, each once; "
                   "H = max(1, D / 64) heads (must divide D), MLP 4 D")
    p.add_argument("--depths", nargs="+", type=positive_int, default=list(DEPTHS),
                   action=UniqueList, metavar="L", help="encoder depths L (blocks), each once")
    p.add_argument("--grid", choices=GRIDS, default="plus",
                   help="plus: every width at the --center depth and every depth at the "
                        "--center width (default: 6 sizes, 54 runs with 3 seeds); cross: "
                        "every width x every depth (12 sizes, 108 runs)")
    p.add_argument("--center", nargs=2, type=positive_int, default=list(CENTER),
                   metavar=("D", "L"), help="where the plus's arms cross (the replication's "
                   "encoder)")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVE_ORDER), action=UniqueList,
                   choices=sorted(OBJECTIVES), help="objectives, in table order, each once")
    p.add_argument("--seeds", nargs="+", type=nonnegative_int, default=list(SEEDS),
                   action=UniqueList, help="seeds, each once, >= 0")
    add_config_flags(p, FIELDS, train.TrainConfig())
    add_grid_run_flags(p, "sweep", "as many runs of the largest size as fit in memory")


def protocol_from_args(args):
    """The Protocol (kind "scaling") of parsed add_scaling_args options. Raises ValueError,
    one line naming --widths, for a width its heads do not divide."""
    base = config_from_args(args, train.TrainConfig(), captions=args.captions)
    sizes = sweep_sizes(args.widths, args.depths, args.grid, tuple(args.center))
    try:
        return Protocol(base=base, objectives=args.objectives, seeds=args.seeds,
                        lr_per_decade=0, kind="scaling", sizes=sizes)
    except ValueError as err:
        raise ValueError(f"--widths/--depths/--center: {err}") from None


# ---------------------------------------------------------------- the estimate
def size_protocol(protocol, size):
    """The sweep at one size (D, L), as a replicate protocol without search: what
    estimate.measure and estimate.choose_jobs take."""
    base = run_config(protocol, protocol.objectives[0], protocol.seeds[0], size=size)
    return Protocol(base=dataclasses.replace(protocol.base, model=base.model),
                    objectives=protocol.objectives, seeds=protocol.seeds, lr_per_decade=0)


def largest(protocol, vocab_size):
    """The size whose run needs the most memory (jobs.run_memory_mb over the objectives)."""
    return max(protocol.sizes, key=lambda size: max(
        jobs_.run_memory_mb(run_config(protocol, obj, protocol.seeds[0], size=size), vocab_size)
        for obj in protocol.objectives))


def sweep_estimate(protocol, out, measured, jobs, threads):
    """The sweep's wall time from `measured` ({size: estimate.measure's}), for the runs not
    finished in `out`: on `jobs` slots here (jobs.makespan, in start order), and on a cluster
    with one task per run all at once (the longest run). Returns {"runs", "left", "seconds",
    "cluster_seconds", "core_hours": run seconds x threads summed, / 3600}."""
    runs = seed_grid(protocol)
    left = [cfg for cfg in runs if not is_finished(Path(out) / "runs" / run_name(cfg))]
    seconds = [estimate.run_seconds(cfg, measured[cfg.model.d_model, cfg.model.n_layers][
        cfg.objective]) for cfg in left]
    return {"runs": len(runs), "left": len(left), "seconds": jobs_.makespan(seconds, jobs),
            "cluster_seconds": max(seconds, default=0.0),
            "core_hours": sum(seconds) * threads / 3600}


def print_estimate(protocol, out, jobs, threads, per_run_mb, vocab_size):
    """Time 1 + 3 steps and one val evaluation of each objective at each size with runs left
    (jobs timing processes at once, as estimate.measure), print the plan and the sweep's time
    here and on a cluster; returns sweep_estimate's dict + "measured", or None when every
    run has finished."""
    b = protocol.base
    todo = [size for size in protocol.sizes
            if any(not is_finished(Path(out) / "runs" / run_name(run_config(
                protocol, obj, seed, size=size)))
                   for obj in protocol.objectives for seed in protocol.seeds)]
    if not todo:
        print(f"[estimate] all {len(seed_grid(protocol))} runs of the sweep have finished: "
              f"nothing to time")
        return None
    print(f"[estimate] timing {estimate.MEASURE_WARMUP} + {estimate.MEASURE_STEPS} steps and "
          f"one val evaluation of each objective at each of {len(todo)} sizes ({jobs} "
          f"process(es) at once) ...", flush=True)
    measured = {}
    for size in todo:
        measured[size] = m = estimate.measure(size_protocol(protocol, size), jobs, threads)
        cfg = size_config(*size, vocab_size, b.model.max_len)
        one = ", ".join(f"{obj} {m[obj]['ms_per_step']:.0f} ms/step, run "
                        f"{estimate.hours(estimate.run_seconds(b, m[obj]))}" for obj in m)
        print(f"[estimate] D={size[0]} L={size[1]} H={cfg.n_heads} "
              f"({scaling_report.params_text(count_params(cfg))} parameters): {one}; peak "
              f"{bench.rss_text(bench.max_rss(x['peak_rss_mb'] for x in m.values()))}",
              flush=True)
    found = sweep_estimate(protocol, out, measured, jobs, threads)
    print(f"[estimate] plan: {found['left']} of {found['runs']} runs left "
          f"({len(protocol.objectives)} objectives x {len(protocol.seeds)} seeds x "
          f"{len(protocol.sizes)} sizes, no lr search), {b.steps} steps x {b.batch_photos} "
          f"photos each, val evaluation every {b.eval_every} steps; --jobs {jobs} x --threads "
          f"{threads} (--jobs checks ~{per_run_mb:,.0f} MB per run, the largest size's)",
          flush=True)
    print(f"[estimate] this sweep on this machine: {estimate.hours(found['seconds'])}; on a "
          f"cluster, one {threads}-core task per run all at once at this machine's speed: "
          f"{estimate.hours(found['cluster_seconds'])} (the longest run), "
          f"{found['core_hours']:.3g} core-hours in all", flush=True)
    return {**found, "measured": {f"d{d}-l{n}": m for (d, n), m in measured.items()}}


def run_scaling(protocol, args):
    """`python -m minialign scaling`: check every input, the estimate (unless --no-estimate),
    the sweep (replicate.replicate), then results.md, results.json and fig_scaling.png;
    --dry-run: the estimate only, nothing written. Every input (flags, captions, embeddings,
    --jobs against the largest size's memory) is checked before --out is touched."""
    check_protocol(args.out, protocol)                        # before a minute of timing
    data = train.prepare(run_config(protocol, protocol.objectives[0], protocol.seeds[0],
                                    size=protocol.sizes[0]))
    vocab_size = data["tokenizer"].vocab_size
    del data
    emb = replicate.load_image_embeddings(args)
    replicate.check_scored_with(args, emb)
    jobs, threads, per_run_mb = estimate.choose_jobs(
        size_protocol(protocol, largest(protocol, vocab_size)), args, vocab_size)
    if args.dry_run or not args.no_estimate:
        found = print_estimate(protocol, args.out, jobs, threads or describe()["blas_threads"],
                               per_run_mb, vocab_size)
        if args.dry_run:
            return found
    t0 = time.perf_counter()
    replicate.replicate(protocol, args.out, emb, jobs=jobs, threads=threads)
    results = scaling_report.build_report(args.out)
    print(scaling_report.format_markdown(results).split("\n## ")[0])
    print(f"[scaling] {time.perf_counter() - t0:.0f} s this session; wrote "
          f"{Path(args.out) / 'results.md'}, results.json and {scaling_report.FIGURE}",
          file=sys.stderr, flush=True)
    return results
