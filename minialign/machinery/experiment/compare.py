"""Results directories side by side, e.g. the same grid under VICReg and under SIGReg:

    python -m minialign report results/synthetic results/synthetic-sigreg [--out FILE]

Reads each directory as `report` does (report.collect, which may compute and save its
baselines.json; its results.md and figures are left as they are) and writes one table: the
rows chance, untrained encoder, world ceiling, then each objective; for each test metric one
column per directory, mean ± sample std (ddof 1) over seeds, then the steps each objective
needs to reach next_token's final val value ("aligns faster"). A column is named after its
directory's anti-collapse term (--anticollapse) when those differ, else after the directory.
The protocols should differ in the anti-collapse term only; any other difference is listed
above the table. Printed, and written to FILE (default: compare_<A>_<B>.md in the first
directory's parent, i.e. beside the directories).
"""
import json
from pathlib import Path

from .figures import LABELS
from ..run.files import atomic_write_bytes
from .report import IMAGE_KEYS, TEXT_KEY, cell, collect, fmt, not_results_dir


def anticollapse_of(results):
    """The anti-collapse term of a results dict's protocol ("vicreg" for one saved before it)."""
    return results["protocol"]["base"].get("loss", {}).get("anticollapse", "vicreg")


def flat(d, prefix=""):
    """{"a": {"b": 1}} -> {"a.b": 1}: a protocol's settings, one key each."""
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def protocol_differences(all_results):
    """Settings of the protocols that differ between the directories, besides the anti-collapse
    term and its own settings (sorted names)."""
    settings = [flat(r["protocol"]) for r in all_results]
    names = set().union(*settings)
    return sorted(n for n in names if len({repr(s.get(n)) for s in settings}) > 1
                  and n != "base.loss.anticollapse" and not n.startswith("base.loss.sigreg_"))


def compare_rows(all_results, keys):
    """The table's body: [label, then per key one cell per directory]."""
    def cells(value_of):
        return [value_of(r, key) for key in keys for r in all_results]

    def pending(r, key):
        return key in IMAGE_KEYS and not r["image"]
    rows = [["chance"] + cells(lambda r, key: "pending" if pending(r, key)
                               else fmt(r["chance"].get(key)))]
    kinds = dict.fromkeys(k for r in all_results for k in r["untrained"])
    for kind in kinds:
        objectives = next(r["untrained"][kind]["objectives"] for r in all_results
                          if kind in r["untrained"])
        rows.append([f"untrained encoder, {kind} ({', '.join(objectives)})"] + cells(
            lambda r, key: cell(r["untrained"].get(kind, {}).get(key), pending(r, key))[0]))
    if any(r["ceiling"] is not None for r in all_results):
        rows.append(["world ceiling (scene factors vs images)"] + cells(
            lambda r, key: fmt(r["ceiling"]) if key == "mutual_knn" else "-"))
    objectives = dict.fromkeys(o for r in all_results for o in r["objectives"])
    for obj in objectives:
        rows.append([obj] + cells(lambda r, key: cell(
            r["objectives"].get(obj, {}).get(key), pending(r, key))[0]))
    return rows


def steps_cell(results, obj):
    """'mean ± std' steps to next_token's final val value, '(n never)' for the seeds that do
    not get there, or '-'."""
    speed = results["speed"].get(obj, {})
    row, never = speed.get("steps_to_target"), speed.get("not_reached")
    late = f" ({never} never)" if never else ""
    if row is None:
        return "-" + late
    return f"{row['mean']:.0f}" + (f" ± {row['std']:.0f}" if row["std"] is not None else "") + late


def format_compare(dirs, all_results):
    """The side-by-side markdown (deterministic for the same runs)."""
    names = [anticollapse_of(r) for r in all_results]
    if len(set(names)) < len(names):
        names = [Path(d).name for d in dirs]
    image = all(r["image"] for r in all_results)
    keys = (*IMAGE_KEYS[:2], TEXT_KEY) if any(r["image"] for r in all_results) else (TEXT_KEY,)
    lines = [f"# Side by side: {' | '.join(f'`{d}` ({n})' for d, n in zip(dirs, names))}", "",
             "Test split, mean ± sample std (ddof 1) over seeds; image metrics are means over "
             "caption slots (R@1 after a rotation fitted on the train photos); the untrained "
             "encoder is each seed's encoder at step 0; the world ceiling is mutual-kNN@10 "
             "between the synthetic world's scene factors and its images.", ""]
    differ = protocol_differences(all_results)
    lines += [f"Other protocol settings that differ: {', '.join(differ)}." if differ else
              "The protocols differ in the anti-collapse term only.", ""]
    lines += ["| | " + " | ".join(f"{LABELS[k].split(',')[0]}, {n}" for k in keys for n in names)
              + " |", "|---|" + "---:|" * (len(keys) * len(names))]
    lines += ["| " + " | ".join(row) + " |" for row in compare_rows(all_results, keys)]
    what = LABELS[all_results[0]["metric"]] if image else "paraphrase R@1"
    lines += ["", f"Steps to reach next_token's final val {what} at the same seed (mean ± std "
              f"over seeds, on the evaluation grid):", "",
              "| objective | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for obj in dict.fromkeys(o for r in all_results for o in r["objectives"]):
        lines.append(f"| {obj} | " + " | ".join(steps_cell(r, obj) for r in all_results) + " |")
    return "\n".join(lines) + "\n"


def default_path(dirs):
    """compare_<A>_<B>.md beside the first directory."""
    return Path(dirs[0]).parent / ("compare_" + "_".join(Path(d).name for d in dirs) + ".md")


def run_compare(dirs, out=None):
    """`python -m minialign report DIR_A DIR_B ...`: print the side-by-side table and write it
    to `out` (default_path). Raises FileNotFoundError naming a directory without
    protocol.json, ValueError for a directory given twice."""
    dirs = [Path(d) for d in dirs]
    if len({d.resolve() for d in dirs}) < len(dirs):
        raise ValueError(f"{dirs[0]}: a directory is given twice; compare different ones")
    kinds = {}
    for d in dirs:
        if not (d / "protocol.json").is_file():
            raise FileNotFoundError(not_results_dir(d))
        kinds[d] = json.loads((d / "protocol.json").read_text()).get("kind", "replicate")
    if any(kind != "replicate" for kind in kinds.values()):
        d, kind = next((d, k) for d, k in kinds.items() if k != "replicate")
        raise ValueError(f"{d}: a {kind} sweep; `report DIR_A DIR_B` compares replicate "
                         f"directories (report a sweep on its own: `report {d}`)")
    text = format_compare(dirs, [collect(d) for d in dirs])
    out = Path(out) if out else default_path(dirs)
    atomic_write_bytes(out, text.encode())
    print(text + f"\nwrote {out}")
    return text
