"""results.md of a replicate directory: the text of every table and paragraph, from the numbers
report.collect gathers (deterministic: same numbers, same bytes).

    format_markdown(results)   the whole file: the table (chance, the untrained encoder and the
                               world's ceiling, one row per objective, the lr-search rows), what
                               the context rows mean, the two image metrics' disagreement, the
                               good_views - next_token difference, how fast, the search, the
                               machine, the figures
"""
import math

from .figures import LABELS
from .scaling import signed

# The replication's published test numbers (3 seeds, shared lr; and with a per-method lr search)
PUBLISHED = {"good_views": {"mutual_knn": 0.320, "R@1": 0.084, "mutual_knn_lr_search": 0.328},
             "bad_views": {"mutual_knn": 0.192, "R@1": 0.063, "mutual_knn_lr_search": 0.196},
             "next_token": {"mutual_knn": 0.148, "R@1": 0.057, "mutual_knn_lr_search": 0.168}}
IMAGE_KEYS = ("mutual_knn", "R@1", "R@5", "R@10")  # test metrics from image alignment
TEXT_KEY = "paraphrase_R@1"
FIGURES = ("fig_alignment.png", "fig_curves.png", "fig_lr_search.png")


def fmt(x, sign=False):
    return "-" if x is None else signed(x, 3) if sign else f"{x:.3f}"


def cell(summary, pending):
    """'mean +/- std' and 'v0, v1, v2' for a table row; 'pending' without image numbers."""
    if pending:
        return "pending", "pending"
    if summary is None:
        return "-", "-"
    spread = f" ± {summary['std']:.3f}" if summary["std"] is not None else " (1 seed)"
    return fmt(summary["mean"]) + spread, ", ".join(fmt(v) for v in summary["values"])


def tokenizer_words(base):
    """The protocol line's tokenizer: "word tokenizer" or "WordPiece tokenizer (`FILE`)"."""
    if base.get("tokenizer", "words") == "wordpiece":
        return f"WordPiece tokenizer (`{base['vocab']}`)"
    return "word tokenizer"


def dtype_words(model):
    """The protocol line's arithmetic: "" in float32 (the replication's), else " in float64"."""
    return f" in {model['dtype']}" if model.get("dtype", "float32") != "float32" else ""


