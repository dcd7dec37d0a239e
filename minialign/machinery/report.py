"""A results directory -> OUT/results.json, OUT/results.md and the figures, from its runs
(OUT/runs/NAME/, OUT/protocol.json: grid.py) alone; `compare` says whether two tables agree.

    python -m minialign report OUT [OUT ...] [--embeddings FILE]
    python -m minialign compare RESULTS [--against docs/demo/results.json]

Image columns (mutual-kNN@10, R@k) appear with an embeddings file, given or recorded in
protocol.json ("embeddings"), computed from the runs' saved caption embeddings every time
(images.py): no number can go stale. Rows: chance, the untrained encoder of each attention
(each seed's encoder at step 0), a synthetic world's ceiling, each objective over the seeds,
each objective at its lr search's pick. results.json keeps every row's test value of every
metric at each seed: what `compare` reads.

The noise rule, the one used wherever two numbers are asked to differ beyond the seeds' noise
(compare, the lr search's pick): per-seed values x_1..x_n and y_1..y_m with sample stds s_x,
s_y (ddof 1) have the pooled spread s = sqrt(((n - 1) s_x^2 + (m - 1) s_y^2) / (n + m - 2)),
and differ when |mean(x) - mean(y)| > max(2 s sqrt(1/n + 1/m), FLOOR): two standard errors of
a difference of means over independent seeds, never finer than the tables' third decimal.
One value a side (the lr search scores one seed per lr) takes s from the seed grid.
"""
import math
from pathlib import Path

import numpy as np

from ..objectives import CAUSAL
from . import figures, grid, images, runs, synthetic

PUBLISHED = {"good_views": {"mutual_knn": 0.320, "R@1": 0.084, "lr_search": 0.328},
             "bad_views": {"mutual_knn": 0.192, "R@1": 0.063, "lr_search": 0.196},
             "next_token": {"mutual_knn": 0.148, "R@1": 0.057, "lr_search": 0.168}}
TEXT_KEY = "paraphrase_R@1"
FLOOR = 0.002
NAMES = {"mutual_knn": "mutual-kNN@10", "R@1": "R@1", "R@5": "R@5", "R@10": "R@10",
         TEXT_KEY: "paraphrase R@1"}
DEMO = Path(__file__).resolve().parents[2] / "docs" / "demo" / "results.json"
ALLOWED = ("base.model.layers", "base.model.dtype",      # settings compare lets differ:
           "base.captions", "embeddings")                 # the files' sha256 are compared


# ---------------------------------------------------------------- the noise rule, the table
def allowed(s, n, m):
    """The largest difference of two means of n and m seeds that is noise (module docstring)."""
    return max(2 * s * math.sqrt(1 / n + 1 / m), FLOOR)


def agreement(x, y):
    """(|mean x - mean y|, allowed difference, pooled spread s) of two lists of per-seed
    values, by the noise rule."""
    n, m = len(x), len(y)
    ss = sum((len(v) - 1) * float(np.var(v, ddof=1)) for v in (x, y) if len(v) > 1)
    s = math.sqrt(ss / (n + m - 2)) if n + m > 2 else 0.0
    return abs(float(np.mean(x)) - float(np.mean(y))), allowed(s, n, m), s


def fmt(x, sign=False):
    if x is None or isinstance(x, str):
        return x or "-"
    return f"{round(x, 3) + 0.0:+.3f}" if sign else f"{x:.3f}"


def cells(value, sign=False):
    """A row's value of one metric -> ("mean ± std", "v0, v1, v2"): a list over seeds, one
    number (chance, a one-seed pick), or None."""
    if not isinstance(value, list) or not value:
        return fmt(None if value == [] else value), ""
    spread = f" ± {np.std(value, ddof=1):.3f}" if len(value) > 1 else " (1 seed)"
    return fmt(float(np.mean(value)), sign) + spread, ", ".join(fmt(v) for v in value)


