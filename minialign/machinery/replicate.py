"""The replication's whole protocol as one command that survives being stopped.

    python -m minialign replicate --captions C --embeddings E --out results/coco

1. The seed grid: every objective x every seed at one shared learning rate (the replication:
   3 objectives x seeds 0, 1, 2, 3000 steps, 256 photos per step, lr 1e-3 for all three),
   seed-major, so an early stop still leaves every objective with a seed.
2. The learning-rate search: per objective, the first seed over a log-spaced grid; the best
   final val mutual-kNN wins (val paraphrase R@1 without image embeddings). A best value on
   the edge of the grid extends it by one point on that side, at most MAX_EXTENSIONS times,
   so every chosen lr is interior. A grid point equal to the shared lr is the seed grid's run.
3. Image evaluation of every run (evaluate.evaluate_run), then report.build_report.

The output directory holds protocol.json (a rerun with another protocol is refused),
environment.json, and runs/<objective>-lr<lr>-seed<seed>/, each a train.train run directory.
Resuming is two-level: a finished run is skipped, the run in progress continues from its
last checkpoint (train.train(resume=True)), so a rerun of the same command loses at most
eval_every steps. A run whose loss diverged gets diverged.json and is not retried.
"""
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from .. import train
from . import evaluate, rundir
from ..data import load_coco_captions, split_photos
from .files import DirLock, atomic_write_json, read_json
from .embeddings import (check_split_coverage, describe_join, join_on_ids, load_embeddings,
                         sha256_file)
from .flags import (UniqueList, check_heads_divide_width, int_at_least, nonnegative_int,
                    positive_float, positive_int)
from ..model import ModelConfig
from ..objectives import OBJECTIVES

OBJECTIVE_ORDER = ("good_views", "bad_views", "next_token")  # the replication's table order
SEEDS = (0, 1, 2)
LR_MIN, LR_MAX, LR_PER_DECADE = 1e-4, 1e-2, 2   # search grid 1e-4, 3.16e-4, ..., 1e-2
MAX_EXTENSIONS = 2                               # grid points added beyond an edge, at most
DIVERGED = rundir.DIVERGED                   # marker of a run whose loss became NaN/Inf
LR_DIGITS = 3                                    # significant digits of a grid lr
METRICS_KIND = "run metrics file (metrics.json)"  # for read_json's messages


@dataclasses.dataclass(frozen=True)
class Protocol:
    """The grid. `base` is every run's TrainConfig except objective, seed and lr; base.lr is
    the shared lr of the seed grid. lr_per_decade = 0 turns the search off."""
    base: train.TrainConfig
    objectives: tuple = OBJECTIVE_ORDER
    seeds: tuple = SEEDS
    lr_min: float = LR_MIN
    lr_max: float = LR_MAX
    lr_per_decade: int = LR_PER_DECADE
    max_extensions: int = MAX_EXTENSIONS

    def __post_init__(self):
        if isinstance(self.base, dict):
            object.__setattr__(self, "base",
                               train.TrainConfig(**rundir.upgrade_config(self.base)))
        object.__setattr__(self, "objectives", tuple(self.objectives))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        if self.lr_per_decade and grid_points(self) < 2:
            raise ValueError(f"the lr search needs lr_max > lr_min, got {self.lr_min} and "
                             f"{self.lr_max}")


def grid_points(protocol):
    """Number of points of the initial lr grid: lr_min .. lr_max, lr_per_decade per decade."""
    return round(math.log10(protocol.lr_max / protocol.lr_min) * protocol.lr_per_decade) + 1


def grid_lr(protocol, k):
    """The k-th lr of the search grid, k = 0 .. grid_points - 1, or beyond for an extension:
    lr_min * 10^(k / lr_per_decade), rounded to LR_DIGITS significant digits (1e-3, 3.16e-3).
    Computed from the integer k, so repeated extensions never drift."""
    return float(f"{protocol.lr_min * 10 ** (k / protocol.lr_per_decade):.{LR_DIGITS}g}")


def run_config(protocol, objective, seed, lr=None):
    """The TrainConfig of one run (lr None: the seed grid's shared lr)."""
    return dataclasses.replace(protocol.base, objective=objective, seed=seed,
                               lr=protocol.base.lr if lr is None else lr)


