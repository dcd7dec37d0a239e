"""A scaling sweep's directory -> results.json, results.md and fig_scaling.png, from saved runs.

    python -m minialign report results/coco-scaling

Reads protocol.json (kind "scaling") and each run as report.run_numbers does, and writes:
    results.json      per size (D, L, H, parameters) each objective's test metrics over seeds,
                      the good_views - next_token gap, the trend (scaling.gap_trend), every run
    results.md        one row per size: each objective's test mutual-kNN@10 ("pending" until
                      the runs are scored against image embeddings) and paraphrase R@1 as
                      mean +/- std over seeds, the gap; then the trend sentence, computed
    fig_scaling.png   left: each objective's metric against parameters (log axis), a dot per
                      seed and a line through the means; right: the gap against parameters,
                      a dot per seed, the seeds' min..max, a line through the means
The metric of the gap, the trend and the figure is mutual_knn once every finished run has been
scored against the image embeddings, else the text-side paraphrase_R@1 (and results.md says so).
Parameters: scaling.count_params at the vocabulary the runs built. Same runs -> same bytes.
"""
import math
from pathlib import Path

from .figures import COLOURS, GREY, INK, LABELS, axes, canvas, dot, font, hline, legend, save_png
from .baselines import load_baselines
from ..run.files import atomic_write_bytes, atomic_write_json, read_json
from .protocol import load_protocol, run_config, run_name
from .report import TEXT_KEY, cell, environment_lines, fmt, mean_std, run_numbers
from .rescore import check_one_file
from ..run.rundir import read_run_config
from .scaling import count_params, gap_trend, signed, size_config, trend_sentence

FIGURE = "fig_scaling.png"
IMAGE_KEY = "mutual_knn"
GAP = ("good_views", "next_token")        # the gap: first minus second, per seed
UNTRAINED = ("bidirectional", "causal")   # baselines.ATTENTION's names, in table order


# ---------------------------------------------------------------- numbers
def vocab_size(out):
    """V of the sweep's runs (every run builds the same vocabulary from the same captions):
    from the first run's config.json, None before any run has started."""
    for run_dir in sorted((Path(out) / "runs").glob("*/config.json")):
        return read_run_config(run_dir.parent)["model"]["vocab_size"]
    return None


def collect(out):
    """Every number of the sweep's report (module docstring), from the saved runs."""
    out = Path(out)
    protocol = load_protocol(out)
    if protocol.kind != "scaling":
        raise ValueError(f"{out}/protocol.json: a {protocol.kind} protocol, not a scaling sweep")
    V = vocab_size(out)
    runs = {}
    for size in protocol.sizes:
        for obj in protocol.objectives:
            for seed in protocol.seeds:
                run_dir = out / "runs" / run_name(run_config(protocol, obj, seed, size=size))
                if (run_dir / "config.json").is_file():
                    runs[run_dir.name] = {**run_numbers(run_dir), "size": list(size)}
    finished = [r for r in runs.values() if r["status"] == "finished"]
    check_one_file(out, finished)             # one table, one embeddings file (rescore.py)
    image = bool(finished) and all(IMAGE_KEY in r["test"] for r in finished)
    metric = IMAGE_KEY if image else TEXT_KEY
    embeddings = finished[0].get("embeddings_file") if image else None
    sizes, points = [], []
    for size in protocol.sizes:
        cfg = size_config(*size, V or protocol.base.model.vocab_size, protocol.base.model.max_len)
        done = {obj: {r["seed"]: r for r in finished if r["objective"] == obj
                      and r["size"] == list(size)} for obj in protocol.objectives}
        untrained = load_baselines(out, protocol, embeddings, size)["untrained"] or {}
        row = {"d_model": size[0], "n_layers": size[1], "n_heads": cfg.n_heads,
               "params": count_params(cfg) if V else None, "objectives": {},
               "untrained": {kind: {key: mean_std([t[key] for t in u["test"] if key in t])
                                    for key in (IMAGE_KEY, TEXT_KEY)}
                             for kind, u in untrained.items()}}
        for obj, by_seed in done.items():
            row["objectives"][obj] = {"seeds": sorted(by_seed), **{
                key: mean_std([by_seed[s]["test"][key] for s in sorted(by_seed)])
                for key in ((IMAGE_KEY, TEXT_KEY) if image else (TEXT_KEY,))}}
        both = sorted(set(done.get(GAP[0], {})) & set(done.get(GAP[1], {})))
        gaps = [done[GAP[0]][s]["test"][metric] - done[GAP[1]][s]["test"][metric] for s in both]
        row["gap"] = {"seeds": both, "per_seed": gaps, "summary": mean_std(gaps)}
        points += [(row["params"], g) for g in gaps]
        sizes.append(row)
    trend = gap_trend(points)
    env_path = out / "environment.json"
    return {"kind": "scaling", "dataset": out.name,
            "protocol": read_json(out / "protocol.json", "sweep protocol (protocol.json)"),
            "environment": read_json(env_path, "machine description (environment.json)")
            if env_path.exists() else None,
            "image": image, "metric": metric, "vocab_size": V,
            "planned_runs": len(protocol.sizes) * len(protocol.objectives) * len(protocol.seeds),
            "finished_runs": len(finished),
            "evaluated_runs": sum(IMAGE_KEY in r["test"] for r in finished),
            "chance": finished[0]["chance"] if finished else {},
            "sizes": sizes, "trend": trend,
            "trend_sentence": trend_sentence(trend, f"test {LABELS[metric]}"),
            "runs": runs, "wall_seconds": sum(r["wall_seconds"] for r in runs.values()),
            "figures": [FIGURE]}


