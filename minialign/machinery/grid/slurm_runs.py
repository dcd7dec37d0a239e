"""A grid's runs handed to Slurm instead of run here: `replicate --slurm`.

    python -m minialign replicate ... --out OUT --slurm            # write the array, print sbatch
    python -m minialign replicate ... --out OUT --slurm --submit   # ... and submit it
    python -m minialign replicate ... --out OUT --slurm --wait     # ... wait, resubmit, report
    python -m minialign report OUT                                 # whatever has finished

The runs handed over are those replicate.wanted_runs lists now (the seed grid, then the lr
search's runs without a score) that are not finished and scored, and that Slurm does not hold
already (slurm.queued). One array task = one run (slurm.py writes the array):

    python -m minialign train --objective O --captions C --out OUT/runs/NAME --resume
        --threads T --steps ... (every training flag, from the run's TrainConfig)
    && python -m minialign evaluate --run OUT/runs/NAME --embeddings E   (with image eval on)

which is replicate.train_and_score as two commands. Every field is passed, floats by repr, so
`train` rebuilds the run's TrainConfig exactly (checked before anything is written:
parsed_config); --resume makes a requeued or resubmitted task continue its run. Each task
asks for --threads cores (default 1: one run per core is the most steps per second) and
jobs.run_memory_mb of the largest run, MB. A rerun writes (and submits) only what is missing:
runs that failed, and the lr search's extensions once the runs they depend on are scored.
--wait does those reruns itself until the protocol is complete, then writes the report.
"""
import argparse
import dataclasses
import math
import sys
from pathlib import Path

from ...train import TrainConfig, prepare
from ..experiment import report
from . import slurm
from ..images.embeddings import sha256_file
from ..run.dirlock import DirLock
from ..run.files import atomic_write_json
from ..run.flags import LOSS_FIELDS, MODEL_FIELDS, TRAIN_FLAGS, add_config_flags, config_from_args
from .jobs import log_tail, run_memory_mb
from ..run.machine import describe
from ..experiment.protocol import run_name, save_protocol
from .replicate import check_scored_with, load_image_embeddings, needs_evaluation, wanted_runs
from ..run.rundir import is_finished

DEFAULT_THREADS = 1   # cores per task when --threads is not given


def add_slurm_args(p):
    """The --slurm options of a command that runs a grid (replicate; scaling)."""
    g = p.add_argument_group("Slurm: hand the runs to a cluster's scheduler instead")
    g.add_argument("--slurm", action="store_true",
                   help="write OUT/slurm/array-N.sh (one array task on --threads cores, "
                        "default 1, per run not finished and not already queued) and its "
                        "manifest, print the sbatch line")
    g.add_argument("--submit", action="store_true", help="with --slurm: also sbatch it")
    g.add_argument("--wait", action="store_true",
                   help="with --slurm: submit, wait for the array, submit what the lr search "
                        "adds, until the protocol is complete; then write the report")
    g.add_argument("--sbatch-option", action="append", default=None, metavar="OPTION",
                   help="with --slurm: one more #SBATCH line, repeatable, e.g. "
                        "--sbatch-option=--time=04:00:00 --sbatch-option=--partition=short")


def check_slurm_args(args):
    """Raises ValueError (one line naming the flags) for flags that do not go together."""
    if not args.slurm:
        given = [f for f, v in (("--submit", args.submit), ("--wait", args.wait),
                                ("--sbatch-option", args.sbatch_option)) if v]
        if given:
            raise ValueError(f"{given[0]} needs --slurm")
        return
    if getattr(args, "jobs", None) is not None:
        raise ValueError("--jobs runs the grid here; with --slurm each run is one Slurm array "
                         "task: drop --jobs (--threads sets each task's cores)")
    if getattr(args, "dry_run", False):
        raise ValueError("--dry-run times the grid here; --slurm without --submit already "
                         "writes the array without running anything")
    bad = [o for o in args.sbatch_option or () if not o.startswith("-") or "\n" in o]
    if bad:
        raise ValueError(f"--sbatch-option {bad[0]!r}: must be one sbatch option on one line, "
                         f"e.g. --sbatch-option=--time=04:00:00")


