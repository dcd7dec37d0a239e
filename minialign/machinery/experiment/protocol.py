"""The protocol, written and read by `replicate`, `scaling` and `report` alike: the grid
(objectives x seeds at one shared lr; a scaling sweep adds encoder sizes), the run names,
protocol.json, and the learning-rate search replayed over the runs that exist (a pure
function of their scores).

Two kinds share one Protocol and one runner (replicate.run_grid):
    "replicate"  objectives x seeds at base's encoder, plus the per-objective lr search;
    "scaling"    objectives x seeds x sizes, each size (D, L) an encoder of scaling.size_config
                 (H = D / 64, F = 4 D), no lr search. Its runs are SizedConfigs, whose names
                 carry the size: good_views-d128-l4-lr1.00e-03-seed0.
"""
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from ...train import TrainConfig
from ..run.checkpoint import changed_fields, input_difference
from ..run.files import atomic_write_json, read_json
from ..run.rundir import is_diverged, read_metrics, upgrade_config
from ..run.scores import current_alignment
from .scaling import size_config

OBJECTIVE_ORDER = ("good_views", "bad_views", "next_token")  # the replication's table order
SEEDS = (0, 1, 2)
LR_MIN, LR_MAX, LR_PER_DECADE = 1e-4, 1e-2, 2   # search grid 1e-4, 3.16e-4, ..., 1e-2
MAX_EXTENSIONS = 2                               # grid points added beyond an edge, at most
LR_DIGITS = 3                                    # significant digits of a grid lr
KINDS = ("replicate", "scaling")
OLD_PROTOCOL_DEFAULTS = {"kind": "replicate", "sizes": []}   # protocol.json before the sweep
LR_SEARCH_FIELDS = ("lr_min", "lr_max", "lr_per_decade", "max_extensions")  # not the seed grid's


@dataclasses.dataclass(frozen=True)
class Protocol:
    """The grid. `base` is every run's TrainConfig except objective, seed and lr (and, in a
    sweep, the encoder's size); base.lr is the shared lr of the seed grid. lr_per_decade = 0
    turns the search off. kind "scaling": sizes is ((D, L), ...), at least one, and there is
    no lr search. Raises ValueError (one line) for fields that disagree, or a size whose
    ModelConfig is refused (a D that its heads, max(1, D // 64), do not divide)."""
    base: TrainConfig
    objectives: tuple = OBJECTIVE_ORDER
    seeds: tuple = SEEDS
    lr_min: float = LR_MIN
    lr_max: float = LR_MAX
    lr_per_decade: int = LR_PER_DECADE
    max_extensions: int = MAX_EXTENSIONS
    kind: str = "replicate"
    sizes: tuple = ()

    def __post_init__(self):
        if isinstance(self.base, dict):
            object.__setattr__(self, "base",
                               TrainConfig(**upgrade_config(self.base)))
        object.__setattr__(self, "objectives", tuple(self.objectives))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "sizes", tuple(tuple(size) for size in self.sizes))
        if self.kind not in KINDS:
            raise ValueError(f"protocol kind {self.kind!r}: must be one of {', '.join(KINDS)}")
        if (self.kind == "scaling") != bool(self.sizes):
            raise ValueError(f"a {self.kind} protocol {'needs' if self.sizes == () else 'takes no'}"
                             f" encoder sizes, got {list(self.sizes)}")
        if self.kind == "scaling" and self.lr_per_decade:
            raise ValueError("a scaling sweep has no lr search (lr_per_decade must be 0)")
        for d_model, n_layers in self.sizes:
            try:
                size_config(d_model, n_layers, self.base.model.vocab_size,
                            self.base.model.max_len)
            except (TypeError, ValueError) as err:
                raise ValueError(f"encoder size D={d_model}, L={n_layers}: {err}") from None
        if self.lr_per_decade and grid_points(self) < 2:
            raise ValueError(f"the lr search needs lr_max > lr_min, got {self.lr_min} and "
                             f"{self.lr_max}")


