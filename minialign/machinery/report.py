"""A results directory's runs (OUT/runs/NAME/, OUT/protocol.json: grid.py) -> OUT/results.json,
OUT/results.md and the figures; the image columns (with an embeddings file, given or recorded)
are computed from the runs' saved caption embeddings each time. `compare`: do two tables agree.

The noise rule (compare, the lr search's pick): per-seed values x of n seeds and y of m differ
when |mean x - mean y| > max(2 s sqrt(1/n + 1/m), FLOOR), s their pooled sample std (ddof 1):
two standard errors of a difference of means, never finer than the tables' third decimal. The
lr search (one seed per lr) takes s from the seed grid.
"""
import math
import os
from pathlib import Path

import numpy as np

from ..objectives import CAUSAL
from . import diagnose, figures, grid, images, runs, synthetic
from .runs import md_table  # noqa: F401 (the one table writer)

PUBLISHED = {"good_views": {"mutual_knn": 0.320, "R@1": 0.084, "lr_search": 0.328},
             "bad_views": {"mutual_knn": 0.192, "R@1": 0.063, "lr_search": 0.196},
             "next_token": {"mutual_knn": 0.148, "R@1": 0.057, "lr_search": 0.168}}
TEXT_KEY = "paraphrase_R@1"
FLOOR = 0.002
NAMES = {"mutual_knn": "mutual-kNN@10", "R@1": "R@1", "R@5": "R@5", "R@10": "R@10",
         TEXT_KEY: "paraphrase R@1"}
DEMO = Path(__file__).resolve().parents[2] / "docs" / "demo" / "results.json"
ALLOWED = ("base.model.layers", "base.model.dtype", "base.captions", "embeddings")  # may differ


def allowed(s, n, m):
    """The largest difference of two means of n and m seeds that is noise (the noise rule)."""
    return max(2 * s * math.sqrt(1 / n + 1 / m), FLOOR)


def agreement(x, y):
    """(|mean x - mean y|, allowed difference, pooled spread s) of two lists of per-seed values."""
    ss = sum((len(v) - 1) * float(np.var(v, ddof=1)) for v in (x, y) if len(v) > 1)
    s = math.sqrt(ss / (len(x) + len(y) - 2)) if len(x) + len(y) > 2 else 0.0
    return abs(float(np.mean(x)) - float(np.mean(y))), allowed(s, len(x), len(y)), s


def fmt(x, sign=False):
    if x is None or isinstance(x, str):
        return x or "-"
    return f"{round(x, 3) + 0.0:+.3f}" if sign else f"{x:.3f}"


def cells(value, sign=False):
    """A list over seeds, one number or None -> ("mean ± std", "v0, v1, v2")."""
    if not isinstance(value, list) or not value:
        return fmt(None if value == [] else value), ""
    spread = f" ± {np.std(value, ddof=1):.3f}" if len(value) > 1 else " (1 seed)"
    return fmt(float(np.mean(value)), sign) + spread, ", ".join(fmt(v) for v in value)


