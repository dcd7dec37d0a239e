"""The grid: a protocol of runs, N at once, resumed after any stop, timed beforehand, or
written as a Slurm job array. `replicate` and `scaling` are this module.

    OUT/protocol.json    the protocol; a rerun with other settings is refused
    OUT/runs/NAME/       a train.train run: good_views-lr1.00e-03-seed0 (-d128-l4- in a sweep)
    OUT/logs/NAME.log    a run's output when several run at once

The seed grid: every objective x seed (x size) at base.lr, seed-major. The lr search, per
objective on the first seed: lr_k = lr_min * 10^(k / lr_per_decade) from lr_min to lr_max;
the best final val score wins (selection_score); a best on an edge adds the next point beyond
it, at most max_extensions in all. A point equal to base.lr is the seed grid's run.

Each run is one process, `python -m minialign train ... --resume` (what a Slurm task runs)
with numpy's BLAS on one thread: N one-thread runs side by side give more steps per second
than one run on N threads, and a run's numbers do not depend on --jobs. A finished run is
skipped; a run stopped any way (Ctrl-C, kill -9) continues from its last checkpoint to the
same bits; a diverged run is not retried.
"""
import ctypes
import dataclasses
import heapq
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..checkpoint import first_difference
from ..objectives import CAUSAL
from ..train import TrainConfig, config_json, prepare, train
from . import images, runs, variants  # noqa: F401 (variants: named objectives to list)

OBJECTIVES, SEEDS = ("good_views", "bad_views", "next_token"), (0, 1, 2)   # the replication's
LR_DIGITS = 3                  # significant digits of a search lr: 1e-3, 3.16e-3
WIDTHS, DEPTHS, CENTER = (64, 128, 256, 512), (2, 4, 8), (256, 4)   # the scaling sweep
HEAD_WIDTH, MLP_RATIO = 64, 4  # a sweep's encoder of width D: max(1, D // 64) heads, MLP 4 D
# what OpenBLAS, OpenMP, MKL, Accelerate and BLIS read for their threads: 1 in every run
THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS")
EXIT_DIVERGED, EXIT_STOPPED = 3, (130, 143, -signal.SIGINT, -signal.SIGTERM)  # cli.py's codes
POLL_SECONDS = 0.2             # how often the grid looks at its runs' processes
TIMED_STEPS = 3                # eta: steps timed per objective, after one
MEM_BASE_MB, MEM_MARGIN, MEM_FREE_MB = 150, 1.2, 500   # run_memory_mb; memory left free


# ---------------------------------------------------------------- the protocol
@dataclasses.dataclass(frozen=True)
class Protocol:
    """The grid. base: every run's TrainConfig but objective, seed and lr (and the encoder's
    width and depth in a sweep); base.lr is the seed grid's lr. lr_per_decade 0: no search.
    sizes ((D, L), ...): a scaling sweep (no search). Raises ValueError, one line."""
    base: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    objectives: tuple = OBJECTIVES
    seeds: tuple = SEEDS
    lr_min: float = 1e-4
    lr_max: float = 1e-2
    lr_per_decade: int = 2
    max_extensions: int = 2
    sizes: tuple = ()

    def __post_init__(self):
        if isinstance(self.base, dict):
            object.__setattr__(self, "base", TrainConfig(**self.base))
        object.__setattr__(self, "objectives", tuple(self.objectives))
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        object.__setattr__(self, "sizes", tuple((int(d), int(n)) for d, n in self.sizes))
        for name, values in (("objectives", self.objectives), ("seeds", self.seeds),
                             ("sizes", self.sizes or ((0, 0),))):
            if not values or len(set(values)) != len(values):
                raise ValueError(f"{name}: give at least one, each once (got {list(values)})")
        if self.sizes and self.lr_per_decade:
            raise ValueError("a sweep over encoder sizes has no lr search (lr_per_decade 0)")
        if self.lr_per_decade and not 0 < self.lr_min < self.lr_max:
            raise ValueError(f"the lr search needs 0 < lr_min < lr_max, got {self.lr_min} and "
                             f"{self.lr_max}")
        seed_grid(self)                         # raises for an unknown objective, a bad size

    @property
    def kind(self):
        return "scaling" if self.sizes else "replicate"


