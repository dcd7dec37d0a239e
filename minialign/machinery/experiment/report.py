"""A replicate directory -> results.json, results.md and three PNG figures, from saved runs alone.

    python -m minialign report results/coco

Reads protocol.json, environment.json and runs/*/{config,metrics}.json as replicate wrote them
(metrics.json["image_alignment"] once `replicate` or `evaluate` scored a run against the image
embeddings) and rewrites, in the same directory:
    results.json        every number below, and each run's test metrics and val curve
    results.md          one row per objective: test mutual-kNN@10 and R@1 (mean +/- std over
                        seeds, per-seed values, the replication's published numbers beside
                        them), paraphrase R@1; the context rows: chance, the untrained encoder
                        and the synthetic world's ceiling (baselines.py, kept in
                        baselines.json); the lr-search rows; then the per-seed good_views -
                        next_token difference, "aligns faster", the search, the machine
    fig_*.png           three figures of the same numbers, drawn by figures.py
Without image alignment the image columns read "pending" and the figures use the text-side
metric (paraphrase R@1), saying so in their titles. Same runs -> same bytes of results.md.
A run's image scores are read only while they score the run as it is now (run/scores.py: stale
ones are scored again first by `report`, rescore.rescore_stale), and runs scored against two
embeddings files are refused in one line (rescore.check_one_file); results.md's text is
results_md.py's.
"""
import math
from pathlib import Path

from ..run.files import atomic_write_bytes, atomic_write_json, read_json
from .figures import fig_alignment, fig_curves, fig_lr_search
from .protocol import load_protocol, lr_search, run_config, run_name, selection_score
from ..run.rundir import is_diverged, read_metrics, read_run_config
from ..run.scores import current_alignment
from .baselines import load_baselines
from ..images.embeddings import model_label
from .rescore import check_one_file
# results_md's names, also as report.X (results.md's text was this module's before #28)
from .results_md import (FIGURES, IMAGE_KEYS, PUBLISHED, TEXT_KEY,  # noqa: F401
                         below_untrained_lines, cell, disagreement_lines, environment_lines, fmt,
                         format_markdown)
from .speed import mean_std, speed_summary


# ---------------------------------------------------------------- numbers
def run_numbers(run_dir):
    """One run's saved numbers: {"name", "objective", "seed", "lr", "status" ("finished",
    "diverged", "unfinished"), "test": {paraphrase_R@1 [, mutual_knn, R@1, R@5, R@10]},
    "chance": same keys, "curve": {"step": [...], "paraphrase_R@1": [...] [, "mutual_knn"]}
    (val split, every evaluation), "wall_seconds"}."""
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)                     # one-line errors naming the file
    metrics = read_metrics(run_dir)
    out = {"name": run_dir.name, "objective": config["objective"], "seed": config["seed"],
           "lr": config["lr"], "status": "unfinished", "test": {}, "chance": {}, "curve": {},
           "wall_seconds": metrics.get("wall_seconds", 0.0)}
    if is_diverged(run_dir):
        out["status"] = "diverged"
    if "final" not in metrics or out["status"] == "diverged":
        return out
    final = metrics["final"]
    out.update(status="finished")
    out["test"][TEXT_KEY] = final["test"][TEXT_KEY]
    out["chance"][TEXT_KEY] = final["test"]["chance"]
    out["curve"] = {"step": [e["step"] for e in metrics["evals"]],
                    TEXT_KEY: [e["val"][TEXT_KEY] for e in metrics["evals"]]}
    alignment = current_alignment(run_dir, metrics)      # stale scores are never read
    if alignment and "test" in alignment["steps"][-1]:
        test = alignment["steps"][-1]["test"]
        out["test"].update({key: test[key]["mean"] for key in IMAGE_KEYS})
        out["embeddings_model"] = model_label(alignment["embeddings"]["model"],
                                              alignment["embeddings"].get("revision"))
        out["embeddings_file"] = {k: alignment["embeddings"][k] for k in ("path", "sha256")}
        out["chance"].update({key: alignment["chance"]["test"][key] for key in IMAGE_KEYS})
        by_step = {e["step"]: e["val"]["mutual_knn"]["mean"] for e in alignment["steps"]}
        out["curve"]["mutual_knn"] = [by_step[s] for s in out["curve"]["step"]]
    return out


def pick_margin(search, seed_scores):
    """Is the search's pick resolved? {"margin": the chosen lr's score minus the best other
    finite one, "val_spread": the sample std (ddof 1) of the same score over the seed grid's
    runs at the shared lr}; None where there is no pick, no other score or fewer than two
    seeds. results_md.noise_margin turns the spread into the noise a margin must beat
    (two standard errors of a difference of two one-seed scores, 2 sqrt(2) x spread)."""
    scores = [s for lr, s in zip(search["lrs"], search["scores"])
              if lr != search["chosen"] and s is not None and math.isfinite(s)]
    best = dict(zip(search["lrs"], search["scores"])).get(search["chosen"])
    seeds = mean_std([s for s in seed_scores if s is not None and math.isfinite(s)])
    ok = scores and best is not None and not isinstance(best, str) and math.isfinite(best)
    return {"margin": float(best - max(scores)) if ok else None,
            "val_spread": seeds and seeds["std"]}


