"""A replicate directory -> results.json, results.md and three PNG figures, from saved runs alone.

    python -m minialign report results/coco

Reads protocol.json, environment.json and runs/*/{config,metrics}.json as replicate wrote them
(metrics.json["image_alignment"] once `replicate` or `evaluate` scored a run against the image
embeddings) and rewrites, in the same directory:
    results.json        every number below, and each run's test metrics and val curve
    results.md          one row per objective: test mutual-kNN@10 and R@1 (mean +/- std over
                        seeds, per-seed values, the replication's published numbers beside
                        them), paraphrase R@1, the chance row, the lr-search rows; then the
                        per-seed good_views - next_token difference, the search, the machine
    fig_alignment.png   bars at the seed mean, a dot per seed, the chance line
    fig_curves.png      val metric against training step, seed mean with the seed range shaded
    fig_lr_search.png   the lr search: final val metric against lr (log axis), chosen lr ringed
Without image alignment the image columns read "pending" and the figures use the text-side
metric (paraphrase R@1), saying so in their titles. Same runs -> same bytes of results.md.
"""
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from . import replicate

# The replication's published test numbers (3 seeds, shared lr; and with a per-method lr search)
PUBLISHED = {"good_views": {"mutual_knn": 0.320, "R@1": 0.084, "mutual_knn_lr_search": 0.328},
             "bad_views": {"mutual_knn": 0.192, "R@1": 0.063, "mutual_knn_lr_search": 0.196},
             "next_token": {"mutual_knn": 0.148, "R@1": 0.057, "mutual_knn_lr_search": 0.168}}
IMAGE_KEYS = ("mutual_knn", "R@1", "R@5", "R@10")  # test metrics from image alignment
TEXT_KEY = "paraphrase_R@1"
LABELS = {"mutual_knn": "mutual-kNN@10", "R@1": "R@1, caption → image",
          TEXT_KEY: "paraphrase R@1 (text only)"}
FIGURES = ("fig_alignment.png", "fig_curves.png", "fig_lr_search.png")
FIG_SIZE = (1600, 900)                   # 16:9, a projector slide
COLOURS = {"good_views": (0, 114, 178), "bad_views": (230, 159, 0),   # Okabe & Ito 2008,
           "next_token": (0, 158, 115)}                               # colour-blind safe
GREY, INK = (150, 150, 150), (20, 20, 20)


# ---------------------------------------------------------------- numbers
def run_numbers(run_dir):
    """One run's saved numbers: {"name", "objective", "seed", "lr", "status" ("finished",
    "diverged", "unfinished"), "test": {paraphrase_R@1 [, mutual_knn, R@1, R@5, R@10]},
    "chance": same keys, "curve": {"step": [...], "paraphrase_R@1": [...] [, "mutual_knn"]}
    (val split, every evaluation), "wall_seconds"}."""
    run_dir = Path(run_dir)
    config = json.loads((run_dir / "config.json").read_text())["config"]
    path = run_dir / "metrics.json"
    metrics = json.loads(path.read_text()) if path.exists() else {}
    out = {"name": run_dir.name, "objective": config["objective"], "seed": config["seed"],
           "lr": config["lr"], "status": "unfinished", "test": {}, "chance": {}, "curve": {},
           "wall_seconds": metrics.get("wall_seconds", 0.0)}
    if (run_dir / replicate.DIVERGED).exists():
        out["status"] = "diverged"
    if "final" not in metrics or out["status"] == "diverged":
        return out
    final = metrics["final"]
    out.update(status="finished")
    out["test"][TEXT_KEY] = final["test"][TEXT_KEY]
    out["chance"][TEXT_KEY] = final["test"]["chance"]
    out["curve"] = {"step": [e["step"] for e in metrics["evals"]],
                    TEXT_KEY: [e["val"][TEXT_KEY] for e in metrics["evals"]]}
    alignment = metrics.get("image_alignment")
    if alignment:
        test = alignment["steps"][-1]["test"]
        out["test"].update({key: test[key]["mean"] for key in IMAGE_KEYS})
        out["embeddings_model"] = alignment["embeddings"]["model"]
        out["chance"].update({key: alignment["chance"]["test"][key] for key in IMAGE_KEYS})
        by_step = {e["step"]: e["val"]["mutual_knn"]["mean"] for e in alignment["steps"]}
        out["curve"]["mutual_knn"] = [by_step[s] for s in out["curve"]["step"]]
    return out