def md_table(head, rows, align):
    """The one table writer: markdown lines of `head` and `rows` (lists of str); align: one
    letter per column, l or r."""
    return ["| " + " | ".join(head) + " |",
            "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"] + \
        ["| " + " | ".join(row) + " |" for row in rows]


# ---------------------------------------------------------------- numbers
def collect(out, embeddings=None):
    """Every number of the report of OUT (see the module docstring), as results.json holds it."""
    out = Path(out)
    protocol, saved = grid.load_protocol(out), runs.read_json(out / "protocol.json")
    path = embeddings or saved.get("embeddings")
    emb = images.load_embeddings(path) if path else None
    keys = [*images.IMAGE_KEYS, TEXT_KEY] if emb else [TEXT_KEY]
    metric = "mutual_knn" if emb else TEXT_KEY
    base, memo, found = protocol.base, {}, {}

    def run(obj, seed, lr=None, size=None):
        """One run's numbers: status, final val `metric`, test metrics, its val curve."""
        cfg = grid.run_config(protocol, obj, seed, lr, size)
        name = grid.run_name(protocol, cfg)
        if name not in found:
            run_dir = out / "runs" / name
            status = grid.state(run_dir) or ("stopped" if (run_dir / "config.json").is_file()
                                             else "not started")
            r = found[name] = {"objective": obj, "seed": seed, "lr": cfg.lr, "status": status,
                               "size": [cfg.model.d_model, cfg.model.n_layers]}
            if status == "finished":
                scores = images.score_run(run_dir, emb, memo=memo)
                r["parameters"] = runs.read_json(run_dir / "config.json")["info"]["parameters"]
                r.update(val=scores["val"][metric], test={k: scores["test"][k] for k in keys},
                         chance={k: scores["test"]["chance"][k] for k in keys},
                         wall_seconds=runs.read_metrics(run_dir).get("wall_seconds", 0.0))
            if (run_dir / "captions" / "test_step00000.npz").is_file() and lr is None:
                r["untrained"] = images.score_run(run_dir, emb, 0, memo)["test"]
            if status == "finished" and lr is None:
                evals = runs.read_metrics(run_dir)["evals"]
                r["curve"] = images.curve(run_dir, emb, memo) if emb else {
                    "step": [e["step"] for e in evals], TEXT_KEY: [e["val"][TEXT_KEY]
                                                                   for e in evals]}
        return found[name]

    def rows(size=None):
        """The seed grid's rows at one encoder size: objectives and untrained encoders."""
        objectives, untrained = {}, {}
        for obj in protocol.objectives:
            done = [r for r in (run(obj, s, size=size) for s in protocol.seeds)
                    if r["status"] == "finished"]
            objectives[obj] = {"seeds": [r["seed"] for r in done],
                               **{k: [r["test"][k] for r in done] for k in keys}}
            attention = "causal" if CAUSAL[obj] else "bidirectional"
            untrained.setdefault(attention, {"objectives": []})["objectives"].append(obj)
        for row in untrained.values():                  # a seed's first run that has one
            step0 = [next((r["untrained"] for r in (run(o, s, size=size) for o in row["objectives"])
                           if "untrained" in r), None) for s in protocol.seeds]
            row["seeds"] = [s for s, u in zip(protocol.seeds, step0) if u]
            row.update({k: [u[k] for u in step0 if u] for k in keys})
        return objectives, {a: r for a, r in untrained.items() if r["seeds"]}

    synthetic_world = bool(emb and emb.meta.get("synthetic"))
    results = {"kind": protocol.kind, "dataset": out.name, "protocol": saved,
               "captions_sha256": saved.get("captions_sha256") or (
                   runs.sha256_file(base.captions) if Path(base.captions).is_file() else None),
               "embeddings": emb and {"path": str(emb.path), "model": emb.meta.get("model")},
               "published": PUBLISHED if emb and not synthetic_world
               and "dinov2" in str(emb.meta.get("model")).lower() else {},
               "world": emb.meta.get("world") if synthetic_world else None,
               "metrics": keys, "metric": metric,
               "ceiling": synthetic.world_ceiling_of_files(base.captions, emb.path,
                                                           split_seed=base.split_seed)
               if synthetic_world else None}
    if protocol.sizes:
        results["sizes"] = [dict(zip(("d_model", "n_layers", "objectives", "untrained"),
                                     (*size, *rows(size)))) for size in protocol.sizes]
        for row, size in zip(results["sizes"], protocol.sizes):
            g, n = (row["objectives"].get(o, {"seeds": []}) for o in ("good_views", "next_token"))
            gap = {s: v for s, v in zip(g["seeds"], g.get(metric, []))}
            gap = {s: gap[s] - v for s, v in zip(n["seeds"], n.get(metric, [])) if s in gap}
            row.update(params=next((r["parameters"] for r in found.values()
                                    if r["size"] == list(size) and "parameters" in r), None),
                       gap={"seeds": list(gap), "values": list(gap.values())})
        results["trend"] = gap_trend([(row["params"], v) for row in results["sizes"]
                                      for v in row["gap"]["values"]])
    else:
        results["objectives"], results["untrained"] = rows()
        results["lr_search"] = {obj: search(protocol, obj, run)
                                for obj in (protocol.objectives if protocol.lr_per_decade else ())}
    finished = [r for r in found.values() if r["status"] == "finished"]
    results["chance"] = finished[0]["chance"] if finished else {}
    results["curves"] = {n: {k: r[k] for k in ("objective", "seed", "curve")}
                         for n, r in found.items() if "curve" in r}
    results["runs"] = {n: {k: v for k, v in r.items() if k not in ("curve", "chance", "untrained")}
                       for n, r in found.items()}
    return results