def sweep_sizes(widths=WIDTHS, depths=DEPTHS, grid="plus", center=CENTER):
    """The (D, L) of a sweep, smallest D^2 L first. "plus": every width at the center's depth
    and every depth at its width (6 sizes by default); "cross": every width x depth (12)."""
    sizes = ({(d, n) for d in widths for n in depths} if grid == "cross" else
             {(d, center[1]) for d in widths} | {(center[0], n) for n in depths})
    return tuple(sorted(sizes, key=lambda s: (s[0] * s[0] * s[1], s)))


def run_config(protocol, objective, seed, lr=None, size=None):
    """The TrainConfig of one run; lr None: base.lr; size (D, L) in a sweep: width D, depth L,
    H = max(1, D // 64) heads, MLP 4 D."""
    model = protocol.base.model
    if size is not None:
        heads = max(1, size[0] // HEAD_WIDTH)
        if size[0] % heads:
            raise ValueError(f"encoder size D={size[0]}: its {heads} heads do not divide it")
        model = dataclasses.replace(model, d_model=size[0], n_layers=size[1], n_heads=heads,
                                    mlp_ratio=MLP_RATIO)
    return dataclasses.replace(protocol.base, objective=objective, seed=seed, model=model,
                               lr=protocol.base.lr if lr is None else lr)


def run_name(protocol, cfg):
    """good_views-lr1.00e-03-seed0; in a sweep good_views-d128-l4-lr1.00e-03-seed0."""
    size = f"-d{cfg.model.d_model}-l{cfg.model.n_layers}" if protocol.sizes else ""
    return f"{cfg.objective}{size}-lr{cfg.lr:.2e}-seed{cfg.seed}"


def group(name):                         # what a run times like: its objective (and size)
    return name.split("-lr")[0]


def seed_grid(protocol):
    return [run_config(protocol, obj, seed, size=size) for seed in protocol.seeds
            for size in protocol.sizes or (None,) for obj in protocol.objectives]


def planned(protocol):
    """{name: cfg} known before any result: the seed grid, then the first search grids."""
    cfgs = seed_grid(protocol) + [
        run_config(protocol, obj, protocol.seeds[0], grid_lr(protocol, k))
        for obj in protocol.objectives
        for k in range(grid_points(protocol) if protocol.lr_per_decade else 0)]
    return {run_name(protocol, cfg): cfg for cfg in cfgs}


def protocol_json(protocol):
    """protocol.json: the protocol, its kind, and its input files' sha256, by which a rerun
    recognises them however their paths are spelled (+ "embeddings": the file last given)."""
    files = {f"{key}_sha256": runs.sha256_file(getattr(protocol.base, key))
             for key in ("captions", "vocab") if getattr(protocol.base, key)}
    return json.loads(json.dumps({"kind": protocol.kind, **dataclasses.asdict(protocol),
                                  **files}))


def load_protocol(out):
    """The Protocol in OUT/protocol.json. Raises FileNotFoundError / ValueError naming it."""
    path = Path(out) / "protocol.json"
    try:
        return Protocol(**{k: v for k, v in runs.read_json(path).items()
                           if k in Protocol.__dataclass_fields__})
    except (TypeError, ValueError, AssertionError) as err:
        raise ValueError(f"{path}: not a protocol of this minialign ({err})") from None


def check_protocol(out, protocol):
    """Refuse (ValueError, one line naming the first setting that differs) a protocol other
    than OUT/protocol.json's once OUT holds a run; a directory without runs takes any."""
    path = Path(out) / "protocol.json"
    if path.is_file() and any(Path(out).glob("runs/*/config.json")):
        saved = {k: v for k, v in runs.read_json(path).items() if k != "embeddings"}
        first = first_difference(saved, protocol_json(protocol))
        if first:
            raise ValueError(f"{path}: holds runs of other settings ("
                             f"{first.removeprefix('base.')}); rerun with the saved settings "
                             f"or choose another --out")


# ---------------------------------------------------------------- the lr search
def grid_points(protocol):
    """Points of the first search grid, lr_min .. lr_max."""
    return round(math.log10(protocol.lr_max / protocol.lr_min) * protocol.lr_per_decade) + 1


def grid_lr(protocol, k):
    """lr_min * 10^(k / lr_per_decade) to LR_DIGITS digits; k < 0 or beyond the grid: an
    extension. From the integer k, so extensions never drift."""
    return float(f"{protocol.lr_min * 10 ** (k / protocol.lr_per_decade):.{LR_DIGITS}g}")


def lr_search(protocol, score_of):
    """Replay one objective's search. score_of(lr) -> its run's score (higher is better,
    -inf diverged) or None (not finished). Returns {"lrs" ascending, "scores", "missing": the
    lrs without a score (they may run side by side; what comes after them is not known yet),
    "chosen": the best lr or None while some are missing, "interior": not on an edge}."""
    n = grid_points(protocol)
    ks = list(range(n))
    while True:
        lrs = [grid_lr(protocol, k) for k in ks]
        scores = [score_of(lr) for lr in lrs]
        missing = [lr for lr, s in zip(lrs, scores) if s is None]
        if missing:
            return {"lrs": lrs, "scores": scores, "missing": missing, "chosen": None,
                    "interior": False}
        best = int(np.argmax(scores))                             # ties: the lower lr
        interior = 0 < best < len(lrs) - 1
        if interior or len(ks) - n >= protocol.max_extensions:
            return {"lrs": lrs, "scores": scores, "missing": [], "chosen": lrs[best],
                    "interior": interior}
        ks = [ks[0] - 1] + ks if best == 0 else ks + [ks[-1] + 1]


def state(run_dir):
    """"finished", "diverged", or None (not started, or stopped: train resumes it)."""
    if (Path(run_dir) / "diverged.json").is_file():
        return "diverged"
    try:
        return "finished" if "final" in runs.read_metrics(run_dir) else None
    except (OSError, ValueError):
        return None


def selection_score(run_dir, emb=None, memo=None):
    """The search's score of a run: its final val mutual-kNN against emb (images.Embeddings),
    else its final val paraphrase R@1; -inf if it diverged, None if not finished."""
    found = state(run_dir)
    if found != "finished":
        return -math.inf if found == "diverged" else None
    if emb is None:
        return runs.read_metrics(run_dir)["final"]["val"]["paraphrase_R@1"]
    return images.score_run(run_dir, emb, memo=memo)["val"]["mutual_knn"]


def replay(protocol, out, objective, score=selection_score):
    """lr_search of `objective` over OUT's runs; score(run_dir): selection_score's."""
    return lr_search(protocol, lambda lr: score(Path(out) / "runs" / run_name(
        protocol, run_config(protocol, objective, protocol.seeds[0], lr))))


def wanted_runs(protocol, out, score=selection_score):
    """{name: cfg} the protocol needs so far, in start order: the seed grid, then every lr of
    each objective's search replayed; its next points appear once these have scores."""
    wanted = {run_name(protocol, cfg): cfg for cfg in seed_grid(protocol)}
    for obj in protocol.objectives if protocol.lr_per_decade else ():
        for lr in replay(protocol, out, obj, score)["lrs"]:
            cfg = run_config(protocol, obj, protocol.seeds[0], lr)
            wanted.setdefault(run_name(protocol, cfg), cfg)
    return wanted


# ---------------------------------------------------------------- memory and --jobs
def run_memory_mb(cfg, vocab_size):
    """Peak memory of one run, MB, estimated high: MEM_MARGIN x (interpreter and data +
    activations kept for the backward ~ tokens x D x (90 L + 100) bytes + weights, gradient,
    two Adam moments + a causal objective's (rows, V) logits: all rows on the reference
    layers, 2048 on the fast ones); float64 doubles all but the base."""
    m, V = cfg.model, vocab_size
    n = 2 * cfg.batch_photos * 14              # tokens a step: a COCO caption ~14 with BOS, EOS
    activations = n * m.d_model * (90 * m.n_layers + 100)
    weights = 16 * (V * m.d_model + m.n_layers * (4 + 2 * m.mlp_ratio) * m.d_model ** 2)
    head = 12 * (n if m.layers == "reference" else 2048) * V if CAUSAL[cfg.objective] else 0
    wide = np.dtype(m.dtype).itemsize / 4
    return MEM_MARGIN * (MEM_BASE_MB + wide * (activations + weights + head) / 2**20)


def available_mb():
    """Memory new processes may use, MB: Linux's MemAvailable, else half the physical
    memory (macOS, BSD), else None (not known: --jobs is not checked)."""
    try:
        return int(Path("/proc/meminfo").read_text().split("MemAvailable:")[1].split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**21
        except (AttributeError, ValueError, OSError):
            return None


def choose_jobs(jobs, per_run_mb, n_runs, cores=None, free_mb=None):
    """--jobs: the given count, refused (ValueError, one line) when that many runs do not fit
    in the available memory; by default one run per core, at most the runs, at most what fits."""
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count())
    free_mb = available_mb() if free_mb is None else free_mb
    fit = cores if free_mb is None else int((free_mb - MEM_FREE_MB) // per_run_mb)
    if jobs is None:
        return max(1, min(cores, n_runs, fit))
    if jobs > 1 and jobs > fit:
        raise ValueError(f"--jobs {jobs}: {jobs} runs need ~{jobs * per_run_mb:,.0f} MB (~"
                         f"{per_run_mb:,.0f} MB each) but {free_mb:,.0f} MB are available "
                         f"({MEM_FREE_MB} MB kept free); use --jobs {max(1, fit)} or fewer")
    return jobs


def makespan(durations, slots, busy=()):
    """Seconds until `durations` (in start order) are done on `slots` slots, each starting on
    the first slot free; busy: seconds left of the runs in progress."""
    free = sorted(busy)[:slots] + [0.0] * max(0, slots - len(busy))
    heapq.heapify(free)
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free, default=0.0)


def hours(s):
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


# ---------------------------------------------------------------- one run's process
def child_env():
    """A run's environment: this process's, numpy's BLAS on one thread (THREAD_ENV)."""
    return {**os.environ, **{name: "1" for name in THREAD_ENV}}


def train_argv(cfg, run_dir):
    """`python -m minialign train ... --out RUN_DIR --resume --threads 1` (one run per core):
    objective, captions, seed, lr
    and every field that differs from TrainConfig's defaults (floats by repr, exact)."""
    argv = [sys.executable, "-m", "minialign", "train", "--out", str(run_dir), "--resume",
            "--threads", "1"]
    always = ("objective", "captions", "seed", "lr")
    for owner, default in ((cfg, TrainConfig()), (cfg.model, TrainConfig().model),
                           (cfg.loss, TrainConfig().loss)):
        for f in dataclasses.fields(owner):
            value = getattr(owner, f.name)
            if f.name not in ("model", "loss", "vocab_size") and (
                    f.name in always or value != getattr(default, f.name)):
                argv += ["--" + f.name.replace("_", "-"),
                         repr(value) if isinstance(value, float) else str(value)]
    return argv


def start(cfg, run_dir, log):
    """A run's process. On Linux it gets SIGTERM (a clean stop) when the grid's process dies,
    even by kill -9 (PR_SET_PDEATHSIG = 1), so no run outlives its grid."""
    return subprocess.Popen(train_argv(cfg, run_dir), env=child_env(), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT if log else None,
                            preexec_fn=(lambda: ctypes.CDLL(None).prctl(1, signal.SIGTERM))
                            if sys.platform == "linux" else None)


# ---------------------------------------------------------------- replicate
def replicate(protocol, out, jobs=None, embeddings=None, dry_run=False):
    """`replicate` and `scaling`: check every input, run the protocol into OUT `jobs` runs at
    once (None: choose_jobs), then report.py's report; an embeddings file gives the image
    columns and the search's scores. dry_run: `estimate` only, nothing written. Returns
    {"runs": {name: "finished" | "diverged"}, "lr_search": {objective: lr_search's}}."""
    out, plan, tag = Path(out), planned(protocol), f"[{protocol.kind}]"
    info, emb = check_inputs(protocol, out, embeddings)
    jobs = choose_jobs(jobs, max(run_memory_mb(cfg, info["vocab_size"]) for cfg in plan.values()),
                       len(plan))
    print(f"{tag} {len(plan)} runs planned, --jobs {jobs}; encoder: {info['parameters']:,} "
          f"parameters{' at the first size' * bool(protocol.sizes)}, {protocol.base.tokenizer} "
          f"vocabulary of {info['vocab_size']}", flush=True)
    if dry_run:
        return estimate(protocol, out, jobs)
    t0, kept, memo = time.perf_counter(), {}, {}

    def score(run_dir):                   # a finished run's score is kept: it cannot change
        if kept.get(run_dir.name) is None:
            kept[run_dir.name] = selection_score(run_dir, emb, memo)
        return kept[run_dir.name]
    with runs.lock(out):
        save_protocol(out, protocol, embeddings)
        ended = run_grid(protocol, out, jobs, score, tag)
    searches = {}
    for obj in protocol.objectives if protocol.lr_per_decade else ():
        searches[obj] = s = replay(protocol, out, obj, score)
        print(f"{tag} lr search {obj}: chosen {s['chosen']:.2e} "
              f"({'interior' if s['interior'] else 'ON THE EDGE'}) of "
              f"{', '.join(f'{lr:.2e}' for lr in s['lrs'])}", flush=True)
    print(f"{tag} {len(ended)} runs done, {(time.perf_counter() - t0) / 60:.1f} min this "
          f"session", flush=True)
    write_report(out, embeddings)
    return {"runs": ended, "lr_search": searches}


def check_inputs(protocol, out, embeddings=None):
    """Check before anything is written (one line naming the file): the captions, vocabulary,
    OUT's protocol, the embeddings file. Returns (the first run's config.json "info",
    images.Embeddings or None)."""
    cfg, emb = seed_grid(protocol)[0], None
    data = prepare(cfg)
    check_protocol(out, protocol)
    if embeddings is not None:
        emb = images.load_embeddings(embeddings)
        images.images_of(emb, data["captions"].image_ids, protocol.base.captions)
    model = dataclasses.replace(cfg.model, vocab_size=data["tokenizer"].vocab_size)
    return config_json(dataclasses.replace(cfg, model=model), data)["info"], emb


def save_protocol(out, protocol, embeddings=None):
    """OUT/protocol.json (OUT locked), with the embeddings file for `report OUT` to read."""
    check_protocol(out, protocol)
    path, saved = out / "protocol.json", protocol_json(protocol)
    embeddings = embeddings or (runs.read_json(path).get("embeddings") if path.is_file() else None)
    runs.write_json(path, {**saved, **({"embeddings": str(embeddings)} if embeddings else {})})


def write_report(out, embeddings=None):
    """results.md and the figures: report.write_report, when report.py is there."""
    try:
        from .report import write_report as write
    except ImportError:
        return print(f"no report.py: `python -m minialign report {out}` later", flush=True)
    return write(out, embeddings=embeddings)


def run_grid(protocol, out, jobs, score=selection_score, tag="[replicate]"):
    """replicate's loop in the locked OUT: start the first wanted run not done whenever a slot
    is free, until none is wanted or running. A failed run (OSError, one line) or Ctrl-C stops
    the grid and the runs in progress, to resume next time. Returns {name: state}."""
    (out / "logs").mkdir(exist_ok=True)
    running, ended = {}, {}
    try:
        while True:
            wanted = wanted_runs(protocol, out, score)
            for name in [n for n in wanted if n not in ended and n not in running]:
                if state(out / "runs" / name):          # a run of an earlier session
                    ended[name] = state(out / "runs" / name)
                    print(f"{tag} {name}: {ended[name]} earlier, skipped", flush=True)
            todo = [name for name in wanted if name not in ended and name not in running]
            if todo and len(running) < jobs:
                name = todo[0]
                log = open(out / "logs" / f"{name}.log", "ab") if jobs > 1 else None
                print(f"{tag} start {name}{f', output in {log.name}' if log else ''} | "
                      f"{eta_line(out, wanted, running, ended, jobs)}", flush=True)
                running[name] = (start(wanted[name], out / "runs" / name, log), log, time.time())
                continue
            if not running:
                return ended
            time.sleep(POLL_SECONDS)
            for name, (process, log, _) in list(running.items()):
                if process.poll() is not None:
                    del running[name]
                    ended[name] = finish(name, process.returncode, log)
                    print(f"{tag} {ended[name]}: {name} | "
                          f"{eta_line(out, wanted, running, ended, jobs)}", flush=True)
    finally:
        for process, _, _ in running.values():
            process.terminate()                     # SIGTERM: the run stops cleanly
        for process, log, _ in running.values():
            process.wait(), log and log.close()


def finish(name, code, log):
    """A run's process ended: "finished", "diverged", or the grid stops."""
    log and log.close()
    if code in EXIT_STOPPED:
        raise KeyboardInterrupt
    if code not in (0, EXIT_DIVERGED):
        said = (Path(log.name).read_text(errors="replace").strip().splitlines() or ["-"])[-1] \
            + f" (all of it: {log.name})" if log else "its output is above"
        raise OSError(f"{name}: its run's process failed (exit code {code}): {said}")
    return "diverged" if code == EXIT_DIVERGED else "finished"


def eta_line(out, wanted, running, ended, jobs):
    """'k/n runs done, ETA ...': each run as long as the finished runs of its group took (all
    groups' mean for one not measured yet), those in progress less the time they have run."""
    walls = {}
    for name in (n for n, how in ended.items() if how == "finished"):
        walls.setdefault(group(name), []).append(
            runs.read_metrics(out / "runs" / name)["wall_seconds"])
    if not walls:
        return f"{len(ended)}/{len(wanted)} runs done"
    mean = {g: statistics.mean(w) for g, w in walls.items()}
    took = lambda name: mean.get(group(name), statistics.mean(mean.values()))
    busy = [max(0.0, took(n) - (time.time() - t)) for n, (_, _, t) in running.items()]
    pending = [took(n) for n in wanted if n not in ended and n not in running]
    return f"{len(ended)}/{len(wanted)} runs done, ETA {hours(makespan(pending, jobs, busy))}"


# ---------------------------------------------------------------- eta
def time_runs(configs, steps=TIMED_STEPS):
    """For each TrainConfig dict, 1 + `steps` steps of train.train in a temporary directory:
    {"step_s": median of the last `steps`, "fixed_s": the rest (data, init, every split
    evaluated), "val_share": val photos / all photos}."""
    found = []
    for saved in configs:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            train(dataclasses.replace(TrainConfig(**saved), eval_every=10**9), tmp,
                  progress=False, stop_after=1 + steps)
            wall = time.perf_counter() - t0
            seconds = [json.loads(line)["seconds"] for line in open(Path(tmp) / "log.jsonl")]
            photos = runs.read_json(Path(tmp) / "config.json")["info"]["photos"]
        found.append({"step_s": statistics.median(seconds[1:]), "fixed_s": wall - sum(seconds),
                      "val_share": photos["val"] / sum(photos.values())})
    return found


def run_seconds(cfg, timed):
    """One run's wall time, estimated high: the fixed part at step 0 and at the end, the steps,
    and a val evaluation (the fixed part x the val share) every eval_every steps."""
    val_evals = (cfg.steps - 1) // cfg.eval_every
    return timed["fixed_s"] * (2 + val_evals * timed["val_share"]) + cfg.steps * timed["step_s"]


def estimate(protocol, out, jobs):
    """`eta`: time a few steps of each objective (and size) in a process like a run's, print
    how long the runs left in OUT take on `jobs` slots (and at most, with the lr searches'
    extensions). Writes nothing. Returns {"left", "runs", "seconds", "seconds_max"}."""
    plan = planned(protocol)
    left = {n: cfg for n, cfg in plan.items() if not state(Path(out) / "runs" / n)}
    first = list(plan)[:len(protocol.objectives)]             # one run of each objective
    groups = {group(n): cfg for n, cfg in [*((n, plan[n]) for n in first), *left.items()]}
    print(f"[eta] timing 1 + {TIMED_STEPS} steps of {len(groups)} objective(s)/size(s), one "
          f"thread each ...", flush=True)
    code = ("import json, sys; from minialign.machinery import grid; "
            "print(json.dumps(grid.time_runs(json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(
        [dataclasses.asdict(c) for c in groups.values()])], env=child_env(),
        capture_output=True, text=True)
    if done.returncode:
        raise OSError(f"eta: the timing process failed: "
                      f"{(done.stderr.strip() or '-').splitlines()[-1]}")
    timed = dict(zip(groups, json.loads(done.stdout.strip().splitlines()[-1])))
    for g, t in timed.items():
        print(f"[eta] {g}: {1000 * t['step_s']:.0f} ms/step, one run "
              f"{hours(run_seconds(groups[g], t))}", flush=True)
    seconds = makespan([run_seconds(cfg, timed[group(n)]) for n, cfg in left.items()], jobs)
    extra = bool(protocol.lr_per_decade) * protocol.max_extensions * makespan(
        [run_seconds(plan[n], timed[group(n)]) for n in first], jobs)
    more = (f", up to {hours(seconds + extra)} if every lr search extends its grid "
            f"({protocol.max_extensions * len(protocol.objectives)} more runs)" if extra else "")
    print(f"[eta] {len(left)} of {len(plan)} runs left, --jobs {jobs}: {hours(seconds)}{more}",
          flush=True)
    return {"left": len(left), "runs": len(plan), "seconds": seconds,
            "seconds_max": seconds + extra}