def format_markdown(results):
    """results.md: the table, the difference, the lr search, the machine (deterministic)."""
    p, image, chance = results["protocol"], results["image"], results["chance"]
    base, model = p["base"], p["base"]["model"]
    lines = [f"# Replication results: {results['dataset']}", "",
             f"{len(p['objectives'])} objectives x seeds {', '.join(map(str, p['seeds']))}: "
             f"{base['steps']} steps of {base['batch_photos']} photos (two captions each), "
             f"lr {base['lr']:g} for every objective, encoder D={model['d_model']} "
             f"L={model['n_layers']}{dtype_words(model)}, {tokenizer_words(base)}; captions "
             f"`{base['captions']}`"
             f"{' (SYNTHETIC world ' + results['world'] + ')' if results.get('world') else ''}"
             f". Test split; image metrics "
             f"are means over the 5 caption slots (R@1: caption -> image after an orthogonal "
             f"rotation fitted on the train photos); paraphrase R@1 is text-only. "
             f"mean ± sample std (ddof 1) over seeds.", "", choices_line(base), "",
             "| objective | mutual-kNN@10 | per seed | published | R@1 | per seed | published "
             "| paraphrase R@1 |", "|---|---:|---|---:|---:|---|---:|---:|"]
    mknn, r1 = (fmt(chance.get("mutual_knn")), fmt(chance.get("R@1"))) if image else ("pending",) * 2
    lines.append(f"| chance | {mknn} | | | {r1} | | | {fmt(chance.get(TEXT_KEY))} |")
    lines += context_rows(results)
    other_images = image and not results["comparable"]     # e.g. the synthetic world
    published = {} if other_images else PUBLISHED           # then its column stays blank
    for obj, row in results["objectives"].items():
        pub = published.get(obj, {})
        mknn, r1 = cell(row.get("mutual_knn"), not image), cell(row.get("R@1"), not image)
        lines.append(f"| {obj} | {mknn[0]} | {mknn[1]} | {fmt(pub.get('mutual_knn'))} | "
                     f"{r1[0]} | {r1[1]} | {fmt(pub.get('R@1'))} | {cell(row[TEXT_KEY], 0)[0]} |")
    for obj in results["objectives"]:                # the same rows with the search off
        search = results["lr_search"].get(obj, {"chosen": None, "test": None})
        test = search["test"] or {}
        name = (f"{obj}, lr search ({search['chosen']:.2e}, seed {p['seeds'][0]})"
                if search["chosen"] else f"{obj}, lr search (incomplete)"
                if obj in results["lr_search"] else f"{obj}, lr search (not run)")
        pub = fmt(published.get(obj, {}).get("mutual_knn_lr_search"))
        pend = "pending" if not image and search["chosen"] else None
        lines.append(f"| {name} | {pend or fmt(test.get('mutual_knn'))} | | {pub} | "
                     f"{pend or fmt(test.get('R@1'))} | | | {fmt(test.get(TEXT_KEY))} |")
    if image:
        lines += ["", f"Image embeddings: {', '.join(results['embeddings_models'])}."]
    if other_images:
        lines += ["", f"The published column (the COCO replication's numbers, DINOv2 image "
                      f"embeddings) is left blank: these runs were scored against "
                      f"{', '.join(results['embeddings_models'])}, so compare the ordering of "
                      f"the objectives with the replication's, not the values."]
    lines += [""] + context_lines(results) + disagreement_lines(results)
    lines += [""] + difference_lines(results) + [""]
    lines += speed_lines(results) + [""]
    if not image:
        lines += [f"Image alignment pending: {results['evaluated_runs']} of "
                  f"{results['finished_runs']} finished runs have been scored against the image "
                  f"embeddings. Rerun `replicate` with the embeddings (finished runs are skipped) "
                  f"or run `python -m minialign evaluate --embeddings E --run DIR ...`, then "
                  f"`python -m minialign report` on this directory.", ""]
    lines += search_lines(results) + environment_lines(results)
    lines += ["", "## Figures", ""] + [f"![{f[4:-4]}]({f})" for f in FIGURES]
    return "\n".join(lines) + "\n"


def choices_line(base):
    """The protocol line of the choices the replication's write-up leaves unsaid, as these
    runs made them (docs/protocol.md; a protocol saved before them: today's defaults)."""
    model, loss = base["model"], base["loss"]
    width, last = model.get("projector_dim", 0), model.get("causal_pool") == "last"
    return (f"Choices the write-up leaves unsaid (docs/protocol.md): VICReg projector "
            f"{f'{width} wide' if width else 'none'}; next_token's caption vector "
            f"{'the last token' if last else 'the mean of its tokens'}"
            f"; bad_views' masked words "
            f"{'dropped' if loss.get('mask_mode') == 'drop' else 'replaced by MASK'}; "
            f"parameters the loss cannot see (ln_f.beta under VICReg alone) "
            f"{'frozen' if loss.get('unseen_params') == 'freeze' else 'trained'}.")


def context_rows(results):
    """The rows under chance: the untrained encoder of each attention (baselines.py), the
    world's ceiling (synthetic worlds only)."""
    image, rows = results["image"], []
    for kind, row in results["untrained"].items():
        mknn, r1 = cell(row.get("mutual_knn"), not image), cell(row.get("R@1"), not image)
        rows.append(f"| untrained encoder, {kind} ({', '.join(row['objectives'])}) | {mknn[0]} | "
                    f"{mknn[1]} | | {r1[0]} | {r1[1]} | | {cell(row[TEXT_KEY], False)[0]} |")
    if results["ceiling"] is not None:
        world = f"world {results['world']} " if results.get("world") else "world "
        rows.append(f"| {world}ceiling (scene factors vs images) | {fmt(results['ceiling'])} "
                    f"| | | - | | | - |")
    return rows