def collect(out, embeddings=None):
    """Every number of OUT's report, as results.json holds it (an objective's row: its curves)."""
    out = Path(out)
    protocol, saved = grid.load_protocol(out), runs.read_json(out / "protocol.json")
    path = embeddings or saved.get("embeddings")
    emb = images.load_embeddings(path) if path else None
    keys, metric = ([*images.IMAGE_KEYS, TEXT_KEY], "mutual_knn") if emb else ([TEXT_KEY], TEXT_KEY)
    world = emb.meta["world"] if emb and emb.meta.get("synthetic") else None
    found = {}

    def run(obj, seed, lr=None, size=None):
        """One run's numbers, once; of a seed grid's run (lr None) also step 0 and the curve."""
        cfg = grid.run_config(protocol, obj, seed, lr, size)
        if (name := grid.run_name(protocol, cfg)) in found:
            return found[name]
        run_dir = out / "runs" / name
        r = found[name] = {"seed": seed, "status": (status := grid.state(run_dir)),
                           "size": [cfg.model.d_model, cfg.model.n_layers]}
        if status == "finished":
            scores, metrics = images.score_run(run_dir, emb), runs.read_metrics(run_dir)
            r.update(parameters=runs.read_json(run_dir / "config.json")["info"]["parameters"],
                     val=scores["val"][metric], test={k: scores["test"][k] for k in keys},
                     chance={k: scores["test"]["chance"][k] for k in keys},
                     wall_seconds=metrics.get("wall_seconds", 0.0))
        if (run_dir / "captions" / "test_step00000.npz").is_file() and lr is None:
            r["untrained"] = images.score_run(run_dir, emb, 0)["test"]
        if status == "finished" and lr is None:
            r["curve"] = {"seed": seed, **(images.curve(run_dir, emb) if emb else {
                "step": [e["step"] for e in metrics["evals"]],
                TEXT_KEY: [e["val"][TEXT_KEY] for e in metrics["evals"]]})}
        return r

    def rows(size=None):
        """The seed grid's rows at one encoder size: objectives and untrained encoders."""
        objectives, untrained = {}, {}
        for obj in protocol.objectives:
            done = [r for r in (run(obj, s, size=size) for s in protocol.seeds)
                    if r["status"] == "finished"]
            objectives[obj] = {"seeds": [r["seed"] for r in done], "curves": [
                r["curve"] for r in done], **{k: [r["test"][k] for r in done] for k in keys}}
            attention = "causal" if CAUSAL[obj] else "bidirectional"
            untrained.setdefault(attention, {"objectives": []})["objectives"].append(obj)
        for row in untrained.values():                  # a seed's first run that has one
            step0 = {s: u for s in protocol.seeds if (u := next((r["untrained"] for r in (
                run(o, s, size=size) for o in row["objectives"]) if "untrained" in r), None))}
            row.update(seeds=list(step0), **{k: [u[k] for u in step0.values()] for k in keys})
        return objectives, {a: r for a, r in untrained.items() if r["seeds"]}

    results = {"dataset": out.name, "protocol": saved, "captions_sha256": saved["captions_sha256"],
               "embeddings": emb and {"path": str(emb.path), "model": emb.meta.get("model")},
               "published": PUBLISHED if emb and not world
               and "dinov2" in str(emb.meta.get("model")).lower() else {},
               "world": world, "metrics": keys, "metric": metric,
               "ceiling": world and synthetic.world_ceiling_of_files(
                   protocol.base.captions, emb.path, split_seed=protocol.base.split_seed)}
    if protocol.sizes:
        results["sizes"] = [dict(zip(("d_model", "n_layers", "objectives", "untrained"),
                                     (*size, *rows(size)))) for size in protocol.sizes]
        for row, size in zip(results["sizes"], protocol.sizes):
            g, n = (row["objectives"].get(o, {"seeds": []}) for o in ("good_views", "next_token"))
            gap = dict(zip(g["seeds"], g.get(metric, [])))
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
        results["speed"] = speed(results)
    results["chance"] = next((r["chance"] for r in found.values() if "chance" in r), {})
    results["wall_seconds"] = [r["wall_seconds"] for r in found.values() if "wall_seconds" in r]
    return results


def search(protocol, obj, run):
    """The lr search replayed, its pick's test numbers, margin over the next best, noise."""
    s = grid.lr_search(protocol, lambda lr: (r := run(obj, protocol.seeds[0], lr)).get(
        "val", -math.inf if r["status"] == "diverged" else None))
    scores = dict(zip(s["lrs"], s["scores"]))
    best = scores.pop(s["chosen"], None)                    # the largest; None while one is missing
    others = [v for v in scores.values() if v is not None and math.isfinite(v)]
    vals = [r["val"] for r in (run(obj, seed) for seed in protocol.seeds) if "val" in r]
    return {**s, "scores": [v if v is None or v > -math.inf else "diverged" for v in s["scores"]],
            "test": s["chosen"] and run(obj, protocol.seeds[0], s["chosen"]).get("test"),
            "margin": best - max(others) if best is not None and others else None,
            "noise": allowed(float(np.std(vals, ddof=1)), 1, 1) if len(vals) > 1 else None}