def run_name(cfg):
    """Run directory name, e.g. good_views-lr1.00e-03-seed0."""
    return f"{cfg.objective}-lr{cfg.lr:.2e}-seed{cfg.seed}"


def load_protocol(out):
    """The Protocol saved in out/protocol.json. Raises FileNotFoundError / ValueError, one
    line starting with the file: missing, empty, truncated, not a JSON object, or not a
    protocol of this minialign."""
    path = Path(out) / "protocol.json"
    saved = read_json(path, "replicate protocol (protocol.json)")
    try:
        return Protocol(**saved)
    except (TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{path}: not a protocol of this minialign ({err})") from None


def holds_runs(out):
    """Whether out/runs/ holds a run directory that has started (written its config.json)."""
    return any(Path(out).glob("runs/*/config.json"))


def save_protocol(out, protocol):
    """Write out/protocol.json; if one exists and runs were made under it, it must describe
    the same protocol (an `out` that holds no run may take another protocol)."""
    path, saved = Path(out) / "protocol.json", dataclasses.asdict(protocol)
    if path.exists() and holds_runs(out):
        old = read_json(path, "replicate protocol (protocol.json)")
        if isinstance(old.get("base"), dict):            # a protocol saved before #10
            old = {**old, "base": rundir.upgrade_config(old["base"])}
        if old != json.loads(json.dumps(saved)):
            diff = [k for k in saved if json.loads(json.dumps(saved[k])) != old.get(k)]
            raise ValueError(f"{out}: holds results of another protocol (differs in "
                             f"{', '.join(diff)}); choose another output directory")
    atomic_write_json(path, saved)


# ---------------------------------------------------------------- the lr search
def extend_side(scores, extensions, max_extensions=MAX_EXTENSIONS):
    """One decision of the search. scores: val metric at each grid lr, lrs ascending, higher is
    better (ties go to the lower lr); extensions: points already added beyond the grid.
    Returns "low" or "high" when the best score sits on that edge and fewer than
    max_extensions points were added, else None (the best is interior, or the budget is spent)."""
    best = int(np.argmax(scores))
    if extensions >= max_extensions or 0 < best < len(scores) - 1:
        return None
    return "low" if best == 0 else "high"


def lr_search(protocol, score_of):
    """Replay the search of one objective over the runs that exist. score_of(lr) -> the
    selection score of that lr's run, or None if it has not finished.
    Returns {"lrs": ascending, "scores", "todo": the lr to run next or None when the search is
    complete, "chosen": best lr, "interior": whether it is not on the edge of the lrs run}."""
    n = grid_points(protocol)
    ks = list(range(n))
    while True:
        lrs = [grid_lr(protocol, k) for k in ks]
        scores = [score_of(lr) for lr in lrs]
        missing = [lr for lr, s in zip(lrs, scores) if s is None]
        if missing:
            return {"lrs": lrs, "scores": scores, "todo": missing[0], "chosen": None,
                    "interior": False}
        side = extend_side(scores, len(ks) - n, protocol.max_extensions)
        if side is None:
            best = int(np.argmax(scores))
            return {"lrs": lrs, "scores": scores, "todo": None, "chosen": lrs[best],
                    "interior": 0 < best < len(lrs) - 1}
        ks = [ks[0] - 1] + ks if side == "low" else ks + [ks[-1] + 1]


def selection_score(run_dir, metric):
    """The search's score of a run: its final val `metric` ("mutual_knn": mean over caption
    slots, from metrics.json["image_alignment"]; "paraphrase_R@1": from metrics.json["final"]).
    -inf for a diverged run; None if the run has not finished or lacks that metric."""
    run_dir = Path(run_dir)
    if (run_dir / DIVERGED).exists():
        return -math.inf
    path = run_dir / "metrics.json"
    metrics = read_json(path, METRICS_KIND) if path.exists() else {}
    if "final" not in metrics:
        return None
    if metric == "paraphrase_R@1":
        return metrics["final"]["val"]["paraphrase_R@1"]
    steps = metrics.get("image_alignment", {}).get("steps", [])
    return steps[-1]["val"]["mutual_knn"]["mean"] if steps else None


# ---------------------------------------------------------------- running
def environment():
    """numpy, BLAS, threads and CPU of this machine, for the results table."""
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").exists():
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    threads = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                          "MKL_NUM_THREADS") if k in os.environ}
    return {"numpy": np.__version__, "blas": f"{blas.get('name')} {blas.get('version')}",
            "cpus": os.cpu_count(), "thread_env": threads, "cpu": cpu,
            "python": platform.python_version(), "platform": platform.platform()}