def flag_value(value):
    """A config value as a command-line word that parses back to the same value: floats by
    repr (the shortest string that round-trips), ints and strings as they are."""
    return repr(float(value)) if isinstance(value, float) else str(value)


def train_argv(cfg, run_dir, threads):
    """The `python -m minialign train` command of one run: every training flag from `cfg`."""
    argv = [sys.executable, "-m", "minialign", "train", "--objective", cfg.objective,
            "--captions", cfg.captions, "--out", str(run_dir), "--resume",
            "--threads", str(threads)]
    for name in TRAIN_FLAGS:
        owner = cfg.model if name in MODEL_FIELDS else cfg.loss if name in LOSS_FIELDS else cfg
        argv += ["--" + name.replace("_", "-"), flag_value(getattr(owner, name))]
    return argv


def parsed_config(argv):
    """The TrainConfig `train` builds from a train_argv (its training flags, as cli.py does)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--objective"), p.add_argument("--captions")
    add_config_flags(p, TRAIN_FLAGS, TrainConfig())
    args, _ = p.parse_known_args(argv[4:])
    return config_from_args(args, TrainConfig(), objective=args.objective,
                            captions=args.captions)


def task(cfg, out, threads, embeddings):
    """(run name, [train argv, evaluate argv when embeddings is a path]) of one run. Raises
    ValueError when `train`'s flags cannot rebuild cfg exactly (a field without a flag)."""
    run_dir = Path(out) / "runs" / run_name(cfg)
    argv = train_argv(cfg, run_dir, threads)
    rebuilt, wanted = (dataclasses.asdict(dataclasses.replace(
        c, model=dataclasses.replace(c.model, vocab_size=cfg.model.vocab_size)))
        for c in (parsed_config(argv), cfg))   # vocab_size: train sets it from the captions
    if rebuilt != wanted:
        differ = sorted(k for k in wanted if rebuilt[k] != wanted[k])
        raise ValueError(f"{run_dir.name}: `train`'s flags cannot give this run's config "
                         f"({', '.join(differ)} differ); run it with replicate --jobs")
    argvs = [argv]
    if embeddings is not None:
        argvs.append([sys.executable, "-m", "minialign", "evaluate", "--run", str(run_dir),
                      "--embeddings", str(embeddings), "--rescore"])   # checked at submit
    return run_dir.name, argvs


def missing_runs(wanted, out, emb, held):
    """The runs of `wanted` (TrainConfigs, in order) to hand to Slurm: each name once, not
    finished, or finished but not scored against emb ({"data", "sha256"} or None); none that
    Slurm holds already (held: names, slurm.queued)."""
    todo, seen = [], set(held)
    for cfg in wanted:
        run_dir = Path(out) / "runs" / run_name(cfg)
        if run_dir.name in seen:
            continue
        if not is_finished(run_dir) or needs_evaluation(run_dir, emb):
            todo.append(cfg)
        seen.add(run_dir.name)
    return todo