def gap_trend(points):
    """The least-squares line gap = a + b log10(parameters): b, its standard error, verdict."""
    x, g = np.log10([p for p, _ in points]), np.array([v for _, v in points])
    b = se = None
    if len(points) >= 3 and len(set(x.tolist())) >= 2:
        xc = x - x.mean()
        b = float(xc @ (g - g.mean()) / (xc @ xc))
        se = math.sqrt(float(np.sum((g - g.mean() - b * xc) ** 2)) / (len(x) - 2) / (xc @ xc))
    return {"slope": b, "se": se, "n": len(points), "verdict": "not resolved at these sizes"
            if b is None or abs(b) <= 2 * se else "grows" if b > 0 else "shrinks"}


def header(results, title):
    p, emb = results["protocol"], results["embeddings"]
    base, model = p["base"], p["base"]["model"]
    sizes = ", ".join(f"D={d} L={n}" for d, n in p.get("sizes") or [(model["d_model"],
                                                                       model["n_layers"])])
    dtype = "" if model.get("dtype", "float32") == "float32" else f" in {model['dtype']}"
    world = f" (SYNTHETIC world {results['world']})" if results["world"] else ""
    image = f"; image embeddings `{emb['path']}` ({emb['model']})" if emb else (
        "; text only (`report --embeddings FILE` adds the image columns)")
    return [f"# {title}: {results['dataset']}", "",
            f"{', '.join(p['objectives'])} x seeds {', '.join(map(str, p['seeds']))}: "
            f"{base['steps']} steps of {base['batch_photos']} photos (two captions each), lr "
            f"{base['lr']:g} for every objective, encoder {sizes}{dtype}, "
            f"{'WordPiece' if base.get('tokenizer') == 'wordpiece' else 'word'} tokenizer, "
            f"`--layers {model['layers']}`; captions `{base['captions']}`{world}{image}. Test "
            f"split, mean ± sample std (ddof 1) over seeds.", ""]


def main_table(results):
    """results.md's table: chance, the untrained encoders, the world's ceiling, the objectives, the
    lr search's picks; mutual-kNN@10 and R@1 (mean ± std, each seed, published when comparable),
    then paraphrase R@1; text-only: paraphrase R@1 and each seed."""
    published, seed = results["published"], results["protocol"]["seeds"][0]
    rows = [("chance", results["chance"], {})]
    rows += [(f"untrained encoder, {a} ({', '.join(u['objectives'])})", u, {})
             for a, u in results["untrained"].items()]
    rows += [(f"world {results['world']} ceiling (scene factors vs images)",
              {"mutual_knn": results["ceiling"]}, {})] * (results["ceiling"] is not None)
    rows += [(obj, row, published.get(obj, {})) for obj, row in results["objectives"].items()]
    rows += [(f"{obj}, lr search ({s['chosen']:.2e}, seed {seed})" if s["chosen"] else
              f"{obj}, lr search (incomplete)", s["test"] or {},
              {"mutual_knn": published.get(obj, {}).get("lr_search")})
             for obj, s in results["lr_search"].items()]
    image, pub = "mutual_knn" in results["metrics"], bool(published)
    keys = ["mutual_knn", "R@1"] if image else [TEXT_KEY]
    head = ["row", *(h for k in keys
                     for h in [figures.LABELS[k], "per seed"] + ["published"] * pub)]
    body = [[label, *(c for k in keys for c in [*cells(row.get(k))] + [
        fmt(p[k]) if p.get(k) else ""] * pub)] + [cells(row.get(TEXT_KEY))[0]] * image
        for label, row, p in rows]
    return md_table(head + [NAMES[TEXT_KEY]] * image, body,
                    "l" + ("rl" + "r" * pub) * len(keys) + "r" * image)