def eta_line(tally, steps):
    """'runs done / total, ETA' for the runs in tally["pending"] (names), each `steps` long, from
    the measured seconds per step of each objective (their mean over runs of another
    objective, for an objective not measured yet)."""
    rates = {obj: float(np.mean(ms)) / 1000 for obj, ms in tally["ms_per_step"].items()}
    line = f"{tally['done']}/{tally['total']} runs done"
    if not rates:
        return line + ", ETA after the first run"
    fallback = float(np.mean(list(rates.values())))
    seconds = sum(steps * rates.get(name.split("-lr")[0], fallback) for name in tally["pending"])
    measured = ", ".join(f"{obj} {s:.2f}" for obj, s in rates.items())
    eta = f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"
    return f"{line}, ETA {eta} (measured s/step incl. evaluation: {measured})"


def run_one(out, cfg, emb, tally, progress):
    """Train (or skip, or resume) one run, then score it against the image embeddings.
    emb: {"data": ImageEmbeddings, "sha256"} or None; tally: the grid's bookkeeping
    {"done", "total", "pending": run names, "ms_per_step": {objective: [ms]}}, updated here;
    progress: train.train's (tqdm bar, plain lines, or None: by terminal)."""
    run_dir = Path(out) / "runs" / run_name(cfg)
    if train_finished(run_dir):
        print(f"[replicate] {run_dir.name}: finished earlier, skipped", flush=True)
    else:
        print(f"[replicate] run {tally['done'] + 1}/{tally['total']}: {run_dir.name} | "
              f"{eta_line(tally, cfg.steps)}", flush=True)
        try:
            metrics = train.train(cfg, run_dir, resume=True, progress=progress)
            tally["ms_per_step"].setdefault(cfg.objective, []).append(metrics["ms_per_step"])
        except train.Diverged as err:                    # train wrote diverged.json
            print(f"[replicate] {run_dir.name}: {err}; not retried", flush=True)
    if needs_evaluation(run_dir, emb):
        evaluate.evaluate_run(run_dir, emb["data"])
    tally["pending"].discard(run_dir.name)
    tally["done"] += 1


def replicate(protocol, out, emb=None, progress=None):
    """Run the whole protocol into `out` (see the module docstring). emb: loaded
    ImageEmbeddings, or None to train text-only (the search then selects on paraphrase R@1).
    progress: train.train's. Returns {objective: lr_search result}."""
    out = Path(out)
    with DirLock(out):
        (out / "runs").mkdir(exist_ok=True)
        save_protocol(out, protocol)
        atomic_write_json(out / "environment.json", environment())
        return run_grid(protocol, out, emb, progress)


