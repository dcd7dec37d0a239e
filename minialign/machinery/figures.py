"""The report's figures (Pillow, 1600 x 900, Okabe & Ito's colour-blind-safe colours) from a
results dict (report.collect): fig_alignment, fig_curves, fig_lr_search, fig_diagnose; a sweep's
fig_scaling."""
import io
import math

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .diagnose import MEASURES
from .runs import atomic_write

SIZE = (1600, 900)
COLOURS = {"good_views": (0, 114, 178), "bad_views": (230, 159, 0), "next_token": (0, 158, 115)}
OTHER = [(204, 121, 167), (86, 180, 233), (213, 94, 0), (240, 228, 66)]
GREY, INK, RED = (150, 150, 150), (20, 20, 20), (170, 40, 40)
LABELS = {"mutual_knn": "mutual-kNN@10", "R@1": "R@1, caption → image",
          "paraphrase_R@1": "paraphrase R@1"}                 # also results.md's columns


def colour(obj, objectives):
    return COLOURS.get(obj) or OTHER[list(objectives).index(obj) % 4]


def untrained(results, obj):
    """The untrained encoder's row (step 0 of the runs) that obj is trained from, or None."""
    return next((u for u in results["untrained"].values() if obj in u["objectives"]), None)


def font(size):
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default(size=size)


def ticks(lo, hi, n=5):
    """About n round values (steps of 1, 2, 2.5, 5 x 10^k) covering [lo, hi]; the last >= hi."""
    raw = (hi - lo) / n or 1.0
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if raw <= step * m)
    return [round(k * step, 10) for k in range(math.floor(lo / step + 1e-9),
                                               math.ceil(hi / step - 1e-9) + 1)]


def figure(results, title, objs, key):
    """A white image: "title — dataset" on top, objs' colours and what marks mean below."""
    draw = ImageDraw.Draw(img := Image.new("RGB", SIZE, "white"))
    draw.text((800, 20), f"{title} — {results['dataset']}", font=font(36), fill=INK, anchor="ma")
    x = 140
    for obj in objs:
        draw.rectangle([x, 848, x + 24, 872], fill=colour(obj, objs))
        draw.text((x + 34, 860), obj, font=font(26), fill=INK, anchor="lm")
        x += 80 + draw.textlength(obj, font=font(26))
    draw.text((1560, 860), key, font=font(24), fill=INK, anchor="rm")
    return img, draw


def axes(draw, box, xs, ys, xticks, xlabel="", xlog=False):
    """A frame, y grid lines labelled, x ticks [(value, label)]; returns data -> pixel."""
    left, top, right, bottom = box
    yt, f = ticks(*ys), (math.log10 if xlog else float)

    def px(x, y):
        return (left + (f(x) - f(xs[0])) / (f(xs[1]) - f(xs[0]) or 1) * (right - left),
                bottom - (y - yt[0]) / (yt[-1] - yt[0] or 1) * (bottom - top))
    for t in yt:
        draw.line([(left, px(xs[0], t)[1]), (right, px(xs[0], t)[1])], fill=(228,) * 3, width=2)
        draw.text((left - 12, px(xs[0], t)[1]), f"{t:g}", font=font(24), fill=INK, anchor="rm")
    for x, label in xticks:
        draw.text((px(x, 0)[0], bottom + 12), label, font=font(24), fill=INK, anchor="ma")
    draw.line([(left, top), (left, bottom), (right, bottom)], fill=INK, width=3)
    draw.text(((left + right) / 2, bottom + 50), xlabel, font=font(26), fill=INK, anchor="ma")
    return px