def search(protocol, obj, run):
    """The lr search of `obj` replayed (grid.lr_search), its pick's test numbers, and whether
    the pick beats the next best lr beyond noise: margin = its val score minus the best other
    finite one, noise = allowed(s, 1, 1) with s the sample std of the seed grid's val scores."""
    def score(lr):
        r = run(obj, protocol.seeds[0], lr)
        return r.get("val", -math.inf if r["status"] == "diverged" else None)
    s = grid.lr_search(protocol, score)
    others = [v for lr, v in zip(s["lrs"], s["scores"])
              if lr != s["chosen"] and v is not None and math.isfinite(v)]
    best = dict(zip(s["lrs"], s["scores"])).get(s["chosen"])
    vals = [r["val"] for r in (run(obj, seed) for seed in protocol.seeds) if "val" in r]
    ok = bool(others) and best is not None and math.isfinite(best)
    chosen = run(obj, protocol.seeds[0], s["chosen"]) if s["chosen"] else {}
    return {**s, "scores": [v if v is None or math.isfinite(v) else "diverged"
                            for v in s["scores"]],
            "test": chosen.get("test"), "margin": best - max(others) if ok else None,
            "noise": allowed(float(np.std(vals, ddof=1)), 1, 1) if len(vals) > 1 else None}


def gap_trend(points):
    """A least-squares line gap = a + b log10(parameters) through (parameters, gap) points:
    {"slope" b per tenfold parameters, "se" sqrt(RSS / (n - 2) / sum (x - mean x)^2), "n",
    "verdict": "grows" / "shrinks" when |b| > 2 se, else "not resolved at these sizes"}."""
    x, g = np.log10([p for p, _ in points]), np.array([v for _, v in points])
    out = {"slope": None, "se": None, "n": len(points), "verdict": "not resolved at these sizes"}
    if len(points) >= 3 and len(set(x.tolist())) >= 2:
        xc = x - x.mean()
        b = float(xc @ (g - g.mean()) / (xc @ xc))
        se = math.sqrt(float(np.sum((g - g.mean() - b * xc) ** 2)) / (len(x) - 2) / (xc @ xc))
        out.update(slope=b, se=se, verdict="grows" if b > 2 * se else "shrinks" if b < -2 * se
                   else out["verdict"])
    return out