def format_markdown(results, explained="results.md"):
    """results.md of a replicate directory; `explained`: the link to docs/results.md."""
    lines = header(results, "Replication results") + main_table(results) + [""]
    lines += finding(results, explained) + search_lines(results)
    done, measures = results["wall_seconds"], diagnose.MEASURES
    lines += [f"{len(done)} runs finished; their own times add up to {sum(done) / 60:.1f} min.", ""]
    if results["diagnose"]:
        lines += ["## What the encoders learned", "", "Held-out R² of the test caption embeddings "
                  "predicted from each caption's token count, its words, its first two words, or "
                  "another caption of its photo (diagnose.py says how).", ""] + md_table(
            ["row", *measures], [[r["row"], *(cells(r[m])[0] for m in measures)]
                                 for r in results["diagnose"]], "lrrrr") + [""]
    lines += ["## Figures", "", f"How to read each: [docs/results.md]({explained}#the-figures).",
              ""] + [f"![{f[4:-4]}]({f})" for f in results["figures"]]
    return "\n".join(lines) + "\n"


def versus(x, y):
    """x's seeds against y's: "above", "within noise" or "below" (the noise rule), and the mean
    difference; one seed a side has no spread to tell noise by: the difference's sign alone."""
    (diff, limit, _), d = agreement(x, y), float(np.mean(x) - np.mean(y))
    near = len(x) + len(y) > 2 and diff <= limit
    return "within noise" if near else "above" if d > 0 else "below" if d < 0 else "equal", d


def chain(means, near=lambda a, b: False):
    """"a 0.070 > b 0.030 ≈ c 0.028": highest first, ≈ where near(a, b) (within noise)."""
    order = sorted(means, key=means.get, reverse=True)
    return f"{order[0]} {fmt(means[order[0]])}" + "".join(
        f" {'≈' if near(a, b) else '>'} {b} {fmt(means[b])}" for a, b in zip(order, order[1:]))


def finding(results, explained):
    """The finding against the claim, computed: per metric the objectives' order beside the
    published order; each objective against its untrained encoder (versus) and its steps to the
    speed level; a link to where docs/results.md explains what differs."""
    objs = {o: r for o, r in results["objectives"].items() if r["seeds"]}
    keys = [k for k in ("mutual_knn", "R@1", TEXT_KEY) if k in results["metrics"]] if objs else []
    one = all(len(r["seeds"]) == 1 for r in objs.values())
    lines = ["## The finding against the claim", "", "Test split; ≈: within noise by the noise "
             "rule" + " (one seed: no spread, so a difference is stated, never judged against "
             "noise)" * one + "; published: COCO with DINOv2 (paraphrase R@1, never published: "
             "beside mutual-kNN@10's order).", ""]
    for k in keys:
        mean = {o: float(np.mean(r[k])) for o, r in objs.items()}
        pub = {o: PUBLISHED[o].get(k, PUBLISHED[o]["mutual_knn"]) for o in objs if o in PUBLISHED}
        near = lambda a, b: versus(objs[a][k], objs[b][k])[0] == "within noise"   # noqa: E731
        swapped = [f"{b} above {a}" for a in pub for b in pub if pub[a] > pub[b]
                   and mean[b] > mean[a] and not near(a, b)]
        lines.append(f"- {NAMES[k]}: {chain(mean, near)}" + (f"; published {chain(pub)}" * bool(
            pub)) + (f". **Not the published order**: {', '.join(swapped)}." if swapped else "."))
    sp, name = results["speed"] or {}, f"val {NAMES[results['metric']]}"
    level = fmt(sp.get("level"))
    start = f"the curves' highest start ({fmt(sp.get('start'))}, step 0: untrained)"
    head = ["objective", *(NAMES[k] for k in keys)] + [f"steps to {name} {level}"] * bool(
        sp.get("level"))
    body = []
    for o, r in objs.items():
        u = figures.untrained(results, o)
        body.append([o, *("{} ({:+.3f})".format(*versus(r[k], u[k])) if u else "not scored"
                          for k in keys)] + [steps(sp["steps"].get(o, []))] * bool(sp.get("level")))
    said = (f"Steps: the first evaluation at which a seed's {name} reaches {level}, halfway from "
            f"{start} to the best final seed mean ({fmt(sp.get('best'))}); fewer: faster. "
            if sp.get("level") else f"No {name} ends above {start}: none aligns, faster or "
            f"slower. " if sp else "")
    return lines + ["", "Each objective against its untrained encoder (the same encoder at step "
                    "0; test, mean difference), and how fast it aligns:", ""] + md_table(
        head, body, "l" * len(head)) + ["", said + "Where the results part from the claim: "
        f"[docs/results.md]({explained}#where-the-results-part-from-the-claim).", ""]