def mean_std(values):
    """{"mean", "std" (sample std, ddof 1; None for one value), "values"}; None if empty."""
    if not values:
        return None
    return {"mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)) if len(values) > 1 else None,
            "values": list(values)}


def collect(out):
    """Every number of the report, from the saved runs (see the module docstring)."""
    out = Path(out)
    protocol = replicate.load_protocol(out)
    env_path = out / "environment.json"
    runs = {d.name: run_numbers(d) for d in sorted((out / "runs").iterdir())
            if (d / "config.json").is_file()}
    finished = [r for r in runs.values() if r["status"] == "finished"]
    image = bool(finished) and all("mutual_knn" in r["test"] for r in finished)
    models = sorted({r["embeddings_model"] for r in finished if r.get("embeddings_model")})
    metric = "mutual_knn" if image else TEXT_KEY
    keys = (*IMAGE_KEYS, TEXT_KEY) if image else (TEXT_KEY,)

    def run(objective, seed, lr=None):
        return runs.get(replicate.run_name(replicate.run_config(protocol, objective, seed, lr)))

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
    searches = {}
    for obj in protocol.objectives if protocol.lr_per_decade else ():
        def score_of(lr):
            return replicate.selection_score(out / "runs" / replicate.run_name(
                replicate.run_config(protocol, obj, protocol.seeds[0], lr)), metric)
        search = replicate.lr_search(protocol, score_of)
        chosen = search["chosen"] and run(obj, protocol.seeds[0], search["chosen"])
        searches[obj] = {**search, "test": chosen["test"] if chosen else None,
                         "scores": [None if s is None else float(s) if math.isfinite(s)
                                    else "diverged" for s in search["scores"]]}
    return {"dataset": out.name, "protocol": json.loads((out / "protocol.json").read_text()),
            "environment": json.loads(env_path.read_text()) if env_path.exists() else None,
            "image": image, "metric": metric, "embeddings_models": models,
            "comparable": image and all("dinov2" in m.lower() and "synthetic" not in m.lower()
                                        for m in models),
            "evaluated_runs": sum("mutual_knn" in r["test"] for r in finished),
            "finished_runs": len(finished), "objectives": objectives, "seed_runs": seed_runs,
            "chance": finished[0]["chance"] if finished else {}, "published": PUBLISHED,
            "difference": {"metric": metric, "seeds": shared, "per_seed": diffs,
                           "good_views_higher": sum(d > 0 for d in diffs)},
            "lr_search": searches, "runs": runs,
            "wall_seconds": sum(r["wall_seconds"] for r in runs.values()),
            "figures": list(FIGURES)}


# ---------------------------------------------------------------- results.md
def fmt(x, sign=False):
    return "-" if x is None else f"{x:+.3f}" if sign else f"{x:.3f}"


def cell(summary, pending):
    """'mean +/- std' and 'v0, v1, v2' for a table row; 'pending' without image numbers."""
    if pending:
        return "pending", "pending"
    if summary is None:
        return "-", "-"
    spread = f" ± {summary['std']:.3f}" if summary["std"] is not None else " (1 seed)"
    return fmt(summary["mean"]) + spread, ", ".join(fmt(v) for v in summary["values"])