def context_lines(results):
    """What the rows under chance mean (below the table)."""
    line = ("Untrained encoder: each seed's encoder at step 0 (the weights its runs start from), "
            "scored like the runs: what the architecture gives before training." if
            results["untrained"] else f"Untrained encoder: not scored (the captions file "
            f"`{results['protocol']['base']['captions']}` is not at hand).")
    return [line + (" World ceiling: mutual-kNN@10 between the synthetic world's scene factors "
                    "and its image embeddings on the test photos, what an encoder that recovered "
                    "every scene exactly would score." if results["ceiling"] is not None else "")
            ] + below_untrained_lines(results)


def below_untrained_lines(results):
    """A sentence naming, per image metric, the objectives whose test mean is below the
    untrained encoder of their own attention (none: no sentence)."""
    below = {}
    for key in ("mutual_knn", "R@1"):
        for row in results["untrained"].values():
            for obj in row["objectives"]:
                mine, base = results["objectives"].get(obj, {}).get(key), row.get(key)
                if mine and base and mine["mean"] < base["mean"]:
                    below.setdefault(key, []).append(obj)
    if not below:
        return []
    which = "; ".join(f"{', '.join(objs)} in {LABELS[key]}" for key, objs in below.items())
    return ["", f"Below the untrained encoder: {which}. Training with these moved the text "
                f"embeddings away from an alignment the architecture already has at random "
                f"initialisation; read every gain against that row, not against chance."]


def disagreement_lines(results):
    """A paragraph when the two image metrics tell different stories: the objectives in another
    order by test mutual-kNN@10 than by R@1, or an objective above its untrained encoder by
    one metric and below it by the other (none: no paragraph; docs/results.md explains)."""
    if not results["image"]:
        return []
    rows = {o: r for o, r in results["objectives"].items() if r.get("mutual_knn")}
    order = {key: sorted(rows, key=lambda o: -rows[o][key]["mean"])
             for key in ("mutual_knn", "R@1")}
    untrained = {o: u for u in results["untrained"].values() for o in u["objectives"]}
    split = [o for o in rows if o in untrained and all(untrained[o].get(k) for k in order)
             and len({rows[o][k]["mean"] > untrained[o][k]["mean"] for k in order}) == 2]
    if order["mutual_knn"] == order["R@1"] and not split:
        return []
    said = ([f"by {LABELS[k]} the order is {' > '.join(order[k])}" for k in order]
            if order["mutual_knn"] != order["R@1"] else
            [f"both order the objectives {' > '.join(order['R@1'])}, but"])
    for o in split:
        up = next(k for k in order if rows[o][k]["mean"] > untrained[o][k]["mean"])
        down = next(k for k in order if k != up)
        said.append(f"{o} is above the untrained encoder in {LABELS[up]} and below it in "
                    f"{LABELS[down]}")
    return ["", f"The two image metrics disagree: {'; '.join(said).replace('but;', 'but')}. "
                f"Mutual-kNN@10 asks whether "
                f"a caption's nearest captions belong to its image's nearest images (no fitting); "
                f"R@1 asks whether one rotation fitted on the train photos puts each test caption "
                f"nearest its own image. Neither is the whole story: see docs/results.md."]


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
             "| objective | val score at each lr (chosen in bold) | chosen lr | interior | "
             "margin over the next best |", "|---|---|---:|---|---|"]
    for obj, s in results["lr_search"].items():
        points = ", ".join(
            (f"**{lr:.2e}: {fmt(v) if not isinstance(v, str) else v}**" if lr == s["chosen"]
             else f"{lr:.2e}: {v if isinstance(v, str) else fmt(v)}")
            for lr, v in zip(s["lrs"], s["scores"]))
        where = ("yes" if s["interior"] else "no: on the edge after the allowed extensions"
                 ) if s["chosen"] else f"incomplete, next: {s['todo']:.2e}"
        lines.append(f"| {obj} | {points} | {fmt_lr(s['chosen'])} | {where} | "
                     f"{margin_words(s)} |")
    unresolved = [obj for obj, s in results["lr_search"].items() if unresolved_pick(s)]
    if unresolved:
        lines += ["", f"Not resolved: {', '.join(unresolved)}. Each lr is scored on one seed, so "
                  f"two scores differ by seed noise alone by up to two standard errors, 2 x "
                  f"sqrt(2) x the seeds' spread (the sample std of the same score over the "
                  f"seed grid at the shared lr, as `compare` judges two tables); a pick within "
                  f"that may be another lr on another seed, or under another machine's "
                  f"rounding (docs/protocol.md)."]
    return lines + [""]