# ---------------------------------------------------------------- results.md
def params_text(n):
    """A parameter count for people: 41.2k, 4.66M; '?' before any run has started."""
    if n is None:
        return "?"
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def format_markdown(results):
    """results.md: the table per size, the trend sentence, the machine (deterministic)."""
    p, image, metric = results["protocol"], results["image"], results["metric"]
    base, objs = p["base"], p["objectives"]
    lines = [f"# Scaling sweep: {results['dataset']}", "",
             f"{len(objs)} objectives x seeds {', '.join(map(str, p['seeds']))} x "
             f"{len(p['sizes'])} encoder sizes (H = max(1, D / 64) heads, MLP 4 D, "
             f"vocabulary {results['vocab_size'] or '?'}): {base['steps']} steps of "
             f"{base['batch_photos']} photos (two captions each), lr {base['lr']:g} for every "
             f"run; captions `{base['captions']}`. Test split; mean ± sample std (ddof 1) over "
             f"seeds; {results['finished_runs']} of {results['planned_runs']} runs finished. "
             f"Gap = good_views − next_token in test {LABELS[metric]}, per seed.", "",
             "| D | L | H | params | " + " | ".join(f"{o} mutual-kNN@10" for o in objs) + " | "
             + "untrained mutual-kNN@10, " + " / ".join(UNTRAINED) + " | "
             + " | ".join(f"{o} paraphrase R@1" for o in objs) + " | gap |",
             "|" + "---:|" * (6 + 2 * len(objs))]
    for row in results["sizes"]:
        cells = [str(row["d_model"]), str(row["n_layers"]), str(row["n_heads"]),
                 params_text(row["params"])]
        cells += [cell(row["objectives"][o].get(IMAGE_KEY), not image)[0] for o in objs]
        cells.append(" / ".join(cell(row["untrained"].get(kind, {}).get(IMAGE_KEY), False)[0]
                                for kind in UNTRAINED) if image else "pending")
        cells += [cell(row["objectives"][o][TEXT_KEY], False)[0] for o in objs]
        gap = row["gap"]["summary"]
        cells.append("-" if gap is None else fmt(gap["mean"], sign=True)
                     + (f" ± {gap['std']:.3f}" if gap["std"] is not None else " (1 seed)"))
        lines.append("| " + " | ".join(cells) + " |")
    chance = results["chance"]
    lines.append("| chance | | | | " + " | ".join(
        [fmt(chance.get(IMAGE_KEY)) if image else "pending"] * len(objs) + [""]
        + [fmt(chance.get(TEXT_KEY))] * len(objs)) + " | |")
    lines += ["", results["trend_sentence"], "",
              "Untrained: each seed's encoder of that size at initialisation (the weights its runs "
              "start from), scored like the runs (baselines.py), with bidirectional / causal "
              "attention: what the architecture gives before any training. A gain is the "
              "distance above it, not above chance.", ""]
    if not image:
        lines += [f"Image alignment pending: {results['evaluated_runs']} of "
                  f"{results['finished_runs']} finished runs have been scored against the image "
                  f"embeddings, so the gap and its trend use paraphrase R@1. Rerun `scaling` "
                  f"with --embeddings (finished runs are only scored, not retrained), then "
                  f"`python -m minialign report` on this directory.", ""]
    lines += environment_lines(results)
    lines += ["", "## Figure", "", f"![scaling]({FIGURE})"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- fig_scaling.png
def x_ticks(lo, hi):
    """Parameter counts at 1, 2, 5 x 10^k inside [lo, hi]: the log axis' tick marks."""
    return [m * 10 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
            for m in (1, 2, 5) if lo <= m * 10 ** e <= hi]


def panel(draw, box, x_range, values, title, zero=False):
    """One panel's frame on a log x axis: ticks, title; returns the data -> pixel mapper."""
    lo, hi = min(values + [0.0]), max(values + [0.0])
    pad = 0.15 * (hi - lo) or 0.01
    px = axes(draw, box, x_range, (lo - pad if lo < 0 else 0.0, hi + pad), xlog=True)
    for t in x_ticks(*x_range):
        label = f"{t / 1e6:g}M" if t >= 1e6 else f"{t / 1e3:g}k"
        draw.text((px(t, 0)[0], box[3] + 14), label, font=font(24), fill=INK, anchor="ma")
    draw.text(((box[0] + box[2]) / 2, box[3] + 50), "parameters (log scale)", font=font(26),
              fill=INK, anchor="ma")
    draw.text(((box[0] + box[2]) / 2, box[1] - 40), title, font=font(28), fill=INK, anchor="ma")
    if zero:
        hline(draw, px, *x_range, 0.0)
    return px


def fig_scaling(results, path):
    """Each objective's test metric, and the good - next-token gap, against parameters."""
    metric = results["metric"]
    img, draw = canvas(f"Alignment against encoder size — {results['dataset']}")
    sizes = [s for s in results["sizes"] if s["params"] is not None]
    key = IMAGE_KEY if results["image"] else TEXT_KEY
    series = {obj: [(s["params"], s["objectives"][obj][key]) for s in sizes
                    if s["objectives"][obj].get(key)]
              for obj in results["protocol"]["objectives"]}
    if not any(series.values()):
        draw.text((800, 450), "no finished runs yet", font=font(32), fill=INK, anchor="mm")
        save_png(img, path)
        return
    params = [s["params"] for s in sizes]
    x_range = (min(params) / 10 ** 0.2, max(params) * 10 ** 0.2)
    what = LABELS[metric] + ("" if results["image"] else " (image pending)")
    px = panel(draw, (130, 170, 760, 730), x_range,
               [v for pts in series.values() for _, row in pts for v in row["values"]]
               + [u[key]["mean"] for s in sizes for u in s["untrained"].values() if u.get(key)],
               f"test {what}")
    for j, (obj, pts) in enumerate(series.items()):
        colour = COLOURS.get(obj, GREY)
        shift = 10 ** (0.025 * (j - 1))                 # objectives side by side at one size
        if len(pts) > 1:
            draw.line([px(p * shift, row["mean"]) for p, row in pts], fill=colour, width=5)
        for p, row in pts:
            for v in row["values"]:
                dot(draw, px(p * shift, v), 8, colour)
    if results["chance"].get(metric) is not None:
        hline(draw, px, *x_range, results["chance"][metric],
              f"chance {results['chance'][metric]:.3f}")
    base = [(s["params"], s["untrained"]["bidirectional"][key]["mean"]) for s in sizes
            if (s["untrained"].get("bidirectional") or {}).get(key)]
    if len(base) > 1:                                   # the untrained encoder, dashed
        line = [px(p, v) for p, v in base]
        for a, b in zip(line, line[1:]):
            for t in range(0, 10, 2):
                draw.line([(a[0] + (b[0] - a[0]) * t / 10, a[1] + (b[1] - a[1]) * t / 10),
                           (a[0] + (b[0] - a[0]) * (t + 1) / 10,
                            a[1] + (b[1] - a[1]) * (t + 1) / 10)], fill=GREY, width=4)
        draw.text((line[-1][0] + 8, line[-1][1]), "untrained", font=font(22), fill=GREY,
                  anchor="lm")
    gaps = [(s["params"], s["gap"]) for s in sizes if s["gap"]["per_seed"]]
    px = panel(draw, (930, 170, 1540, 730), x_range,
               [g for _, gap in gaps for g in gap["per_seed"]],
               "gap: good_views − next_token, per seed", zero=True)
    for p, gap in gaps:                                  # the seeds' spread, then the seeds
        draw.line([px(p, min(gap["per_seed"])), px(p, max(gap["per_seed"]))], fill=GREY, width=4)
        for g in gap["per_seed"]:
            dot(draw, px(p, g), 8, "white")
    if len(gaps) > 1:
        draw.line([px(p, gap["summary"]["mean"]) for p, gap in gaps], fill=INK, width=4)
    t = results["trend"]
    verdict = (f"slope {signed(t['slope'], 3)} ± {t['se']:.3f} per tenfold parameters: "
               f"{t['verdict']}"
               if t["slope"] is not None else t["verdict"])
    draw.text((1235, 812), verdict, font=font(26), fill=INK, anchor="ma")
    legend(draw, (130, 860), [(o, COLOURS.get(o, GREY)) for o in series])
    draw.text((1540, 860), "● one seed   line: mean over seeds   | seeds' range", font=font(26),
              fill=INK, anchor="rm")
    save_png(img, path)


# ---------------------------------------------------------------- writing
def build_report(out):
    """Write results.json, results.md and fig_scaling.png into `out`; returns the results."""
    out = Path(out)
    results = collect(out)
    atomic_write_json(out / "results.json", results)
    atomic_write_bytes(out / "results.md", format_markdown(results).encode())
    fig_scaling(results, out / FIGURE)
    return results


def run_report(out):
    """`python -m minialign report DIR` on a sweep: rebuild, print the table and the trend."""
    results = build_report(out)
    print(format_markdown(results).split("\n## ")[0])
    print(f"wrote {Path(out) / 'results.md'}, {Path(out) / 'results.json'} and "
          f"{Path(out) / FIGURE}")
    return results