# ---------------------------------------------------------------- results.md
def protocol_line(results):
    p, emb = results["protocol"], results["embeddings"]
    base, model = p["base"], p["base"]["model"]
    sizes = ", ".join(f"D={d} L={n}" for d, n in p.get("sizes") or [(model["d_model"],
                                                                       model["n_layers"])])
    dtype = "" if model.get("dtype", "float32") == "float32" else f" in {model['dtype']}"
    world = f" (SYNTHETIC world {results['world']})" if results["world"] else ""
    image = f"; image embeddings `{emb['path']}` ({emb['model']})" if emb else ""
    return (f"{', '.join(p['objectives'])} x seeds {', '.join(map(str, p['seeds']))}: "
            f"{base['steps']} steps of {base['batch_photos']} photos (two captions each), lr "
            f"{base['lr']:g} for every objective, encoder {sizes}{dtype}, "
            f"{'WordPiece' if base.get('tokenizer') == 'wordpiece' else 'word'} tokenizer, "
            f"`--layers {model['layers']}`; captions `{base['captions']}`{world}{image}. Test "
            f"split, mean ± sample std (ddof 1) over seeds; image metrics are means over the "
            f"caption slots (R@1: caption → image after an orthogonal rotation fitted on the "
            f"train photos); paraphrase R@1 is text-only.")


def rows_of(results, picks=True):
    """The table's rows [(label, {metric: per-seed list or one number}, published)]: chance,
    the untrained encoders, the world's ceiling, the objectives, the lr search's picks."""
    pub, seed = results["published"], results["protocol"]["seeds"][0]
    rows = [("chance", results["chance"], {})]
    rows += [(f"untrained encoder, {a} ({', '.join(u['objectives'])})", u, {})
             for a, u in results["untrained"].items()]
    if results["ceiling"] is not None:
        rows.append((f"world {results['world']} ceiling (scene factors vs images)",
                     {"mutual_knn": results["ceiling"]}, {}))
    rows += [(obj, row, pub.get(obj, {})) for obj, row in results["objectives"].items()]
    return rows + [(f"{obj}, lr search ({s['chosen']:.2e}, seed {seed})" if s["chosen"] else
                    f"{obj}, lr search (incomplete)", s["test"] or {},
                    {"mutual_knn": pub.get(obj, {}).get("lr_search")})
                   for obj, s in (results["lr_search"] if picks else {}).items()]


def main_table(results):
    """results.md's table: with images mutual-kNN@10 and R@1 (mean ± std, each seed, the
    published value when comparable) and paraphrase R@1; text-only: paraphrase R@1, each seed."""
    rows, pub = rows_of(results), bool(results["published"])
    if "mutual_knn" not in results["metrics"]:
        return md_table(["row", "paraphrase R@1", "per seed"],
                        [[label, *cells(row.get(TEXT_KEY))] for label, row, _ in rows], "lrl")
    body = [[label] + [c for key in ("mutual_knn", "R@1") for c in [*cells(row.get(key))] + (
        [fmt(p[key]) if p.get(key) else ""] if pub else [])] + [cells(row.get(TEXT_KEY))[0]]
        for label, row, p in rows]
    head = [[name, "per seed"] + ["published"] * pub
            for name in ("mutual-kNN@10", "R@1, caption → image")]
    return md_table(["row", *head[0], *head[1], "paraphrase R@1"], body,
                    "l" + ("rl" + "r" * pub) * 2 + "r")


