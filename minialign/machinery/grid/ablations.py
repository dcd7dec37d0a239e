"""Each choice the replication's write-up leaves unsaid, flipped alone, on replicate's machinery.

    python -m minialign ablations --captions WORLD --embeddings WORLD_EMB --out results/ablations \
        [--text-captions COCO_CAPTIONS]  (make ablations: the demo's flags)

For the default and each CHOICES entry, the protocol of the flags given (make ablations: the
demo's, objectives x seeds at one lr, no search) with that one setting flipped, as a replicate
grid in out/demo/<variant>/ (runs/, protocol.json: replicate.replicate, so a rerun skips the
finished runs and resumes the one in progress). A choice runs only the objectives it changes;
the others' cells read "= default" (the same runs would be trained). With --text-captions
(real captions), the same variants at replicate-quick's size (TEXT: one seed, 200 steps x 128
photos, the replication's encoder), text-side only, in out/text/<variant>/.

One table (out/ablations.md, printed; numbers in out/ablations.json): a row per choice, per
objective its test mutual-kNN, R@1 and paraphrase R@1 (and the real captions' paraphrase R@1),
each with its change from the default and whether the change is within the seeds' spread
(change_cell: the larger sample std over seeds, ddof 1, of the two rows).
"""
import dataclasses
import time
from pathlib import Path

import numpy as np

from ...train import TrainConfig
from ..experiment.protocol import Protocol, run_config, run_name
from ..experiment.report import run_numbers
from ..run.files import atomic_write_bytes, atomic_write_json
from ..run.flags import CHOICE_FIELDS, MODEL_FIELDS, LOSS_FIELDS
from . import replicate

METRICS = ("mutual_knn", "R@1", "paraphrase_R@1")       # the demo's columns, per objective
TEXT_METRIC = "paraphrase_R@1"                         # the real captions' column
PROJECTOR_RATIO = 4   # the flipped projector is 4 D wide (VICReg's expander: 8192 over 2048)
# replicate-quick's protocol (the Makefile's QUICK_ARGS), for the real captions' columns
TEXT = {"seeds": (0,), "steps": 200, "batch_photos": 128, "warmup_steps": 20, "eval_every": 50}
TEXT_MODEL = {}       # ModelConfig fields replacing the replication's encoder there (tests: tiny)


@dataclasses.dataclass(frozen=True)
class Choice:
    """One unsaid choice: the config field it sets, its flipped value (a function of the base
    TrainConfig), the objectives it changes, and how the table names it."""
    name: str
    field: str
    flipped: object
    objectives: tuple
    label: str


CHOICES = (
    Choice("projector", "projector_dim", lambda base: PROJECTOR_RATIO * base.model.d_model,
           ("good_views", "bad_views", "next_token"), "VICReg projector, 4 D wide (default: none)"),
    Choice("last-token", "causal_pool", lambda base: "last", ("next_token",),
           "next_token z: last token's state (default: mean over tokens)"),
    Choice("drop-words", "mask_mode", lambda base: "drop", ("bad_views",),
           "bad_views: masked words dropped (default: replaced by MASK)"),
    Choice("freeze-unseen", "unseen_params", lambda base: "freeze", ("good_views", "bad_views"),
           "ln_f.beta frozen under VICReg alone (default: trained on rounding noise)"),
)
assert {c.field for c in CHOICES} == set(CHOICE_FIELDS)


def flip(base, choice):
    """base (a TrainConfig) with choice.field set to its flipped value."""
    value = choice.flipped(base)
    if choice.field in MODEL_FIELDS:
        return dataclasses.replace(base, model=dataclasses.replace(base.model,
                                                                   **{choice.field: value}))
    if choice.field in LOSS_FIELDS:
        return dataclasses.replace(base, loss=dataclasses.replace(base.loss,
                                                                  **{choice.field: value}))
    return dataclasses.replace(base, **{choice.field: value})


def variants(protocol):
    """{variant name: Protocol}: "default" (protocol itself), then each choice flipped over the
    objectives it changes (those of protocol.objectives), the lr search off."""
    protocol = dataclasses.replace(protocol, lr_per_decade=0)
    found = {"default": protocol}
    for choice in CHOICES:
        objectives = tuple(o for o in protocol.objectives if o in choice.objectives)
        if objectives:
            found[choice.name] = dataclasses.replace(protocol, base=flip(protocol.base, choice),
                                                     objectives=objectives)
    return found


def text_protocol(protocol, captions):
    """The real captions' protocol: replicate-quick's (TEXT) with protocol's objectives, on the
    replication's encoder (TrainConfig's model, in protocol's layer set) at its default lr."""
    model = dataclasses.replace(TrainConfig().model, layers=protocol.base.model.layers,
                                **TEXT_MODEL)
    base = dataclasses.replace(TrainConfig(), captions=str(captions), model=model,
                               **{k: v for k, v in TEXT.items() if k != "seeds"})
    return Protocol(base=base, objectives=protocol.objectives, seeds=TEXT["seeds"],
                    lr_per_decade=0)