def noise_margin(search):
    """Two standard errors of a difference of two one-seed scores: 2 sqrt(2) x the seeds'
    spread (report.pick_margin's val_spread); None without a spread."""
    spread = search.get("val_spread")
    return None if spread is None else 2 * math.sqrt(2) * spread


def unresolved_pick(search):
    """Whether a search's pick beats the next best lr by no more than noise_margin."""
    margin, noise = search.get("margin"), noise_margin(search)
    return margin is not None and noise is not None and margin <= noise


def margin_words(search):
    """'+0.004 (resolved: noise < 0.003)', '+0.001 (not resolved: noise up to 0.003)', or
    '-' (report.pick_margin)."""
    margin, noise = search.get("margin"), noise_margin(search)
    if margin is None:
        return "-"
    if noise is None:
        return f"{signed(margin, 3)} (one seed: no spread)"
    return (f"{signed(margin, 3)} (not resolved: noise up to {noise:.3f})" if margin <= noise
            else f"{signed(margin, 3)} (resolved: noise < {noise:.3f})")


def fmt_lr(lr):
    return "-" if lr is None else f"{lr:.2e}"


def environment_lines(results):
    env, minutes = results["environment"] or {}, results["wall_seconds"] / 60
    threads = " ".join(f"{k}={v}" for k, v in sorted(env.get("thread_env", {}).items()))
    return ["## Environment", "",
            f"- numpy {env.get('numpy', '?')}, BLAS {env.get('blas', '?')}"
            f"{f' ({core} kernel)' if (core := env.get('blas_core')) else ''}, "
            f"{env.get('cpus', '?')} CPUs ({env.get('cpu', '?')}), thread settings "
            f"{threads or 'none (the BLAS default)'}",
            f"- Python {env.get('python', '?')} on {env.get('platform', '?')}",
            f"- {env.get('jobs', 1)} run(s) at a time, {env.get('threads_per_run') or 'all'} "
            f"core(s) each; the runs' own times add up to {minutes:.1f} min over "
            f"{len(results['runs'])} runs (training and text-side evaluation; runs side by side "
            f"overlap, so the grid took less on the clock)"]


def speed_lines(results):
    """The "aligns faster" table of results.md."""
    what = LABELS[results["metric"]] if results["image"] else "paraphrase R@1"
    lines = [f"How fast (val {what}; steps on the evaluation grid): steps to reach next_token's "
             f"final value at the same seed, to 50% and 90% of the run's own final value, and "
             f"the curve's mean over training (area under it / steps). In fig_curves.png the "
             f"dashed line is next_token's final value (mean over seeds) and each ▼ on it marks "
             f"the mean step at which an objective first reaches it.", "",
             "| objective | steps to next_token's final | to 50% | to 90% | curve mean |",
             "|---|---:|---:|---:|---:|"]
    for obj, row in results["speed"].items():
        def steps(key):
            v = row[key]
            return "-" if v is None else f"{v['mean']:.0f}" + (
                f" ± {v['std']:.0f}" if v["std"] is not None else "")
        late = f" ({row['not_reached']} seed(s) never)" if row["not_reached"] else ""
        auc = row["auc"]
        lines.append(f"| {obj} | {steps('steps_to_target')}{late} | {steps('steps_to_50')} | "
                     f"{steps('steps_to_90')} | {cell(auc, False)[0] if auc else '-'} |")
    return lines