# ---------------------------------------------------------------- Slurm
def slurm_script(protocol, out, embeddings=None, options=()):
    """An sbatch job array of the runs `replicate` would start now, task i running run i's
    `python -m minialign train ... --resume` on one core; options: more #SBATCH lines. Writes
    OUT/protocol.json and OUT/logs/; returns the script. Written again once the array has
    ended, it holds what is still missing (failed runs, the lr search's next points)."""
    out = Path(out)
    info, emb = check_inputs(protocol, out, embeddings)
    if any("\n" in o for o in options):
        raise ValueError(f"an sbatch option holds a newline: {options!r}")
    with runs.lock(out):
        save_protocol(out, protocol, embeddings)
        (out / "logs").mkdir(exist_ok=True)
        score = lambda run_dir: selection_score(run_dir, emb)
        todo = {name: cfg for name, cfg in wanted_runs(protocol, out, score).items()
                if not state(out / "runs" / name)}
    if not todo:
        return f"# every run of {out} has finished: python -m minialign report {out}\n"
    mem = math.ceil(max(run_memory_mb(cfg, info["vocab_size"]) for cfg in todo.values()))
    header = [f"--job-name=minialign-{out.name}", f"--array=0-{len(todo) - 1}",
              "--cpus-per-task=1", f"--mem={mem}M", f"--chdir={Path.cwd()}",
              f"--output={out.resolve() / 'logs'}/slurm-%A_%a.log", *options]
    cases = [f"{i}) exec {shlex.join(train_argv(cfg, out / 'runs' / name))} ;;"
             for i, (name, cfg) in enumerate(todo.items())]
    return "\n".join(["#!/bin/sh", *(f"#SBATCH {h}" for h in header),
                      f"# {len(todo)} runs of {out}, one per task; once they have ended, write "
                      f"this script again for what is still missing", "set -eu",
                      *(f"export {name}=1" for name in THREAD_ENV),
                      'case "$SLURM_ARRAY_TASK_ID" in', *cases,
                      '*) echo "no run $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;', "esac", ""])