def format_markdown(results):
    """results.md of a replicate directory: the protocol, the table, what its rows mean, the
    lr search and its picks, the figures."""
    lines = [f"# Replication results: {results['dataset']}", "", protocol_line(results), ""]
    lines += main_table(results) + [""]
    pub = "; ".join(f"{o} {v['mutual_knn']:.3f} / {v['R@1']:.3f}" for o, v in PUBLISHED.items())
    if not results["published"]:
        lines += [f"Published (COCO, DINOv2; test mutual-kNN@10 / R@1): {pub}. " + (
            "These runs were scored against other image embeddings: compare the ordering of "
            "the objectives with the replication's, not the values." if results["embeddings"]
            else "Text side only: `report --embeddings FILE` adds the image columns."), ""]
    lines += ["Untrained encoder: each seed's encoder at step 0 (the weights its runs start "
              "from), scored like the runs: what the architecture gives before training; read "
              "every gain against it, not against chance." if results["untrained"] else
              "Untrained encoder: not scored (the runs saved no test captions at step 0)."]
    if results["ceiling"] is not None:
        lines[-1] += (" World ceiling: mutual-kNN@10 between the synthetic world's scene factors "
                      "and its image embeddings on the test photos, what an encoder that "
                      "recovered every scene exactly would score.")
    lines += [""] + search_lines(results)
    done = [r["wall_seconds"] for r in results["runs"].values() if "wall_seconds" in r]
    lines += [f"{len(done)} runs finished; their own times add up to {sum(done) / 60:.1f} min.", "",
              "## Figures", ""] + [f"![{f[4:-4]}]({f})" for f in results["figures"]]
    return "\n".join(lines) + "\n"


def search_lines(results):
    """The lr search's table: each lr's final val score, the pick, and whether it is resolved."""
    if not results["lr_search"]:
        return []
    p = results["protocol"]
    body = []
    for obj, s in results["lr_search"].items():
        points = ", ".join((f"**{lr:.2e}: {fmt(v)}**" if lr == s["chosen"] else
                            f"{lr:.2e}: {fmt(v)}") for lr, v in zip(s["lrs"], s["scores"]))
        where = ("yes" if s["interior"] else "no: on the edge after the allowed extensions"
                 ) if s["chosen"] else f"incomplete, missing: {s['missing'][0]:.2e}"
        margin, noise = s["margin"], s["noise"]
        said = ("-" if margin is None else f"{fmt(margin, True)} (one seed: no spread)"
                if noise is None else f"{fmt(margin, True)} (" + (
                    f"resolved: noise < {noise:.3f})" if margin > noise else
                    f"not resolved: noise up to {noise:.3f})"))
        body.append([obj, points, f"{s['chosen']:.2e}" if s["chosen"] else "-", where, said])
    return ["## Learning-rate search", "",
            f"Seed {p['seeds'][0]} per objective over lr {p['lr_min']:g} .. {p['lr_max']:g} "
            f"({p['lr_per_decade']} per decade), extended past an edge at most "
            f"{p['max_extensions']} times; selected on final val {NAMES[results['metric']]}; "
            f"the pick's test numbers are in the table above. A pick is resolved when it beats "
            f"the next best lr by more than the noise rule allows one seed against one, with "
            f"the seed grid's spread (`compare`'s rule, report.py).", ""] + md_table(
        ["objective", "val score at each lr (chosen in bold)", "chosen lr", "interior",
         "margin over the next best"], body, "llrll") + [""]


