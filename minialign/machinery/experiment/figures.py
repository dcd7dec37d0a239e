"""The report's three figures, drawn with Pillow from the results dict (report.collect).

    fig_alignment.png   test metrics per objective: bar at the seed mean, a dot per seed, the
                        chance line, the untrained encoder's level across each bar, the
                        synthetic world's ceiling, the published value as a black bar
                        (comparable runs only)
    fig_curves.png      val metric against training step, seed mean with the seed range shaded;
                        next_token's final value dashed, and on it a marker at the mean step
                        where each other objective first reaches it ("aligns faster")
    fig_lr_search.png   the lr search: final val metric against lr (log axis), chosen lr ringed
Each figure reads only `results` (its "published", "chance", "metric", "runs", "lr_search", ...),
so this module imports nothing from the rest of minialign but its atomic file writer.
"""
import math

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ..run.files import atomic_write

LABELS = {"mutual_knn": "mutual-kNN@10", "R@1": "R@1, caption → image",   # titles here and
          "paraphrase_R@1": "paraphrase R@1 (text only)"}                  # in results.md
FIG_SIZE = (1600, 900)                   # 16:9, a projector slide
COLOURS = {"good_views": (0, 114, 178), "bad_views": (230, 159, 0),   # Okabe & Ito 2008,
           "next_token": (0, 158, 115)}                               # colour-blind safe
GREY, INK = (150, 150, 150), (20, 20, 20)
CEILING = (170, 40, 40)                  # the world's ceiling line


def untrained_level(results, objective, key):
    """The seed mean of the untrained encoder `objective` starts from (its attention), or None."""
    row = next((u for u in results.get("untrained", {}).values()
                if objective in u["objectives"]), None)
    return row[key]["mean"] if row and row.get(key) else None


# ---------------------------------------------------------------- drawing helpers
def save_png(img, path):
    """Write a Pillow image as PNG, atomically (files.atomic_write)."""
    with atomic_write(path) as f:
        img.save(f, format="PNG")


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
    """About n round tick values covering [lo, hi] (steps of 1, 2, 2.5 or 5 x 10^k): the
    last is >= hi, so a value up to hi is drawn inside the frame, never on or above it."""
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if raw <= step * m)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 10) for k in range(first, last + 1)]


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