# ---------------------------------------------------------------- running
def run_all(grids, emb, jobs=1, threads=None):
    """replicate.replicate of every (out, Protocol, emb-or-None) in grids, in order; finished
    runs are skipped, the run in progress resumes."""
    for out, protocol, grid_emb in grids:
        Path(out).mkdir(parents=True, exist_ok=True)
        print(f"[ablations] {out}: {', '.join(protocol.objectives)} x seeds "
              f"{', '.join(map(str, protocol.seeds))}", flush=True)
        replicate.replicate(protocol, out, grid_emb, progress=False, jobs=jobs, threads=threads)


def seed_values(out, protocol, objective, metric):
    """The test `metric` of each finished seed run of `objective` in the grid `out` (a run not
    started has no config.json: none)."""
    values = []
    for seed in protocol.seeds:
        run_dir = Path(out) / "runs" / run_name(run_config(protocol, objective, seed))
        numbers = run_numbers(run_dir) if (run_dir / "config.json").is_file() else {}
        if numbers.get("status") == "finished" and metric in numbers["test"]:
            values.append(numbers["test"][metric])
    return values


def collect(grids, metrics):
    """{variant: {objective: {metric: [per-seed values]}}} of the grids {variant: (out,
    Protocol)}; an objective a variant does not run is absent."""
    return {name: {obj: {m: seed_values(out, protocol, obj, m) for m in metrics}
                   for obj in protocol.objectives} for name, (out, protocol) in grids.items()}


# ---------------------------------------------------------------- the table
def spread(values):
    """The seeds' spread: sample std (ddof 1); None for fewer than two values."""
    return float(np.std(values, ddof=1)) if len(values) >= 2 else None


def change_cell(default, values):
    """One cell: the variant's mean over seeds, its change from the default's mean, and whether
    that change is within the seeds' spread (the larger of the two rows' spread: |change| <=
    spread). default, values: per-seed numbers. E.g. "0.035 (+0.004, within spread 0.006)",
    "0.050 (+0.019, beyond spread 0.006)", "0.120 (+0.010, 1 seed)"; "-" when either is empty."""
    if not default or not values:
        return "-"
    change = float(np.mean(values)) - float(np.mean(default))
    spreads = [s for s in (spread(default), spread(values)) if s is not None]
    if not spreads:
        return f"{np.mean(values):.3f} ({change:+.3f}, {min(len(default), len(values))} seed)"
    width = max(spreads)
    where = "within" if abs(change) <= width else "beyond"
    return f"{np.mean(values):.3f} ({change:+.3f}, {where} spread {width:.3f})"


def default_cell(values):
    """The default row's cell: mean ± spread, or the one seed's value."""
    if not values:
        return "-"
    s = spread(values)
    return f"{np.mean(values):.3f}" + (f" ± {s:.3f}" if s is not None else "")


def format_table(demo, text=None, labels=None):
    """The markdown table: a row per variant of demo ({variant: {objective: {metric:
    [values]}}}, collect's), a column per objective x METRICS, and with text (the real
    captions' collect) one more per objective. labels: {variant: row label}."""
    objectives = list(demo["default"])
    columns = [(obj, m) for obj in objectives for m in METRICS]
    text_columns = [obj for obj in objectives if text]
    head = [f"{obj} {m}" for obj, m in columns] + [f"{obj} real-caption {TEXT_METRIC}"
                                                    for obj in text_columns]
    lines = ["| choice | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for name in demo:
        cells = []
        for obj, m in columns:
            cells.append(cell_of(demo, name, obj, m))
        for obj in text_columns:
            cells.append(cell_of(text, name, obj, TEXT_METRIC))
        lines.append(f"| {(labels or {}).get(name, name)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cell_of(numbers, name, objective, metric):
    """The cell of variant `name`, as default_cell or change_cell; "= default" for an objective
    the variant does not change."""
    default = numbers["default"].get(objective, {}).get(metric, [])
    if name == "default":
        return default_cell(default)
    if objective not in numbers.get(name, {}):
        return "= default"
    return change_cell(default, numbers[name][objective][metric])


def run_ablations(protocol, args, emb):
    """The command: every grid (demo, then the real captions' if given and present), then the
    table into out/ablations.md and the numbers into out/ablations.json. Returns the table."""
    out, t0 = Path(args.out), time.perf_counter()
    demo = {name: (out / "demo" / name, p) for name, p in variants(protocol).items()}
    text = {}
    if args.text_captions and Path(args.text_captions).is_file():
        text = {name: (out / "text" / name, p) for name, p in
                variants(text_protocol(protocol, args.text_captions)).items()}
    else:
        print(f"[ablations] no real captions ({args.text_captions or 'no --text-captions'}): "
              f"their columns are skipped (`make data` fetches COCO's)", flush=True)
    run_all([(o, p, emb) for o, p in demo.values()], emb, args.jobs, args.threads)
    run_all([(o, p, None) for o, p in text.values()], None, args.jobs, args.threads)
    numbers = {"demo": collect(demo, METRICS),
               "text": collect(text, (TEXT_METRIC,)) if text else None}
    labels = {"default": "default (today's)", **{c.name: c.label for c in CHOICES}}
    table = format_table(numbers["demo"], numbers["text"], labels)
    minutes = (time.perf_counter() - t0) / 60
    atomic_write_json(out / "ablations.json", {**numbers, "minutes_this_session": minutes})
    atomic_write_bytes(out / "ablations.md", (table + "\n").encode())
    print(table)
    print(f"[ablations] {minutes:.1f} min this session; wrote {out / 'ablations.md'}", flush=True)
    return table