@dataclasses.dataclass(frozen=True)
class SizedConfig(TrainConfig):
    """A TrainConfig of a scaling sweep: the same fields, and a run name (run_name) that
    carries the encoder's size, so runs of one objective, lr and seed at several sizes live
    side by side in runs/. It pickles to a --jobs child and is saved as a TrainConfig."""


def grid_points(protocol):
    """Number of points of the initial lr grid: lr_min .. lr_max, lr_per_decade per decade."""
    return round(math.log10(protocol.lr_max / protocol.lr_min) * protocol.lr_per_decade) + 1


def grid_lr(protocol, k):
    """The k-th lr of the search grid, k = 0 .. grid_points - 1, or beyond for an extension:
    lr_min * 10^(k / lr_per_decade), rounded to LR_DIGITS significant digits (1e-3, 3.16e-3).
    Computed from the integer k, so repeated extensions never drift."""
    return float(f"{protocol.lr_min * 10 ** (k / protocol.lr_per_decade):.{LR_DIGITS}g}")


def run_config(protocol, objective, seed, lr=None, size=None):
    """The TrainConfig of one run (lr None: the seed grid's shared lr). size: (D, L) of a
    scaling sweep, which returns a SizedConfig with scaling.size_config's encoder."""
    cfg = dataclasses.replace(protocol.base, objective=objective, seed=seed,
                              lr=protocol.base.lr if lr is None else lr)
    if size is None:
        return cfg
    m = cfg.model
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    return SizedConfig(**{**fields, "model": size_config(*size, m.vocab_size, m.max_len,
                                                         m.layers, m.dtype)})


def seed_grid(protocol):
    """Every objective x seed (x size, in a sweep) at the shared lr: seed-major (an early stop
    leaves every objective, and every size, with a seed); within a seed, the sizes in the
    protocol's order, each with every objective."""
    return [run_config(protocol, obj, seed, size=size) for seed in protocol.seeds
            for size in (protocol.sizes or (None,)) for obj in protocol.objectives]


def planned_runs(protocol):
    """The runs known before any result, in the order replicate starts them: the seed grid
    (seed_grid), then each objective's initial lr grid on the first seed. A name may appear
    twice (a grid lr equal to the shared lr is the seed grid's run); extensions of the search
    come later (lr_search)."""
    first_search = [run_config(protocol, obj, protocol.seeds[0], grid_lr(protocol, k))
                    for obj in protocol.objectives
                    for k in range(grid_points(protocol) if protocol.lr_per_decade else 0)]
    return seed_grid(protocol) + first_search


def run_name(cfg):
    """Run directory name, e.g. good_views-lr1.00e-03-seed0; a SizedConfig's carries its
    encoder's width and depth: good_views-d128-l4-lr1.00e-03-seed0."""
    size = f"-d{cfg.model.d_model}-l{cfg.model.n_layers}" if isinstance(cfg, SizedConfig) else ""
    return f"{cfg.objective}{size}-lr{cfg.lr:.2e}-seed{cfg.seed}"


def group_of(name):
    """What a run name shares with the runs it times like: its objective (and size, in a
    sweep), the name before "-lr": good_views-d128-l4-lr1.00e-03-seed0 -> good_views-d128-l4."""
    return name.split("-lr")[0]