def dashed(draw, a, b, width=3, fill=GREY):
    """Dashed segment from pixel a to pixel b (horizontal or vertical), grey by default."""
    n = max(1, int(math.dist(a, b) // 24))
    for i in range(n):
        s, e = i / n, min(1.0, (i + 0.6) / n)
        draw.line([(a[0] + s * (b[0] - a[0]), a[1] + s * (b[1] - a[1])),
                   (a[0] + e * (b[0] - a[0]), a[1] + e * (b[1] - a[1]))], fill=fill, width=width)


def hline(draw, px, x0, x1, y, label=None, fill=GREY, where="lb"):
    """Dashed horizontal line (a chance level), labelled at its left end: just above it
    (where="lb"), just below it ("lt"), above its right end ("rb"), or past its right end,
    outside the frame, where no marker is ("out")."""
    a, b = px(x0, y), px(x1, y)
    dashed(draw, a, b, fill=fill)
    if label and where == "out":
        draw.text((b[0] + 8, b[1]), label, font=font(24), fill=(90, 90, 90), anchor="lm")
    elif label:
        x = b[0] - 10 if where[0] == "r" else a[0] + 10
        draw.text((x, a[1] + (6 if where[1] == "t" else -6)), label, font=font(24),
                  fill=fill if fill != GREY else (90, 90, 90), anchor=where)


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


# ---------------------------------------------------------------- the three figures
def fig_alignment(results, path):
    """(1) Test metrics per objective: bar at the seed mean, a dot per seed, chance line,
    the published value as a black bar."""
    metrics = ["mutual_knn", "R@1"] if results["image"] else [results["metric"]]
    title = ("Text-image alignment on the test photos" if results["image"] else
             "Text-side metric: paraphrase R@1 (image alignment pending)")
    img, draw = canvas(f"{title} — {results['dataset']}")
    objs, published = list(results["objectives"]), results["published"]
    width = (FIG_SIZE[0] - 160) // len(metrics)
    for i, key in enumerate(metrics):
        box = (120 + i * width, 140, 120 + (i + 1) * width - 210, 760)  # room: chance label
        rows = [results["objectives"][o][key] for o in objs]
        ceiling = results.get("ceiling") if key == "mutual_knn" else None
        untrained = [untrained_level(results, o, key) for o in objs]
        top = max([v for r in rows if r for v in r["values"]] + [1e-3, ceiling or 0]
                  + [u for u in untrained if u is not None]
                  + [published.get(o, {}).get(key, 0) for o in objs if results["comparable"]])
        px = axes(draw, box, (-0.5, len(objs) - 0.5), (0, top * 1.15))
        chance = results["chance"].get(key)
        title = LABELS[key] + (f" (chance {chance:.3f})" if chance is not None else "")
        draw.text(((box[0] + box[2]) / 2, 86), title, font=font(30), fill=INK, anchor="ma")
        for j, (obj, row) in enumerate(zip(objs, rows)):
            x0, _ = px(j - 0.3, 0)
            x1, base = px(j + 0.3, 0)
            draw.text(((x0 + x1) / 2, box[3] + 16), obj, font=font(28), fill=INK, anchor="ma")
            if row is None:
                continue
            draw.rectangle([x0, px(j, row["mean"])[1], x1, base], fill=COLOURS.get(obj, GREY))
            label_y = px(j, max(row["values"] + [row["mean"]]))[1] - 16
            if untrained[j] is not None and -10 < label_y - px(j, untrained[j])[1] < 40:
                label_y = px(j, untrained[j])[1] - 10       # above the untrained segment
            draw.text(((x0 + x1) / 2, label_y), f"{row['mean']:.3f}", font=font(28), fill=INK,
                      anchor="mb")
            for s, v in enumerate(row["values"]):
                dot(draw, px(j + (s - (len(row["values"]) - 1) / 2) * 0.12, v), 9, "white")
            if results["comparable"] and key in published.get(obj, {}):
                y = px(j, published[obj][key])[1]
                draw.line([(x0 - 10, y), (x1 + 10, y)], fill=INK, width=5)
        for j, level in enumerate(untrained):            # the level each bar started from
            if level is not None:
                dashed(draw, px(j - 0.36, level), px(j + 0.36, level), width=5, fill=INK)
        if chance is not None:
            hline(draw, px, -0.5, len(objs) - 0.5, chance, "chance", where="out")
        if ceiling is not None:
            hline(draw, px, -0.5, len(objs) - 0.5, ceiling, f"world ceiling {ceiling:.3f}",
                  CEILING)
    key = "bar: mean over seeds   ○ one seed   - - - chance   ▬ ▬ untrained encoder (step 0)"
    if results.get("ceiling") is not None and "mutual_knn" in metrics:
        key += "   - - - world ceiling"
    if results["comparable"]:
        key += "   ▬ published (COCO replication)"
    draw.text((120, 850), key, font=font(28), fill=INK, anchor="lm")
    save_png(img, path)


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
        save_png(img, path)
        return
    top = max(v.max() for _, v in curves.values()) * 1.15 or 1.0
    box = (140, 120, 1540, 760)
    speed = results.get("speed", {})
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
        hline(draw, px, 0, p["base"]["steps"], results["chance"][metric],   # right: clear of
              f"chance {results['chance'][metric]:.3f}", where="rb")      # next_token's label
    faster_marks(draw, px, speed, p["base"]["steps"])
    legend(draw, (140, 860), [(o, COLOURS.get(o, GREY)) for o in curves])
    draw.text((1540, 860), "line: mean over seeds   shade: seed min..max", font=font(28),
              fill=INK, anchor="rm")
    if (results.get("speed", {}).get("next_token") or {}).get("target"):
        draw.text((FIG_SIZE[0] // 2, 76), "- - - next_token's final value (seed mean);  ▼ the "
                  "mean step where another objective first reaches it", font=font(24),
                  fill=INK, anchor="ma")
    save_png(img, path)


def faster_marks(draw, px, speed, steps):
    """fig_curves' "aligns faster" marks (report's speed_summary): next_token's final val value
    (mean over seeds) as a dashed line, and on it a ▼ at the mean step where each other
    objective first reaches next_token's final at the same seed, with that step written."""
    target = (speed.get("next_token") or {}).get("target")
    if not target:
        return
    hline(draw, px, 0, steps, target["mean"], f"next_token final {target['mean']:.3f}", INK,
          where="lt")
    stacked = {}                              # marks at one step go one above the other
    for obj, row in speed.items():
        reached = row["steps_to_target"]
        if obj == "next_token" or reached is None:
            continue
        x, y = px(reached["mean"], target["mean"])
        colour = COLOURS.get(obj, GREY)
        dashed(draw, (x, y), px(reached["mean"], 0), width=3, fill=colour)
        stacked[round(x)] = stacked.get(round(x), -1) + 1
        y -= 62 * stacked[round(x)]
        draw.polygon([(x - 16, y - 30), (x + 16, y - 30), (x, y - 4)], fill=colour, outline=INK)
        late = f" ({row['not_reached']} never)" if row["not_reached"] else ""
        draw.text((x, y - 36), f"{reached['mean']:.0f}{late}", font=font(24), fill=colour,
                  anchor="mb")


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
        save_png(img, path)
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
    save_png(img, path)