def format_scaling(results):
    """results.md of a scaling sweep: one row per size, the gap, the trend."""
    p, metric = results["protocol"], results["metric"]
    objs, body = p["objectives"], []
    for row in results["sizes"]:
        n = row["params"]
        line = [str(row["d_model"]), str(row["n_layers"]),
                "?" if n is None else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"]
        line += [cells(row["objectives"][o].get(metric))[0] for o in objs]
        line += [cells(row["untrained"].get(a, {}).get(metric))[0]
                 for a in ("bidirectional", "causal")]
        body.append(line + [cells(row["gap"]["values"], sign=True)[0]])
    t = results["trend"]
    trend = (f"The good_views − next_token gap in test {NAMES[metric]} {t['verdict']}"
             + ("" if t["slope"] is None else
                f" with encoder size: slope {fmt(t['slope'], True)} ± {t['se']:.3f} per tenfold "
                f"parameters (a least-squares line through {t['n']} size/seed gaps; called when "
                f"|slope| > 2 standard errors)") + ".")
    return "\n".join([f"# Scaling sweep: {results['dataset']}", "", protocol_line(results), ""]
                     + md_table(["D", "L", "params"] + [f"{o} {NAMES[metric]}" for o in objs]
                                + ["untrained, bidirectional", "untrained, causal", "gap"],
                                body, "r" * (6 + len(objs)))
                     + ["", f"Chance: {fmt(results['chance'].get(metric))}. {trend}", "",
                        "## Figure", "", "![scaling](fig_scaling.png)"]) + "\n"


def report(out, embeddings=None):
    """OUT/results.json, OUT/results.md and the figures; prints the table; returns results."""
    out, results = Path(out), collect(out, embeddings)
    results["figures"] = names = figures.draw(results, out)
    text = (format_scaling if "sizes" in results else format_markdown)(results)
    runs.write_json(out / "results.json", results)
    runs.atomic_write(out / "results.md", text)
    print(text.split("\n## ")[0].rstrip())
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}, "
          f"{', '.join(str(out / n) for n in names)}")
    return results


def write_report(out, embeddings=None):
    """`python -m minialign report OUT [--embeddings FILE]`: returns the path of results.md."""
    report(out, embeddings)
    return Path(out) / "results.md"


def write_side_by_side(outs, embeddings=None):
    """`report OUT_A OUT_B ...`: each directory's report, then one table of the rows of all
    (test mean ± std), a column per metric and directory: compare_A_B.md beside the first.
    Returns its path."""
    if len({Path(o).resolve() for o in outs}) < len(outs):
        raise ValueError(f"{outs[0]}: a directory is given twice")
    results = [report(o, embeddings) for o in outs]
    keys = [k for k in ("mutual_knn", "R@1", TEXT_KEY) if all(k in r["metrics"] for r in results)]
    tables = [{label: row for label, row, _ in rows_of(r, picks=False)} for r in results]
    body = [[label] + [cells(t.get(label, {}).get(k))[0] for k in keys for t in tables]
            for label in dict.fromkeys(label for t in tables for label in t)]
    head = ["row"] + [f"{NAMES[k]}, {Path(o).name}" for k in keys for o in outs]
    path = Path(outs[0]).parent / ("compare_" + "_".join(Path(o).name for o in outs) + ".md")
    text = "\n".join([f"# Side by side: {', '.join(f'`{o}`' for o in outs)}", "",
                      "Test split, mean ± sample std (ddof 1) over seeds.", ""]
                     + md_table(head, body, "l" + "r" * (len(head) - 1))) + "\n"
    runs.atomic_write(path, text)
    print(text + f"\nwrote {path}")
    return path


# ---------------------------------------------------------------- compare
def load_results(path):
    """A table: results.json of `report` (or a directory holding one), or a summary of the same
    format (docs/demo/results.json). ValueError / FileNotFoundError, one line naming it."""
    path = Path(path) / "results.json" if Path(path).is_dir() else Path(path)
    table = runs.read_json(path)           # FileNotFoundError "DIR/results.json: no such file"
    if not isinstance(table, dict) or not {"protocol", "metrics", "objectives"} <= set(table):
        raise ValueError(f"{path}: not a results table (results.json of `minialign report`"
                         f"{', of a scaling sweep' if 'sizes' in table else ''})")
    return table