def load_protocol(out):
    """The Protocol saved in out/protocol.json. Raises FileNotFoundError / ValueError, one
    line starting with the file: missing, empty, truncated, not a JSON object, or not a
    protocol of this minialign."""
    path = Path(out) / "protocol.json"
    saved = read_json(path, "replicate protocol (protocol.json)")
    try:
        return Protocol(**saved)
    except (TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{path}: not a protocol of this minialign ({err})") from None


def holds_runs(out):
    """Whether out/runs/ holds a run directory that has started (written its config.json)."""
    return any(Path(out).glob("runs/*/config.json"))


def differences(old, new):
    """The settings two saved protocols differ in, as "name (saved OLD, now NEW)" strings,
    nested dicts by dotted name (steps, model.d_model: "base." left out), each level's keys of
    `new` first; [] when equal."""
    new_first = lambda old, new: sorted(set(old) | set(new), key=lambda k: (k not in new, k))
    return [f"{name.removeprefix('base.')} (saved {a!r}, now {b!r})"
            for name, a, b in changed_fields(old, new, order=new_first)]


def check_protocol(out, protocol):
    """Raises ValueError (one line naming the settings that differ) if out/protocol.json
    exists, runs were made under it, and it describes another protocol; an `out` that holds
    no run may take another protocol. The captions file counts by its bytes, not its spelling
    (checkpoint.input_difference). Called before anything is timed or written."""
    path, saved = Path(out) / "protocol.json", json.loads(json.dumps(dataclasses.asdict(protocol)))
    if path.exists() and holds_runs(out):
        old = read_json(path, "replicate protocol (protocol.json)")
        if isinstance(old.get("base"), dict):            # a protocol saved before #10
            old = {**old, "base": upgrade_config(old["base"])}
        old = {**OLD_PROTOCOL_DEFAULTS, **old}           # saved before the scaling sweep
        base, now_base = old.get("base"), saved["base"]
        if isinstance(base, dict) and input_difference(
                "captions", base.get("captions"), now_base["captions"]) is None:
            old = {**old, "base": {**base, "captions": now_base["captions"]}}   # same bytes
        diff = differences(old, saved)
        if diff:
            raise ValueError(f"{out}: holds runs of other settings ({'; '.join(diff)}); rerun "
                             f"with the saved settings or choose another --out")


def save_protocol(out, protocol):
    """Write out/protocol.json after check_protocol."""
    check_protocol(out, protocol)
    atomic_write_json(Path(out) / "protocol.json", dataclasses.asdict(protocol))


# ---------------------------------------------------------------- the lr search
def extend_side(scores, extensions, max_extensions=MAX_EXTENSIONS):
    """One decision of the search. scores: val metric at each grid lr, lrs ascending, higher is
    better (ties go to the lower lr); extensions: points already added beyond the grid.
    Returns "low" or "high" when the best score sits on that edge and fewer than
    max_extensions points were added, else None (the best is interior, or the budget is spent)."""
    best = int(np.argmax(scores))
    if extensions >= max_extensions or 0 < best < len(scores) - 1:
        return None
    return "low" if best == 0 else "high"


def lr_search(protocol, score_of):
    """Replay the search of one objective over the runs that exist. score_of(lr) -> the
    selection score of that lr's run, or None if it has not finished.
    Returns {"lrs": ascending, "scores", "todo": the lr to run next or None when the search is
    complete, "missing": every lr of "lrs" without a score (they can run side by side; an
    extension is known only once all are scored), "chosen": best lr, "interior": whether it
    is not on the edge of the lrs run}."""
    n = grid_points(protocol)
    ks = list(range(n))
    while True:
        lrs = [grid_lr(protocol, k) for k in ks]
        scores = [score_of(lr) for lr in lrs]
        missing = [lr for lr, s in zip(lrs, scores) if s is None]
        if missing:
            return {"lrs": lrs, "scores": scores, "todo": missing[0], "missing": missing,
                    "chosen": None, "interior": False}
        side = extend_side(scores, len(ks) - n, protocol.max_extensions)
        if side is None:
            best = int(np.argmax(scores))
            return {"lrs": lrs, "scores": scores, "todo": None, "missing": [],
                    "chosen": lrs[best], "interior": 0 < best < len(lrs) - 1}
        ks = [ks[0] - 1] + ks if side == "low" else ks + [ks[-1] + 1]


def selection_score(run_dir, metric):
    """The search's score of a run: its final val `metric` ("mutual_knn": mean over caption
    slots, from metrics.json["image_alignment"] while current: run/scores.py; "paraphrase_R@1":
    from metrics.json["final"]).
    -inf for a diverged run; None if the run has not finished or lacks that metric."""
    run_dir = Path(run_dir)
    if is_diverged(run_dir):
        return -math.inf
    metrics = read_metrics(run_dir)
    if "final" not in metrics:
        return None
    if metric == "paraphrase_R@1":
        return metrics["final"]["val"]["paraphrase_R@1"]
    steps = (current_alignment(run_dir, metrics) or {}).get("steps", [])     # never stale
    return steps[-1]["val"]["mutual_knn"]["mean"] if steps else None
