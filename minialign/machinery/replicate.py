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

import sys
import time
from pathlib import Path

import numpy as np

from .. import train
from .monitor import load_coco_captions, split_photos
from . import evaluate, report
from .embeddings import (check_split_coverage, describe_join, join_on_ids, load_embeddings,
                         sha256_file)
from .files import DirLock, atomic_write_json
from .machine import describe
from .protocol import (grid_lr, grid_points, lr_search, run_config, run_name, save_protocol,
                       selection_score)
from .rundir import Diverged, is_diverged, is_finished, read_metrics


# ---------------------------------------------------------------- running
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
    if is_finished(run_dir):
        print(f"[replicate] {run_dir.name}: finished earlier, skipped", flush=True)
    else:
        print(f"[replicate] run {tally['done'] + 1}/{tally['total']}: {run_dir.name} | "
              f"{eta_line(tally, cfg.steps)}", flush=True)
        try:
            metrics = train.train(cfg, run_dir, resume=True, progress=progress)
            tally["ms_per_step"].setdefault(cfg.objective, []).append(metrics["ms_per_step"])
        except Diverged as err:                    # train wrote diverged.json
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
        atomic_write_json(out / "environment.json", describe())
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
        metrics = read_metrics(out / "runs" / name)
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
            if run_name(cfg) not in tally["pending"] and not is_finished(
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
    if emb is None or is_diverged(run_dir):
        return False
    scored = read_metrics(run_dir).get("image_alignment", {}).get("embeddings") or {}
    return scored.get("sha256") != emb["sha256"]


def missing_embeddings_message(path, captions):
    """Why replicate stops before training when the embeddings file is absent, and what to do."""
    return (f"{path} does not exist, and image alignment (mutual-kNN, R@1) needs these frozen "
            f"DINOv2 image embeddings (`make embeddings`, after `make data`). "
            f"{evaluate.how_to_export(path, captions)} Or train text-only now, explicitly: "
            f"`make replicate IMAGE_EVAL=off` / `--image-eval off`; the image numbers are filled "
            f"in later without retraining (finished runs are skipped), or by `python -m minialign "
            f"evaluate --embeddings {path} --run DIR ...` and then `python -m minialign report OUT`.")


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


def run_replicate(protocol, args):
    """`python -m minialign replicate`: the grid, then results.md, results.json and figures.
    Every input (flags, captions, embeddings) is read and checked before --out is touched."""
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