def run_grid(protocol, out, emb, progress):
    """replicate()'s body, in the locked results directory `out`."""
    emb = emb and {"data": emb, "sha256": sha256_file(emb.path)}
    seed_grid = [run_config(protocol, obj, seed) for seed in protocol.seeds
                 for obj in protocol.objectives]
    first_search = [run_config(protocol, obj, protocol.seeds[0], grid_lr(protocol, k))
                    for obj in protocol.objectives
                    for k in range(grid_points(protocol) if protocol.lr_per_decade else 0)]
    planned = {run_name(cfg) for cfg in seed_grid + first_search}
    tally = {"done": 0, "total": len(planned), "pending": set(planned), "ms_per_step": {}}
    for name in sorted(planned):
        path = out / "runs" / name / "metrics.json"
        metrics = read_json(path, METRICS_KIND) if path.exists() else {}
        if "ms_per_step" in metrics:                       # measured in an earlier session
            tally["ms_per_step"].setdefault(metrics["objective"], []).append(
                metrics["ms_per_step"])
    t0 = time.perf_counter()
    for cfg in seed_grid:
        run_one(out, cfg, emb, tally, progress)
    searches = {}
    metric = "mutual_knn" if emb else "paraphrase_R@1"
    for objective in protocol.objectives if protocol.lr_per_decade else ():
        def score_of(lr):  # None also for a run not yet scored against these embeddings
            run_dir = out / "runs" / run_name(run_config(protocol, objective, protocol.seeds[0], lr))
            return None if needs_evaluation(run_dir, emb) else selection_score(run_dir, metric)
        while (search := lr_search(protocol, score_of))["todo"] is not None:
            cfg = run_config(protocol, objective, protocol.seeds[0], search["todo"])
            if run_name(cfg) not in tally["pending"] and not train_finished(
                    out / "runs" / run_name(cfg)):
                tally["pending"].add(run_name(cfg))        # an extension of the grid
                tally["total"] += 1
            run_one(out, cfg, emb, tally, progress)
        searches[objective] = search
        print(f"[replicate] lr search {objective}: chosen {search['chosen']:.2e} "
              f"({'interior' if search['interior'] else 'ON THE EDGE'}) of "
              f"{', '.join(f'{lr:.2e}' for lr in search['lrs'])} on val {metric}", flush=True)
    print(f"[replicate] grid done in {(time.perf_counter() - t0) / 60:.1f} min this session",
          flush=True)
    return searches


def needs_evaluation(run_dir, emb):
    """Whether a finished run has not been scored against these image embeddings yet."""
    path = Path(run_dir) / "metrics.json"
    if emb is None or (Path(run_dir) / DIVERGED).exists() or not path.exists():
        return False
    scored = read_json(path, METRICS_KIND).get("image_alignment", {}).get("embeddings") or {}
    return scored.get("sha256") != emb["sha256"]


def train_finished(run_dir):
    """Whether a run directory holds a finished (or diverged) run."""
    path = Path(run_dir) / "metrics.json"
    return (Path(run_dir) / DIVERGED).exists() or (
        path.exists() and "final" in read_json(path, METRICS_KIND))


def missing_embeddings_message(path, captions):
    """Why replicate stops before training when the embeddings file is absent, and what to do."""
    command = evaluate.EXPORT_COMMAND.format(captions=captions, out=path)
    return (f"{path} does not exist, and image alignment (mutual-kNN, R@1) needs these frozen "
            f"DINOv2 image embeddings. Make them once with `make embeddings` (after `make "
            f"data`; COCO images + the [export] extra; see embeddings/README.md):\n"
            f"  {command}\nor, to train text-only now (hours of "
            f"training; the image columns then read 'pending'), say so explicitly: "
            f"`make replicate IMAGE_EVAL=off` / `--image-eval off`. The image numbers can be "
            f"filled in later without retraining: rerun this command with the embeddings "
            f"(finished runs are skipped, only evaluation runs), or `python -m minialign "
            f"evaluate --embeddings {path} --run DIR ...` and then `python -m minialign report "
            f"OUT`.")


