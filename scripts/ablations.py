"""Each named variant (minialign/machinery/variants.py) against the objective it changes, on
one protocol: one table, OUT/ablations.md.

    python scripts/ablations.py --captions WORLD/captions_synthetic.json \\
        --embeddings WORLD/embeddings_synthetic.npz --out results/ablations \\
        [the demo's flags: --steps 500 --d-model 64 ...] [--seeds 0 1 2] [--jobs N] \\
        [--text-captions COCO_CAPTIONS]

One replicate grid (machinery/grid.py) in OUT/demo: the three objectives and every variant,
x --seeds, at --lr (no lr search). Stop it any way and rerun: finished runs are skipped, a
stopped one resumes. With --text-captions, the same objectives on those real captions at
replicate-quick's size (TEXT: one seed), text side only, in OUT/text.

A row per objective and variant; per column (test mutual kNN, R@1, paraphrase R@1, and the
real captions' paraphrase R@1) the mean over seeds, and for a variant its change from the
objective it changes and whether that change is beyond the seeds' noise by report.py's rule
(the largest difference that is noise in brackets): "0.150 (+0.030, beyond 0.012)".
"""
import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from minialign.machinery import grid, report, runs
from minialign.machinery.cli import add_config_flags, config_from_args
from minialign.machinery.variants import VARIANTS
from minialign.train import TrainConfig

THREE = ("good_views", "bad_views", "next_token")
METRICS = ("mutual_knn", "R@1", "paraphrase_R@1")        # test, where a grid has them
TEXT = {"steps": 200, "batch_photos": 128, "warmup_steps": 20, "eval_every": 50}  # quick's
TEXT_MODEL = {}      # ModelConfig fields replacing the replication's encoder there (tests: tiny)


def changes(variant):
    """The objective a variant changes: good_views_sigreg -> good_views."""
    return next(obj for obj in THREE if variant.startswith(obj))


def protocol_of(base, seeds):
    return grid.Protocol(base=base, objectives=THREE + tuple(VARIANTS), seeds=tuple(seeds),
                         lr_per_decade=0)


def text_protocol(base, captions):
    """The real captions' grid: replicate-quick's size on the replication's encoder, in
    base's layer set and dtype, one seed."""
    model = dataclasses.replace(TrainConfig().model, layers=base.model.layers,
                                dtype=base.model.dtype, **TEXT_MODEL)
    return protocol_of(dataclasses.replace(TrainConfig(), captions=str(captions), model=model,
                                           **TEXT), (0,))


def cell(values, base=None):
    """A default row's "mean ± std"; a variant's "mean (change, beyond|within noise)" against
    base, the per-seed values of the objective it changes (report.agreement); "-": no runs."""
    if base is None or not values or not base:
        return report.cells(values)[0]
    change = float(np.mean(values) - np.mean(base))
    if len(values) + len(base) <= 2:
        return f"{np.mean(values):.3f} ({change:+.3f}, 1 seed)"
    diff, allowed, _ = report.agreement(values, base)
    return (f"{np.mean(values):.3f} ({change:+.3f}, "
            f"{'beyond' if diff > allowed else 'within'} {allowed:.3f})")


def table(demo, text=None):
    """The markdown table: a row per objective of demo ({objective: {metric: [per-seed
    values]}}, report.collect's), METRICS columns and with text the real captions' paraphrase."""
    columns = [(demo, m, f"test {report.NAMES[m]}") for m in METRICS if m in demo["good_views"]]
    columns += [(text, report.TEXT_KEY, "real captions' paraphrase R@1")] if text else []
    rows = []
    for obj in demo:
        base = None if obj in THREE else changes(obj)
        rows.append([obj, base or "(default)"] + [
            cell(numbers[obj][m], base and numbers[base][m]) for numbers, m, _ in columns])
    head = ["objective", "changes"] + [h for _, _, h in columns]
    return "\n".join(report.md_table(head, rows, "ll" + "r" * len(columns))) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--captions", required=True, help="the demo's captions (a synthetic world)")
    p.add_argument("--embeddings", help="its image embeddings (without: text side only)")
    p.add_argument("--out", required=True, help="the ablations' directory")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, help="runs at once (default: grid.py's choice)")
    p.add_argument("--text-captions", help="real captions for the text-side columns")
    add_config_flags(p, skip=("objective", "captions"))
    args = p.parse_args(argv)
    try:
        base = config_from_args(args, captions=args.captions)
        grids = [(Path(args.out) / "demo", protocol_of(base, args.seeds), args.embeddings)]
        if args.text_captions and Path(args.text_captions).is_file():
            grids.append((Path(args.out) / "text", text_protocol(base, args.text_captions), None))
        else:
            print(f"[ablations] no real captions ({args.text_captions or 'no --text-captions'}): "
                  f"no real-caption column", flush=True)
        numbers = []
        for out, protocol, embeddings in grids:
            grid.replicate(protocol, out, jobs=args.jobs, embeddings=embeddings)
            numbers.append(report.collect(out, embeddings)["objectives"])
        text = table(*numbers)
        runs.atomic_write(Path(args.out) / "ablations.md", text)
    except (OSError, ValueError) as e:
        sys.exit(f"ablations.py: error: {e}")
    except KeyboardInterrupt:
        sys.exit("ablations.py: interrupted; rerun the same command to continue")
    print(text + f"[ablations] wrote {Path(args.out) / 'ablations.md'}")
    return text


if __name__ == "__main__":
    main()