def hand_over(protocol, args, emb, vocab_size, wanted=wanted_runs):
    """Write (and with --submit/--wait submit) the array of the runs missing now. Returns
    (job id or None, {run name: task index}, names Slurm already holds); an empty dict when
    nothing is missing (no file written)."""
    out, metric = Path(args.out), "mutual_knn" if emb else "paraphrase_R@1"
    reason = slurm.available()
    held = {} if reason else slurm.queued(out)
    if reason:
        print(f"[slurm] {reason}: runs queued in Slurm already cannot be known here, every "
              f"missing run is listed", flush=True)
    todo = missing_runs(wanted(protocol, out, emb, metric), out, emb, held)
    threads = args.threads or DEFAULT_THREADS
    tasks = [task(cfg, out, threads, args.embeddings if emb else None) for cfg in todo]
    if held:
        print(f"[slurm] {len(held)} run(s) queued or running in Slurm already (job "
              f"{', '.join(sorted(set(held.values())))}): not submitted again", flush=True)
    if not tasks:
        return None, {}, held
    mem_mb = math.ceil(max(run_memory_mb(cfg, vocab_size) for cfg in todo))
    script = slurm.write_array(out, tasks, threads, mem_mb, f"minialign-{out.name}",
                               args.sbatch_option or ())
    print(f"[slurm] wrote {script} and {slurm.manifest_of(script).name}: {len(tasks)} "
          f"run(s), {threads} core(s) and {mem_mb} MB each:\n  "
          + "\n  ".join(name for name, _ in tasks), flush=True)
    if not (args.submit or args.wait):
        print(f"[slurm] submit it with:  sbatch {script}  (or rerun with --submit); once it "
              f"has run, rerun with --submit to submit what is missing (the lr search's "
              f"extensions), or use --wait for all of it; `python -m minialign report {out}` "
              f"assembles what has finished", flush=True)
        return None, {name: i for i, (name, _) in enumerate(tasks)}, held
    job_id = slurm.submit(script)
    print(f"[slurm] submitted job {job_id} (logs: {script.parent / 'logs'}/{job_id}_<task>.log)",
          flush=True)
    return job_id, {name: i for i, (name, _) in enumerate(tasks)}, held


def run_slurm(protocol, args, wanted=wanted_runs, save=save_protocol, finish=report.run_report):
    """`replicate --slurm`: check every input (flags, Slurm when submitting, captions,
    embeddings, each run's flags) before OUT is touched, then hand the missing runs to Slurm
    (hand_over); --wait repeats until nothing is missing. When nothing is missing (or held),
    says so and builds the report (finish(OUT)). Raises OSError naming the runs and their logs
    when --wait finds runs its array did not finish."""
    check_slurm_args(args)
    reason = slurm.available() if args.submit or args.wait else None
    if reason:
        raise OSError(f"--submit: {reason}; on this machine: scripts/slurm-single-node.sh start")
    out = Path(args.out)
    first = wanted(protocol, out, None, "paraphrase_R@1")[0]
    vocab_size = prepare(first)["tokenizer"].vocab_size          # the captions, checked
    emb = load_image_embeddings(args)
    check_scored_with(args, emb)                   # another file's scores: --rescore only
    emb = emb and {"data": emb, "sha256": sha256_file(emb.path)}
    for cfg in wanted(protocol, out, emb, "mutual_knn" if emb else "paraphrase_R@1"):
        task(cfg, out, 1, None)                                   # each config round-trips
    with DirLock(out):
        (out / "runs").mkdir(exist_ok=True)
        save(out, protocol)
        threads = args.threads or DEFAULT_THREADS   # describe(): the machine that submits
        atomic_write_json(out / "environment.json",
                          {**describe(), "jobs": "slurm", "threads_per_run": threads})
        while True:
            job_id, tasks, held = hand_over(protocol, args, emb, vocab_size, wanted)
            if not args.wait or not (job_id or held):
                break
            for job in [job_id] if job_id else sorted(set(held.values())):
                slurm.wait(job, poll=1.0)
            failed = [name for name in tasks if not is_finished(out / "runs" / name)
                      or needs_evaluation(out / "runs" / name, emb)]
            if failed:
                log = out / slurm.SLURM_DIR / "logs" / f"{job_id}_{tasks[failed[0]]}.log"
                raise OSError(f"Slurm job {job_id} ended without finishing "
                              f"{', '.join(failed)}: {log_tail(log) or 'no output'} (all of "
                              f"it: {log}); rerun to resubmit them")
    if tasks or held:
        return None
    print("[slurm] nothing missing: every run of the protocol has finished", flush=True)
    return finish(out)