def speed(results):
    """"Aligns faster": fewer steps for a seed's val curve to first reach one level, halfway from
    the curves' highest start (step 0: untrained) to the best objective's final seed mean; per
    seed the first evaluation step at or above it, None: never (a curve that falls or is flat)."""
    metric = results["metric"]
    by = {o: r["curves"] for o, r in results["objectives"].items() if r["curves"]}
    if not by:
        return None
    start = max(c[metric][0] for cs in by.values() for c in cs)
    best = max(float(np.mean([c[metric][-1] for c in cs])) for cs in by.values())
    level = (start + best) / 2 if best > start else None
    return {"start": start, "best": best, "level": level, "steps": {o: [next(
        (s for s, v in zip(c["step"], c[metric]) if level is not None and v >= level), None)
        for c in cs] for o, cs in by.items()}}


def steps(per_seed):
    """A cell of the finding's steps column: mean ± std over the seeds that reach the level."""
    got = [s for s in per_seed if s is not None]
    spread = f" ± {np.std(got, ddof=1):.0f}" if len(got) > 1 else ""
    return "never" if not got else f"{np.mean(got):.0f}{spread}" + (
        f" ({len(got)} of {len(per_seed)} seeds)" if len(got) < len(per_seed) else "")


def search_lines(results):
    """The lr search's table: each lr's final val score, the pick, and whether it is resolved."""
    if not results["lr_search"]:
        return []
    p, body = results["protocol"], []
    for obj, s in results["lr_search"].items():
        points = ", ".join((f"**{lr:.2e}: {fmt(v)}**" if lr == s["chosen"] else
                            f"{lr:.2e}: {fmt(v)}") for lr, v in zip(s["lrs"], s["scores"]))
        where = ("yes" if s["interior"] else "no: on the edge after the allowed extensions"
                 ) if s["chosen"] else f"incomplete, missing: {s['missing'][0]:.2e}"
        margin, noise = s["margin"], s["noise"]
        said = "-" if margin is None else f"{fmt(margin, True)} (" + (
            "one seed: no spread" if noise is None else f"resolved: noise < {noise:.3f}"
            if margin > noise else f"not resolved: noise up to {noise:.3f}") + ")"
        body.append([obj, points, f"{s['chosen']:.2e}" if s["chosen"] else "-", where, said])
    return ["## Learning-rate search", "",
            f"Seed {p['seeds'][0]} per objective over lr {p['lr_min']:g} .. {p['lr_max']:g} "
            f"({p['lr_per_decade']} per decade, at most {p['max_extensions']} extensions past an "
            f"edge), on final val {NAMES[results['metric']]}; its test numbers: the table above. "
            f"Resolved: beyond the noise rule, one seed against one, the seed grid's spread.",
            ""] + md_table(
        ["objective", "val score at each lr (chosen in bold)", "chosen lr", "interior",
         "margin over the next best"], body, "llrll") + [""]


def format_scaling(results):
    """results.md of a scaling sweep: one row per size, the gap, the trend."""
    objs, metric, body = results["protocol"]["objectives"], results["metric"], []
    for row in results["sizes"]:
        n, shown = row["params"], [*(row["objectives"][o] for o in objs), *(
            row["untrained"].get(a, {}) for a in ("bidirectional", "causal"))]
        body.append([str(row["d_model"]), str(row["n_layers"]),
                     "?" if n is None else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k",
                     *(cells(r.get(metric))[0] for r in shown),
                     cells(row["gap"]["values"], sign=True)[0]])
    t = results["trend"]
    trend = (f"The good_views − next_token gap in test {NAMES[metric]} {t['verdict']}"
             + ("" if t["slope"] is None else
                f" with encoder size: slope {fmt(t['slope'], True)} ± {t['se']:.3f} per tenfold "
                f"parameters (a least-squares line through {t['n']} size/seed gaps; called when "
                f"|slope| > 2 standard errors)") + ".")
    head = ["D", "L", "params", *(f"{o} {NAMES[metric]}" for o in objs),
            "untrained, bidirectional", "untrained, causal", "gap"]
    return "\n".join(header(results, "Scaling sweep") + md_table(head, body, "r" * len(head)) + [
        "", f"Chance: {fmt(results['chance'].get(metric))}. {trend}", "", "## Figure", "",
        "![scaling](fig_scaling.png)"]) + "\n"