def flat(d, prefix=""):
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    return {k: v for key, value in d.items() for k, v in (flat(value, f"{prefix}{key}.").items()
                                                          if isinstance(value, dict)
                                                          else [(prefix + key, value)])}


def protocol_refusal(mine, ref, names):
    """None when two tables were made under one protocol, else the one-line reason. Settings
    may differ in ALLOWED; a setting only one of them knows is not compared."""
    a, b = flat(mine["protocol"]), flat(ref["protocol"])
    said = [f"{n.removeprefix('base.')} ({a[n]!r} in {names[0]}, {b[n]!r} in {names[1]})"
            for n in sorted(a.keys() & b.keys()) if a[n] != b[n] and n not in ALLOWED
            and not n.endswith("_sha256")]
    if None not in (mine.get("captions_sha256"), ref.get("captions_sha256")) and \
            mine["captions_sha256"] != ref["captions_sha256"]:
        said.append("the captions file (another sha256: another synthetic world?)")
    return said and (f"{names[0]}: made under another protocol than {names[1]}: "
                     f"{'; '.join(said)}; compare tables made with the same settings")


def compare(results, against=None):
    """`python -m minialign compare RESULTS [--against FILE]`: one line per row and metric of
    the reference (default docs/demo/results.json): agree, or differs, by the noise rule, with
    the spread and how far apart the same seed's values are (information: the same seed in
    float64 differs by rounding only). Prints the lines; returns whether all agree. Tables
    of two protocols: ValueError, one line."""
    against = against or DEMO
    mine, ref = load_results(results), load_results(against)
    names = (str(results), str(against))
    refusal = protocol_refusal(mine, ref, names)
    if refusal:
        raise ValueError(refusal)
    ceiling = lambda t: t["ceiling"] is not None and {"seeds": [], "mutual_knn": [t["ceiling"]]}
    rows = [(o, mine["objectives"].get(o), v, ref["metrics"]) for o, v in ref["objectives"].items()]
    rows += [(f"untrained encoder, {a}", mine["untrained"].get(a), v, ref["metrics"])
             for a, v in ref["untrained"].items()]
    rows += [("world ceiling", ceiling(mine), ceiling(ref), ["mutual_knn"])] * bool(ceiling(ref))
    width, lines = max(len(r[0]) for r in rows), []
    for label, got, want, keys in rows:
        for key in keys if got else [""]:
            where = f"{label:<{width}}  {NAMES.get(key, ''):<14}"
            if not got or not got.get(key):
                lines.append((f"{where}  missing in {names[0]}", False))
                continue
            diff, limit, s = agreement(got[key], want[key])
            mean = dict(zip(got["seeds"], got[key]))
            pairs = [abs(mean[i] - v) for i, v in zip(want["seeds"], want[key]) if i in mean]
            lines.append((f"{where}  {'agree' if diff <= limit else f'differs by {diff:.4f}'}: "
                          f"{np.mean(got[key]):.4f} vs {np.mean(want[key]):.4f} (allowed "
                          f"{limit:.4f}; spread {s:.4f}"
                          + (f", the difference {diff / s:.2f} of it" if round(s, 4) else "")
                          + f"; seeds {len(got[key])} and {len(want[key])}"
                          + (f"; same seed up to {max(pairs):.4f})" if pairs else ")"),
                          diff <= limit))
    said = [f"--layers {t['protocol']['base']['model']['layers']}, --dtype "
            f"{t['protocol']['base']['model'].get('dtype', 'float32')}" for t in (mine, ref)]
    print(f"{names[0]} ({said[0]}) against {names[1]} ({said[1]}); agree: |mean difference| <= "
          f"max(2 x spread x sqrt(1/n + 1/m), {FLOOR}), spread = the seeds' pooled std")
    print("\n".join(line for line, _ in lines))
    bad = sum(not ok for _, ok in lines)
    print(f"all {len(lines)} agree" if not bad else f"{bad} of {len(lines)} do not agree")
    return not bad