def collect(out):
    """Every number of the report, from the saved runs (see the module docstring)."""
    out = Path(out)
    protocol = load_protocol(out)
    env_path = out / "environment.json"
    runs = {d.name: run_numbers(d) for d in sorted((out / "runs").iterdir())
            if (d / "config.json").is_file()}
    finished = [r for r in runs.values() if r["status"] == "finished"]
    check_one_file(out, finished)             # one table, one embeddings file (rescore.py)
    image = bool(finished) and all("mutual_knn" in r["test"] for r in finished)
    models = sorted({r["embeddings_model"] for r in finished if r.get("embeddings_model")})
    metric = "mutual_knn" if image else TEXT_KEY
    keys = (*IMAGE_KEYS, TEXT_KEY) if image else (TEXT_KEY,)

    def run(objective, seed, lr=None):
        return runs.get(run_name(run_config(protocol, objective, seed, lr)))

    objectives, seed_runs = {}, {}
    for obj in protocol.objectives:
        done = [r for r in (run(obj, s) for s in protocol.seeds)
                if r and r["status"] == "finished"]
        seed_runs[obj] = [r["name"] for r in done]
        objectives[obj] = {"seeds": [r["seed"] for r in done],
                           **{key: mean_std([r["test"][key] for r in done]) for key in keys}}
    by_seed = {obj: {r["seed"]: r["test"][metric] for r in (run(obj, s) for s in protocol.seeds)
                     if r and r["status"] == "finished"} for obj in ("good_views", "next_token")}
    shared = sorted(set(by_seed["good_views"]) & set(by_seed["next_token"]))
    diffs = [by_seed["good_views"][s] - by_seed["next_token"][s] for s in shared]
    context = load_baselines(out, protocol, finished[0].get("embeddings_file") if image else None)
    untrained = {kind: {"objectives": u["objectives"], "seeds": u["seeds"],
                        **{key: mean_std([t[key] for t in u["test"] if key in t]) for key in keys}}
                 for kind, u in (context["untrained"] or {}).items()}
    searches = {}
    for obj in protocol.objectives if protocol.lr_per_decade else ():
        def score_of(lr):
            return selection_score(out / "runs" / run_name(
                run_config(protocol, obj, protocol.seeds[0], lr)), metric)
        search = lr_search(protocol, score_of)
        chosen = search["chosen"] and run(obj, protocol.seeds[0], search["chosen"])
        searches[obj] = {**search, "test": chosen["test"] if chosen else None,
                         "scores": [None if s is None else float(s) if math.isfinite(s)
                                    else "diverged" for s in search["scores"]],
                         **pick_margin(search, [selection_score(out / "runs" / run_name(
                             run_config(protocol, obj, s)), metric) for s in protocol.seeds])}
    return {"dataset": out.name,
            "protocol": read_json(out / "protocol.json", "replicate protocol (protocol.json)"),
            "environment": read_json(env_path, "machine description (environment.json)")
            if env_path.exists() else None,
            "image": image, "metric": metric, "embeddings_models": models,
            "comparable": image and all("dinov2" in m.lower() and "synthetic" not in m.lower()
                                        for m in models),
            "evaluated_runs": sum("mutual_knn" in r["test"] for r in finished),
            "finished_runs": len(finished), "objectives": objectives, "seed_runs": seed_runs,
            "chance": finished[0]["chance"] if finished else {}, "published": PUBLISHED,
            "untrained": untrained, "ceiling": context["ceiling"], "world": context.get("world"),
            "difference": {"metric": metric, "seeds": shared, "per_seed": diffs,
                           "good_views_higher": sum(d > 0 for d in diffs)},
            "lr_search": searches, "runs": runs, "speed": speed_summary(runs, seed_runs, metric),
            "wall_seconds": sum(r["wall_seconds"] for r in runs.values()),
            "figures": list(FIGURES)}


def build_report(out):
    """Write results.json, results.md and FIGURES into `out`; returns the results dict."""
    out = Path(out)
    results = collect(out)
    atomic_write_json(out / "results.json", results)
    atomic_write_bytes(out / "results.md", format_markdown(results).encode())
    for name, draw_figure in zip(FIGURES, (fig_alignment, fig_curves, fig_lr_search)):
        draw_figure(results, out / name)
    return results


MAKE_TARGETS = {"results/coco": "replicate", "results/coco-quick": "replicate-quick",
                "results/synthetic": "demo"}      # the Makefile's RESULTS, QUICK and DEMO


def not_results_dir(out):
    """Why `out` is not a replicate results directory, on one line: absent (and the command
    that makes it: the Makefile's target for its directories, else replicate --out) or
    without protocol.json (a `train` run's directory: the evaluate command that reads it)."""
    if out.is_dir():
        run = (out / "config.json").is_file()                  # one `train` run's directory
        read = f": one run is read by `python -m minialign evaluate --run {out}`" if run else ""
        return f"{out}: no protocol.json; not a `replicate` results directory{read}"
    name = out.as_posix().removesuffix("-sigreg")
    sigreg = " ANTICOLLAPSE=sigreg" if name != out.as_posix() else ""
    how = (f"make {MAKE_TARGETS[name]}{sigreg}" if name in MAKE_TARGETS
           else f"python -m minialign replicate ... --out {out}")
    return f"{out}: no such directory; make it first with `{how}`"


def run_report(out):
    """`python -m minialign report DIR`: rebuild the table and figures, print the table."""
    if not (out / "protocol.json").is_file():
        raise FileNotFoundError(not_results_dir(out))
    results = build_report(out)
    print(format_markdown(results).split("\n## ")[0])
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and "
          f"{', '.join(str(out / f) for f in FIGURES)}")
    return results