def format_markdown(results):
    """results.md: the table, the difference, the lr search, the machine (deterministic)."""
    p, image, chance = results["protocol"], results["image"], results["chance"]
    base, model = p["base"], p["base"]["model"]
    lines = [f"# Replication results: {results['dataset']}", "",
             f"{len(p['objectives'])} objectives x seeds {', '.join(map(str, p['seeds']))}: "
             f"{base['steps']} steps of {base['batch_photos']} photos (two captions each), "
             f"lr {base['lr']:g} for every objective, encoder D={model['d_model']} "
             f"L={model['n_layers']}; captions `{base['captions']}`. Test split; image metrics "
             f"are means over the 5 caption slots (R@1: caption -> image after an orthogonal "
             f"rotation fitted on the train photos); paraphrase R@1 is text-only. "
             f"mean ± sample std (ddof 1) over seeds.", "",
             "| objective | mutual-kNN@10 | per seed | published | R@1 | per seed | published "
             "| paraphrase R@1 |", "|---|---:|---|---:|---:|---|---:|---:|"]
    for obj, row in results["objectives"].items():
        pub = PUBLISHED.get(obj, {})
        mknn, r1 = cell(row.get("mutual_knn"), not image), cell(row.get("R@1"), not image)
        lines.append(f"| {obj} | {mknn[0]} | {mknn[1]} | {fmt(pub.get('mutual_knn'))} | "
                     f"{r1[0]} | {r1[1]} | {fmt(pub.get('R@1'))} | {cell(row[TEXT_KEY], 0)[0]} |")
    mknn, r1 = (fmt(chance.get("mutual_knn")), fmt(chance.get("R@1"))) if image else ("pending",) * 2
    lines.append(f"| chance | {mknn} | | | {r1} | | | {fmt(chance.get(TEXT_KEY))} |")
    for obj in results["objectives"]:                # the same rows with the search off
        search = results["lr_search"].get(obj, {"chosen": None, "test": None})
        test = search["test"] or {}
        name = (f"{obj}, lr search ({search['chosen']:.2e}, seed {p['seeds'][0]})"
                if search["chosen"] else f"{obj}, lr search (incomplete)"
                if obj in results["lr_search"] else f"{obj}, lr search (not run)")
        pub = fmt(PUBLISHED.get(obj, {}).get("mutual_knn_lr_search"))
        pend = "pending" if not image and search["chosen"] else None
        lines.append(f"| {name} | {pend or fmt(test.get('mutual_knn'))} | | {pub} | "
                     f"{pend or fmt(test.get('R@1'))} | | | {fmt(test.get(TEXT_KEY))} |")
    lines += [""] + difference_lines(results) + [""]
    if image and not results["comparable"]:
        lines += [f"The published numbers are the COCO replication's (DINOv2 image embeddings); "
                  f"these runs were scored against {', '.join(results['embeddings_models'])}: "
                  f"compare the ordering of the objectives, not the values.", ""]
    if not image:
        lines += [f"Image alignment pending: {results['evaluated_runs']} of "
                  f"{results['finished_runs']} finished runs have been scored against the image "
                  f"embeddings. Rerun `replicate` with the embeddings (finished runs are skipped) "
                  f"or run `python -m minialign evaluate --embeddings E --run DIR ...`, then "
                  f"`python -m minialign report` on this directory.", ""]
    lines += search_lines(results) + environment_lines(results)
    lines += ["", "## Figures", ""] + [f"![{f[4:-4]}]({f})" for f in FIGURES]
    return "\n".join(lines) + "\n"


def difference_lines(results):
    d = results["difference"]
    if not d["seeds"]:
        return ["good_views - next_token: no seed has both runs finished yet."]
    values = ", ".join(f"{fmt(v, sign=True)} (seed {s})" for s, v in zip(d["seeds"], d["per_seed"]))
    return [f"good_views - next_token, test {LABELS[d['metric']]} per seed: {values}; "
            f"good_views is higher on {d['good_views_higher']} of {len(d['seeds'])} seeds."]


def search_lines(results):
    if not results["lr_search"]:
        return []
    p = results["protocol"]
    lines = ["## Learning-rate search", "",
             f"Seed {p['seeds'][0]} per objective over lr {p['lr_min']:g} .. {p['lr_max']:g} "
             f"({p['lr_per_decade']} per decade), extended past an edge at most "
             f"{p['max_extensions']} times; selected on final val {LABELS[results['metric']]}; "
             f"test numbers at the chosen lr are in the table above.", "",
             "| objective | val score at each lr (chosen in bold) | chosen lr | interior |",
             "|---|---|---:|---|"]
    for obj, s in results["lr_search"].items():
        points = ", ".join(
            (f"**{lr:.2e}: {fmt(v) if not isinstance(v, str) else v}**" if lr == s["chosen"]
             else f"{lr:.2e}: {v if isinstance(v, str) else fmt(v)}")
            for lr, v in zip(s["lrs"], s["scores"]))
        where = ("yes" if s["interior"] else "no: on the edge after the allowed extensions"
                 ) if s["chosen"] else f"incomplete, next: {s['todo']:.2e}"
        lines.append(f"| {obj} | {points} | {fmt_lr(s['chosen'])} | {where} |")
    return lines + [""]


def fmt_lr(lr):
    return "-" if lr is None else f"{lr:.2e}"