def dashed(draw, a, b, fill=GREY, width=3):
    a, b, n = np.array(a), np.array(b), max(1, int(math.dist(a, b) // 22))
    for i in range(n):
        draw.line([tuple(a + t * (b - a)) for t in (i / n, (i + 0.6) / n)], fill=fill, width=width)


def dot(draw, xy, r, fill, outline=INK):
    draw.ellipse([xy[0] - r, xy[1] - r, xy[0] + r, xy[1] + r], fill, outline, 2)


def labels_right(draw, px, xs, levels, ends=()):
    """Dashed lines at levels [(value or None, name, colour)], then all labels at the right."""
    labels = list(ends)                                      # (pixel y, text, colour)
    for y, name, fill in [level for level in levels if level[0] is not None]:
        dashed(draw, px(xs[0], y), px(xs[1], y), fill)
        labels.append((px(xs[1], y)[1], f"{name} {y:.3f}", INK if fill == GREY else fill))
    y_last = -math.inf
    for y, text, fill in sorted(labels):
        y_last = max(y, y_last + 26)
        draw.text((px(xs[1], 0)[0] + 10, y_last), text, font=font(22), fill=fill, anchor="lm")


def alignment(results):
    """Test metrics per objective: bars, seeds, untrained encoder, chance, ceiling, published; the
    axis spans the runs, a reference more than 1.5 times as high is written at the top (↑)."""
    keys = ["mutual_knn", "R@1"] if "mutual_knn" in results["metrics"] else ["paraphrase_R@1"]
    published, width = results["published"], (SIZE[0] - 120) // len(keys)
    title = "Test alignment with the images" if len(keys) == 2 else "Test paraphrase R@1"
    legend = "bar: mean over seeds   ○ one seed   ▬ ▬ untrained encoder   - - - chance"
    img, draw = figure(results, title, [], legend + "   ▬ published (COCO; ↑ off the axis)" * bool(
        published))
    objs = [o for o, row in results["objectives"].items() if row["seeds"]]
    for i, key in enumerate(keys):
        box, xs = (110 + i * width, 150, 110 + (i + 1) * width - 270, 760), (-0.5, len(objs) - 0.5)
        base = {o: float(np.mean(untrained(results, o)[key])) for o in objs
                if untrained(results, o)}
        top = max([v for o in objs for v in results["objectives"][o][key]] + [1e-3]
                  + [*base.values()] + [results["chance"].get(key, 0)])
        ceiling = results["ceiling"] if key == "mutual_knn" else None
        pub = {o: published[o][key] for o in objs if key in published.get(o, {})}
        top = max([top] + [v for v in [ceiling, *pub.values()] if v and v <= 1.5 * top])
        px = axes(draw, box, xs, (0, 1.15 * top), list(enumerate(objs)))
        draw.text(((box[0] + box[2]) / 2, 80), LABELS[key], font=font(30), fill=INK, anchor="ma")
        for j, obj in enumerate(objs):
            v = results["objectives"][obj][key]
            (x0, y0), (x1, _) = px(j - 0.3, 0), px(j + 0.3, 0)
            draw.rectangle([x0, px(j, float(np.mean(v)))[1], x1, y0], fill=colour(obj, objs))
            for s, value in enumerate(v):
                dot(draw, px(j + (s - (len(v) - 1) / 2) * 0.1, value), 8, "white")
            above = max(v)                   # the label: over the seeds, and over a line it would hit
            for line in sorted(x for x in (base.get(obj), pub.get(obj)) if x is not None):
                above = line if above <= line <= above + 0.08 * top else above
            draw.text(((x0 + x1) / 2, px(j, above)[1] - 14), f"{np.mean(v):.3f}", font=font(24),
                      fill=INK, anchor="mb")
            if obj in base:
                dashed(draw, px(j - 0.38, base[obj]), px(j + 0.38, base[obj]), INK, 5)
            if pub.get(obj, math.inf) <= 1.15 * top:
                draw.line([(x, px(j, pub[obj])[1]) for x in (x0 - 12, x1 + 12)], INK, 6)
            elif obj in pub:
                draw.text(((x0 + x1) / 2, box[1] - 6), f"↑ {pub[obj]:.3f}", font=font(22),
                          fill=INK, anchor="md")
        if ceiling and ceiling > 1.15 * top:                    # written, not on the axis
            draw.text((box[2], box[1] - 6), f"world ceiling {ceiling:.3f} ↑", font=font(22),
                      fill=RED, anchor="rd")
        labels_right(draw, px, xs, [(results["chance"].get(key), "chance", GREY), (
            ceiling if ceiling and ceiling <= 1.15 * top else None, "world ceiling", RED)])
    return img


def curves(results):
    """Val metric against step: the seed mean per objective, the seeds' range shaded."""
    metric, steps = results["metric"], results["protocol"]["base"]["steps"]
    lines = {o: (cs[0]["step"], np.array([c[metric] for c in cs]))
             for o, r in results["objectives"].items() if (cs := r["curves"])}
    img, draw = figure(results, f"Val {LABELS[metric]} during training", list(lines),
                       "line: seed mean   shade: seed min..max")
    top = max([float(v.max()) for _, v in lines.values()] + [1e-3])
    px = axes(draw, (140, 110, 1400, 760), (0, steps), (0, 1.1 * top),
              [(t, f"{t:g}") for t in ticks(0, steps, 6)], "training step")
    for obj, (x, v) in lines.items():                        # the seeds' range, see-through
        band = [px(s, y) for s, y in [*zip(x, v.max(0)), *zip(x[::-1], v.min(0)[::-1])]]
        ImageDraw.Draw(img, "RGBA").polygon(band, fill=colour(obj, lines) + (60,))
    ends = []
    for obj, (x, v) in lines.items():
        draw.line([px(s, y) for s, y in zip(x, v.mean(0))], fill=colour(obj, lines), width=5)
        ends.append((px(x[-1], v.mean(0)[-1])[1], f"{v.mean(0)[-1]:.3f}", colour(obj, lines)))
    labels_right(draw, px, (0, steps), [(results["chance"].get(metric), "chance", GREY), (
        (results.get("speed") or {}).get("level"), "halfway", GREY)], ends)
    return img


def lr_search(results):
    """Final val metric of the first seed against lr, each objective; the chosen lr ringed."""
    searches = results["lr_search"]
    img, draw = figure(results, f"Learning-rate search: final val {LABELS[results['metric']]}",
                       list(searches), "○ large: chosen   × diverged")
    lrs = sorted({lr for s in searches.values() for lr in s["lrs"]})
    top = max(v for s in searches.values() for v in s["scores"] if isinstance(v, float))
    box, shared = (140, 110, 1400, 760), results["protocol"]["base"]["lr"]
    px = axes(draw, box, (lrs[0] / 1.4, lrs[-1] * 1.4), (0, 1.15 * top),
              [(lr, f"{lr:.3g}") for lr in lrs], "peak learning rate (log scale)", xlog=True)
    dashed(draw, px(shared, 0), (px(shared, 0)[0], box[1]))
    draw.text((px(shared, 0)[0] + 8, box[1]), "the seed grid's lr", font=font(22), fill=INK)
    for j, (obj, s) in enumerate(searches.items()):
        shift, c = 10 ** (0.08 * (j - (len(searches) - 1) / 2)), colour(obj, searches)
        done = [px(lr * shift, v) for lr, v in zip(s["lrs"], s["scores"]) if isinstance(v, float)]
        draw.line(done, fill=c, width=4)
        for lr, v in zip(s["lrs"], s["scores"]):
            if v == "diverged":
                draw.text(px(lr * shift, 0), "×", font=font(40), fill=c, anchor="mb")
            elif v is not None:
                chosen = lr == s["chosen"]
                dot(draw, px(lr * shift, v), 18 if chosen else 9, "white" if chosen else c, c)
    return img


def scaling(results):
    """Test metric against parameters per objective (dots: seeds, line: means), the gap's trend."""
    metric, objs = results["metric"], results["protocol"]["objectives"]
    img, draw = figure(results, f"Test {LABELS[metric]} against encoder size", objs,
                       "● one seed   line: seed mean")
    sizes = [s for s in results["sizes"] if s["params"]]
    params = [s["params"] for s in sizes] or [1e3, 1e6]
    xs = (min(params) / 10 ** 0.2, max(params) * 10 ** 0.2)
    values = [v for s in sizes for o in objs for v in s["objectives"][o].get(metric, [])] + [
        results["chance"].get(metric, 0.0)]                 # the axis spans these, not from 0
    lo, hi = min(values), max(values + [min(values) + 1e-3])
    px = axes(draw, (140, 110, 1400, 720), xs, (lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo)),
              [(t, f"{t / 1e6:g}M" if t >= 1e6 else f"{t / 1e3:g}k") for t in
               (m * 10 ** e for e in range(2, 10) for m in (1, 2, 5)) if xs[0] <= t <= xs[1]],
              "parameters (log scale)", xlog=True)
    for j, obj in enumerate(objs):
        points = [(s["params"] * 10 ** (0.02 * (j - 1)), s["objectives"][obj][metric])
                  for s in sizes if s["objectives"][obj].get(metric)]   # side by side
        draw.line([px(p, float(np.mean(v))) for p, v in points], colour(obj, objs), 4)
        for p, v in points:
            for value in v:
                dot(draw, px(p, value), 8, colour(obj, objs))
    labels_right(draw, px, xs, [(results["chance"].get(metric), "chance", GREY)])
    t = results["trend"]
    draw.text((770, 805), "the good_views − next_token gap: " + t["verdict"] + (
        "" if t["slope"] is None else f" (slope {t['slope']:+.3f} ± {t['se']:.3f} per tenfold "
        f"parameters)"), font=font(26), fill=INK, anchor="ma")
    return img


def diagnose(results):
    """Per row of results["diagnose"], a bar per measure at the mean over seeds, a dot per seed."""
    rows = results["diagnose"]
    img, draw = figure(results, "Held-out R² of the test caption embeddings", MEASURES,
                       "bar: mean over seeds   ○ one seed")
    px = axes(draw, (140, 110, 1500, 760), (-0.5, len(rows) - 0.5), (0, 1),
              [(j, r["row"].replace(", ", "\n")) for j, r in enumerate(rows)])
    for j, r in enumerate(rows):
        for k, m in enumerate(MEASURES):
            x = j + 0.2 * (k - 1.5)
            draw.rectangle([px(x - 0.09, 0)[0], px(x, max(np.mean(r[m]), 0))[1],
                            px(x + 0.09, 0)[0], px(x, 0)[1]], fill=colour(m, MEASURES))
            for v in r[m]:
                dot(draw, px(x, max(v, 0)), 7, "white")
    return img


def draw(results, out):
    """Write the figures into `out` (the lr search's once it has a score); returns their names."""
    names = ["scaling"] if "sizes" in results else ["alignment", "curves"] + ["lr_search"] * any(
        isinstance(v, float) for s in results["lr_search"].values() for v in s["scores"]) + [
        "diagnose"] * bool(results.get("diagnose"))
    for name in names:
        globals()[name](results).save(buffer := io.BytesIO(), format="PNG")
        atomic_write(out / f"fig_{name}.png", buffer.getvalue())
    return [f"fig_{name}.png" for name in names]