def add_replicate_args(p):
    """The `replicate` sub-command's options. A value out of its range (flags.py) or a seed
    or objective given twice is argparse's one-line error, exit code 2, before anything is
    written."""
    d = train.TrainConfig()
    p.add_argument("--captions", required=True, help="COCO captions JSON")
    p.add_argument("--embeddings", default=evaluate.DEFAULT_EMBEDDINGS,
                   help="frozen DINOv2 image embeddings .npz (made by `python -m minialign export`)")
    p.add_argument("--image-eval", choices=("on", "off"), default="on",
                   help="off: train text-only when the embeddings do not exist yet")
    p.add_argument("--out", required=True, help="results directory, e.g. results/coco")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVE_ORDER), action=UniqueList,
                   choices=sorted(OBJECTIVES), help="objectives, in table order, each once")
    p.add_argument("--seeds", nargs="+", type=nonnegative_int, default=list(SEEDS),
                   action=UniqueList, help="seeds of the seed grid, each once, >= 0; the first "
                   "one also runs the lr search")
    p.add_argument("--steps", type=positive_int, default=d.steps, help="optimizer steps per run")
    p.add_argument("--batch-photos", type=int_at_least(2), default=d.batch_photos,
                   help="photos per step, two captions each, >= 2")
    p.add_argument("--lr", type=positive_float, default=d.lr,
                   help="the shared lr of the seed grid, > 0")
    p.add_argument("--warmup-steps", type=nonnegative_int, default=d.warmup_steps,
                   help="linear warm-up steps before the cosine decay")
    p.add_argument("--eval-every", type=positive_int, default=d.eval_every,
                   help="evaluation and checkpoint interval, in steps, >= 1")
    p.add_argument("--lr-search", choices=("on", "off"), default="on",
                   help="the per-objective lr search on the first seed")
    p.add_argument("--lr-min", type=positive_float, default=LR_MIN,
                   help="search grid's lowest lr, > 0")
    p.add_argument("--lr-max", type=positive_float, default=LR_MAX,
                   help="search grid's highest lr, > --lr-min")
    p.add_argument("--lr-per-decade", type=positive_int, default=LR_PER_DECADE,
                   help="search grid points per factor of 10, >= 1")
    p.add_argument("--max-extensions", type=nonnegative_int, default=MAX_EXTENSIONS,
                   help="grid points the search may add beyond an edge, >= 0")
    for name in ("d_model", "n_layers", "n_heads"):
        p.add_argument("--" + name.replace("_", "-"), type=positive_int,
                       default=getattr(d.model, name), help="model size, >= 1")


def protocol_from_args(args):
    """The Protocol of parsed add_replicate_args options. Raises ValueError for values that
    disagree with each other (d_model % n_heads, --lr-max <= --lr-min with the search on)."""
    check_heads_divide_width(args)
    base = train.TrainConfig(captions=args.captions, steps=args.steps, lr=args.lr,
                             batch_photos=args.batch_photos, warmup_steps=args.warmup_steps,
                             eval_every=args.eval_every,
                             model=ModelConfig(d_model=args.d_model, n_layers=args.n_layers,
                                               n_heads=args.n_heads))
    if args.lr_search == "on" and args.lr_max <= args.lr_min:
        raise ValueError(f"--lr-max {args.lr_max:g} must be greater than --lr-min "
                         f"{args.lr_min:g} (or pass --lr-search off)")
    return Protocol(base=base, objectives=args.objectives, seeds=args.seeds,
                    lr_min=args.lr_min, lr_max=args.lr_max,
                    lr_per_decade=args.lr_per_decade if args.lr_search == "on" else 0,
                    max_extensions=args.max_extensions)


def load_image_embeddings(args):
    """The embeddings to score against, None with --image-eval off; checked against the
    captions before any training. Raises FileNotFoundError (with what to do) when absent,
    ValueError (embeddings.check_split_coverage) when a val or test photo has no embedding."""
    if args.image_eval == "off":
        print("[replicate] image evaluation off: mutual-kNN and R@1 will read 'pending'",
              flush=True)
        return None
    if not Path(args.embeddings).is_file():
        raise FileNotFoundError(missing_embeddings_message(args.embeddings, args.captions))
    emb = load_embeddings(args.embeddings)
    image_ids = load_coco_captions(args.captions).image_ids                 # (P,)
    split = split_photos(image_ids, train.TrainConfig().split_seed)         # as train.prepare
    check_split_coverage(emb, args.captions, {name: image_ids[split[name]]
                                              for name in ("val", "test")})
    print("[replicate] " + describe_join(join_on_ids(image_ids, emb)[2]), flush=True)
    return emb


def run_replicate(args):
    """`python -m minialign replicate`: the grid, then results.md, results.json and figures.
    Every input (flags, captions, embeddings) is read and checked before --out is touched."""
    from . import report  # report reads what replicate writes (it imports this module)
    protocol = protocol_from_args(args)
    train.prepare(run_config(protocol, protocol.objectives[0], protocol.seeds[0]))
    emb = load_image_embeddings(args)
    t0 = time.perf_counter()
    replicate(protocol, args.out, emb)
    results = report.build_report(args.out)
    print(report.format_markdown(results).split("\n## ")[0])
    print(f"[replicate] {time.perf_counter() - t0:.0f} s this session; wrote "
          f"{Path(args.out) / 'results.md'}, results.json and {len(report.FIGURES)} figures",
          file=sys.stderr, flush=True)
    return results