def environment_lines(results):
    env, minutes = results["environment"] or {}, results["wall_seconds"] / 60
    threads = " ".join(f"{k}={v}" for k, v in sorted(env.get("thread_env", {}).items()))
    return ["## Environment", "",
            f"- numpy {env.get('numpy', '?')}, BLAS {env.get('blas', '?')}, "
            f"{env.get('cpus', '?')} CPUs ({env.get('cpu', '?')}), thread settings "
            f"{threads or 'none (the BLAS default)'}",
            f"- Python {env.get('python', '?')} on {env.get('platform', '?')}",
            f"- total wall time {minutes:.1f} min, summed over {len(results['runs'])} runs "
            f"(training and text-side evaluation; image scoring not included)"]


# ---------------------------------------------------------------- figures (Pillow)
def font(size):
    """DejaVu Sans at `size` px if installed, else Pillow's built-in scalable font."""
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        try:
            return ImageFont.load_default(size=size)
        except TypeError:                                   # Pillow < 10.1: fixed bitmap font
            return ImageFont.load_default()


def nice_ticks(lo, hi, n=5):
    """About n round tick values covering [lo, hi] (steps of 1, 2, 2.5 or 5 x 10^k)."""
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if raw <= step * m)
    return [round(t, 10) for t in np.arange(math.floor(lo / step) * step, hi + step / 2, step)]


def axes(draw, box, x_range, y_range, xlog=False):
    """A plotting frame: grid lines at y ticks, labelled. Returns data -> pixel mapper."""
    left, top, right, bottom = box
    ticks = nice_ticks(*y_range)
    y_lo, y_hi = ticks[0], ticks[-1]
    fx = (lambda x: math.log10(x)) if xlog else (lambda x: x)
    x_lo, x_hi = fx(x_range[0]), fx(x_range[1])

    def px(x, y):
        return (left + (fx(x) - x_lo) / (x_hi - x_lo or 1) * (right - left),
                bottom - (y - y_lo) / (y_hi - y_lo or 1) * (bottom - top))
    for t in ticks:
        y = px(x_range[0], t)[1]
        draw.line([(left, y), (right, y)], fill=(225, 225, 225), width=2)
        draw.text((left - 14, y), f"{t:g}", font=font(26), fill=INK, anchor="rm")
    draw.line([(left, top), (left, bottom), (right, bottom)], fill=INK, width=3)
    return px