def write_report(out, embeddings=None):
    """`report OUT`: results.json, results.md and the figures; prints the table."""
    out, results = Path(out), collect(out, embeddings)
    if "sizes" not in results:
        results["diagnose"] = diagnose.diagnose(out)
    results["figures"] = figures.draw(results, out)
    text = format_scaling(results) if "sizes" in results else format_markdown(
        results, Path(os.path.relpath(DEMO.parents[1], out.resolve())) / "results.md")
    runs.write_json(out / "results.json", results)
    runs.atomic_write(out / "results.md", text)
    print(text.split("\n## ")[0].rstrip(), "wrote " + ", ".join(
        str(out / n) for n in ["results.md", "results.json", *results["figures"]]), sep="\n")
    return results


def load_results(path):
    """results.json of `report` or a directory holding one; a bad file: one line naming it."""
    path = Path(path) / "results.json" if Path(path).is_dir() else Path(path)
    table = runs.read_json(path)           # FileNotFoundError "DIR/results.json: no such file"
    if not isinstance(table, dict) or not {"protocol", "metrics", "objectives"} <= set(table):
        raise ValueError(f"{path}: not a results table (results.json of `minialign report`"
                         f"{', of a scaling sweep' if 'sizes' in table else ''})")
    return table


def flat(d, prefix=""):
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    return {key: value for k, v in d.items() for key, value in (
        flat(v, f"{prefix}{k}.").items() if isinstance(v, dict) else [(prefix + k, v)])}


def compare(results, against=None):
    """`compare RESULTS [--against FILE]`: per row and metric of the reference, agree or differs
    (noise rule); returns whether all agree. Other settings than ALLOWED: ValueError, one line."""
    against = against or DEMO
    mine, ref, names = load_results(results), load_results(against), (str(results), str(against))
    pm, pr = flat(mine["protocol"]), flat(ref["protocol"])
    said = [f"{n.removeprefix('base.')} ({pm[n]!r} in {names[0]}, {pr[n]!r} in {names[1]})"
            for n in sorted(pm.keys() & pr.keys()) if pm[n] != pr[n] and n not in ALLOWED
            and not n.endswith("_sha256")]
    if None not in (sha := {t.get("captions_sha256") for t in (mine, ref)}) and len(sha) == 2:
        said.append("the captions file (another sha256: another synthetic world?)")
    if said:
        raise ValueError(f"{names[0]}: made under another protocol than {names[1]}: "
                         f"{'; '.join(said)}; compare tables made with the same settings")
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
            same = dict(zip(got["seeds"], got[key]))
            pairs = [abs(same[i] - v) for i, v in zip(want["seeds"], want[key]) if i in same]
            lines.append((f"{where}  {'agree' if diff <= limit else f'differs by {diff:.4f}'}: "
                          f"{np.mean(got[key]):.4f} vs {np.mean(want[key]):.4f} (allowed "
                          f"{limit:.4f}; spread {s:.4f}"
                          + (f", the difference {diff / s:.2f} of it" if round(s, 4) else "")
                          + f"; seeds {len(got[key])} and {len(want[key])}"
                          + (f"; same seed up to {max(pairs):.4f})" if pairs else ")"),
                          diff <= limit))
    said = [f"--layers {t['base.model.layers']}, --dtype {t.get('base.model.dtype', 'float32')}"
            for t in (pm, pr)]
    bad = sum(not ok for _, ok in lines)
    print(f"{names[0]} ({said[0]}) against {names[1]} ({said[1]}); agree: |mean difference| <= "
          f"max(2 x spread x sqrt(1/n + 1/m), {FLOOR}), spread = the seeds' pooled std",
          *(line for line, _ in lines), f"{bad} of {len(lines)} do not agree" if bad
          else f"all {len(lines)} agree", sep="\n")
    return not bad