def dashed(draw, a, b, width=3):
    """Dashed grey segment from pixel a to pixel b (horizontal or vertical)."""
    n = max(1, int(math.dist(a, b) // 24))
    for i in range(n):
        s, e = i / n, min(1.0, (i + 0.6) / n)
        draw.line([(a[0] + s * (b[0] - a[0]), a[1] + s * (b[1] - a[1])),
                   (a[0] + e * (b[0] - a[0]), a[1] + e * (b[1] - a[1]))], fill=GREY, width=width)


def hline(draw, px, x0, x1, y, label=None):
    """Dashed horizontal line (a chance level), labelled just above its left end."""
    a, b = px(x0, y), px(x1, y)
    dashed(draw, a, b)
    if label:
        draw.text((a[0] + 10, a[1] - 6), label, font=font(24), fill=(90, 90, 90), anchor="lb")


def dot(draw, xy, r, fill, outline=INK):
    draw.ellipse([xy[0] - r, xy[1] - r, xy[0] + r, xy[1] + r], fill=fill, outline=outline,
                 width=2)


def canvas(title):
    img = Image.new("RGB", FIG_SIZE, "white")
    draw = ImageDraw.Draw(img)
    draw.text((FIG_SIZE[0] // 2, 24), title, font=font(38), fill=INK, anchor="ma")
    return img, draw


def legend(draw, xy, entries):
    """entries: [(label, colour)], drawn as coloured squares in one row starting at xy."""
    x, y = xy
    for label, colour in entries:
        draw.rectangle([x, y - 13, x + 26, y + 13], fill=colour)
        draw.text((x + 36, y), label, font=font(28), fill=INK, anchor="lm")
        x += 36 + draw.textlength(label, font=font(28)) + 50


def fig_alignment(results, path):
    """(1) Test metrics per objective: bar at the seed mean, a dot per seed, chance line,
    the published value as a black bar."""
    metrics = ["mutual_knn", "R@1"] if results["image"] else [TEXT_KEY]
    title = ("Text-image alignment on the test photos" if results["image"] else
             "Text-side metric: paraphrase R@1 (image alignment pending)")
    img, draw = canvas(f"{title} — {results['dataset']}")
    objs = list(results["objectives"])
    width = (FIG_SIZE[0] - 160) // len(metrics)
    for i, key in enumerate(metrics):
        box = (120 + i * width, 140, 120 + (i + 1) * width - 100, 760)
        rows = [results["objectives"][o][key] for o in objs]
        top = max([v for r in rows if r for v in r["values"]] + [1e-3]
                  + [PUBLISHED.get(o, {}).get(key, 0) for o in objs if results["comparable"]])
        px = axes(draw, box, (-0.5, len(objs) - 0.5), (0, top * 1.15))
        chance = results["chance"].get(key)
        title = LABELS[key] + (f" (chance {chance:.3f})" if chance is not None else "")
        draw.text(((box[0] + box[2]) / 2, 100), title, font=font(30), fill=INK, anchor="ma")
        for j, (obj, row) in enumerate(zip(objs, rows)):
            x0, _ = px(j - 0.3, 0)
            x1, base = px(j + 0.3, 0)
            draw.text(((x0 + x1) / 2, box[3] + 16), obj, font=font(28), fill=INK, anchor="ma")
            if row is None:
                continue
            draw.rectangle([x0, px(j, row["mean"])[1], x1, base], fill=COLOURS.get(obj, GREY))
            label_y = px(j, max(row["values"] + [row["mean"]]))[1] - 16
            draw.text(((x0 + x1) / 2, label_y), fmt(row["mean"]), font=font(28), fill=INK,
                      anchor="mb")
            for s, v in enumerate(row["values"]):
                dot(draw, px(j + (s - (len(row["values"]) - 1) / 2) * 0.12, v), 9, "white")
            if results["comparable"] and key in PUBLISHED.get(obj, {}):
                y = px(j, PUBLISHED[obj][key])[1]
                draw.line([(x0 - 10, y), (x1 + 10, y)], fill=INK, width=5)
        if chance is not None:
            hline(draw, px, -0.5, len(objs) - 0.5, chance)
    key = "bar: mean over seeds    ○ one seed    - - - chance"
    if results["comparable"]:
        key += "    ▬ published (COCO replication)"
    draw.text((120, 850), key, font=font(28), fill=INK, anchor="lm")
    img.save(path)


def fig_curves(results, path):
    """(2) Val metric against training step: seed mean as a line, seed range (min..max) shaded."""
    metric = results["metric"]
    p = results["protocol"]
    what = LABELS[metric] if results["image"] else "paraphrase R@1 (text side; image pending)"
    img, draw = canvas(f"Val {what} during training — {results['dataset']}")
    curves = {}
    for obj, names in results["seed_runs"].items():
        runs = [results["runs"][name] for name in names]
        runs = [r for r in runs if metric in r["curve"]]
        if runs:
            n = min(len(r["curve"]["step"]) for r in runs)
            curves[obj] = (runs[0]["curve"]["step"][:n],
                           np.array([r["curve"][metric][:n] for r in runs]))   # (seeds, n)
    if not curves:
        img.save(path)
        return
    top = max(v.max() for _, v in curves.values()) * 1.15 or 1.0
    box = (140, 120, 1540, 760)
    px = axes(draw, box, (0, p["base"]["steps"]), (0, top))
    for t in nice_ticks(0, p["base"]["steps"], 6):
        draw.text((px(t, 0)[0], box[3] + 14), f"{t:g}", font=font(26), fill=INK, anchor="ma")
    draw.text(((box[0] + box[2]) / 2, box[3] + 52), "training step", font=font(28), fill=INK,
              anchor="ma")
    shade = Image.new("RGBA", FIG_SIZE, (0, 0, 0, 0))
    shade_draw = ImageDraw.Draw(shade)
    for obj, (steps, values) in curves.items():
        band = [px(s, v) for s, v in zip(steps, values.max(0))] + \
               [px(s, v) for s, v in reversed(list(zip(steps, values.min(0))))]
        if len(band) > 2:
            shade_draw.polygon(band, fill=COLOURS.get(obj, GREY) + (70,))
    img.paste(Image.alpha_composite(img.convert("RGBA"), shade).convert("RGB"))
    for obj, (steps, values) in curves.items():
        line = [px(s, v) for s, v in zip(steps, values.mean(0))]
        draw.line(line, fill=COLOURS.get(obj, GREY), width=6) if len(line) > 1 else None
        for xy in line:
            dot(draw, xy, 7, COLOURS.get(obj, GREY), outline=COLOURS.get(obj, GREY))
    if results["chance"].get(metric) is not None:
        hline(draw, px, 0, p["base"]["steps"], results["chance"][metric],
              f"chance {results['chance'][metric]:.3f}")
    legend(draw, (140, 860), [(o, COLOURS.get(o, GREY)) for o in curves])
    draw.text((1540, 860), "line: mean over seeds   shade: seed min..max", font=font(28),
              fill=INK, anchor="rm")
    img.save(path)


def fig_lr_search(results, path):
    """(3) The lr search: final val metric against lr on a log axis, the chosen lr ringed."""
    what = LABELS[results["metric"]] if results["image"] else "paraphrase R@1 (text side)"
    img, draw = canvas(f"Learning-rate search: final val {what} — {results['dataset']}")
    searches = results["lr_search"]
    lrs = [lr for s in searches.values() for lr in s["lrs"]]
    scores = [v for s in searches.values() for v in s["scores"] if isinstance(v, float)]
    if not lrs or not scores:
        draw.text((800, 450), "no learning-rate search in this protocol", font=font(32),
                  fill=INK, anchor="mm")
        img.save(path)
        return
    box = (140, 120, 1540, 760)
    lo, hi = min(lrs) / 10 ** 0.15, max(lrs) * 10 ** 0.15
    px = axes(draw, box, (lo, hi), (0, max(scores) * 1.15 or 1.0), xlog=True)
    for lr in sorted(set(lrs)):                              # a tick at every lr tried
        e = math.floor(math.log10(lr) + 1e-9)
        draw.text((px(lr, 0)[0], box[3] + 14), f"{round(lr / 10 ** e, 2):g}e{e}",
                  font=font(26), fill=INK, anchor="ma")
    draw.text(((box[0] + box[2]) / 2, box[3] + 52), "peak learning rate (log scale)",
              font=font(28), fill=INK, anchor="ma")
    shared = results["protocol"]["base"]["lr"]
    if lo <= shared <= hi:
        dashed(draw, px(shared, 0), (px(shared, 0)[0], box[1]))
        draw.text((px(shared, 0)[0] + 8, box[1]), "lr of the seed grid", font=font(24),
                  fill=(90, 90, 90), anchor="la")
    for obj, s in searches.items():
        colour = COLOURS.get(obj, GREY)
        points = [(lr, v) for lr, v in zip(s["lrs"], s["scores"]) if isinstance(v, float)]
        draw.line([px(lr, v) for lr, v in points], fill=colour, width=5)
        for lr, v in zip(s["lrs"], s["scores"]):
            if isinstance(v, float):
                dot(draw, px(lr, v), 9, colour, outline=colour)
            elif v == "diverged":
                x, y = px(lr, 0)
                draw.text((x, y - 4), "×", font=font(44), fill=colour, anchor="mb")
        if s["chosen"] is not None:
            x, y = px(s["chosen"], s["scores"][s["lrs"].index(s["chosen"])])
            draw.ellipse([x - 22, y - 22, x + 22, y + 22], outline=INK, width=4)
    legend(draw, (140, 860), [(o, COLOURS.get(o, GREY)) for o in searches])
    draw.text((1540, 860), "○ chosen   × diverged", font=font(28), fill=INK, anchor="rm")
    img.save(path)


def build_report(out):
    """Write results.json, results.md and FIGURES into `out`; returns the results dict."""
    out = Path(out)
    results = collect(out)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(format_markdown(results))
    for name, draw_figure in zip(FIGURES, (fig_alignment, fig_curves, fig_lr_search)):
        draw_figure(results, out / name)
    return results


def add_report_args(p):
    p.add_argument("results_dir", help="a directory written by `python -m minialign replicate`")


def run_report(args):
    """`python -m minialign report DIR`: rebuild the table and figures, print the table."""
    out = Path(args.results_dir)
    if not (out / "protocol.json").is_file():
        raise FileNotFoundError(f"{out}: no protocol.json; not a `replicate` results directory")
    results = build_report(out)
    print(format_markdown(results).split("\n## ")[0])
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and "
          f"{', '.join(str(out / f) for f in FIGURES)}")
    return results
