"""`replicate`, `scaling`: objectives x seeds (x sizes), then an lr search per objective; N runs
at once, each `python -m minialign train ... --resume`. Writes OUT/protocol.json (a rerun with
other settings is refused), OUT/runs/NAME/, OUT/logs/NAME.log (when several run at once)."""
import contextlib
import ctypes
import dataclasses
import io
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..checkpoint import config_json, first_difference
from ..objectives import CAUSAL
from ..train import TrainConfig, init_weights, prepare, train
from . import images, runs

OBJECTIVES, SEEDS = ("good_views", "bad_views", "next_token"), (0, 1, 2)   # the replication's
WIDTHS, DEPTHS, CENTER = (64, 128, 256, 512), (2, 4, 8), (256, 4)   # the scaling sweep
HEAD_WIDTH, MLP_RATIO = 64, 4  # a sweep's encoder of width D: max(1, D // 64) heads, MLP 4 D
THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS")    # BLAS threads: 1 in every run
EXIT_DIVERGED = 3              # cli.py's exit code of a diverged run
MEM_BASE_MB, MEM_MARGIN, MEM_FREE_MB = 150, 1.2, 500   # run_memory_mb; memory left free


@dataclasses.dataclass
class Protocol:
    """base: every run's TrainConfig but objective, seed, lr, size (D, L). Raises ValueError."""
    base: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    objectives: tuple = OBJECTIVES
    seeds: tuple = SEEDS
    lr_min: float = 1e-4
    lr_max: float = 1e-2
    lr_per_decade: int = 2     # 0: no search (a sweep has none)
    max_extensions: int = 2
    sizes: tuple = ()

    def __post_init__(self):
        if isinstance(self.base, dict):                                 # from protocol.json
            self.base = TrainConfig(**self.base)
        self.objectives, self.seeds = tuple(self.objectives), tuple(map(int, self.seeds))
        self.sizes = tuple((int(d), int(n)) for d, n in self.sizes)
        for name, values in (("objectives", self.objectives), ("seeds", self.seeds)):
            if not values or len(set(values)) != len(values):
                raise ValueError(f"{name}: give at least one, each once (got {list(values)})")
        if self.lr_per_decade and not 0 < self.lr_min < self.lr_max:
            raise ValueError(f"need 0 < lr_min < lr_max, got {self.lr_min} and {self.lr_max}")
        planned(self)                           # raises for an unknown objective, a bad size

    @property
    def kind(self):
        return "scaling" if self.sizes else "replicate"


def sweep_sizes(widths=WIDTHS, depths=DEPTHS, grid="plus", center=CENTER):
    """(D, L), smallest D^2 L first: "plus" the center's depth and width crossed, or "cross"."""
    sizes = ({(d, n) for d in widths for n in depths} if grid == "cross" else
             {(d, center[1]) for d in widths} | {(center[0], n) for n in depths})
    return tuple(sorted(sizes, key=lambda s: (s[0] * s[0] * s[1], s)))


def run_config(protocol, objective, seed, lr=None, size=None):
    """One run's TrainConfig; lr None: base.lr; size (D, L): H = max(1, D // 64), MLP 4 D."""
    model = protocol.base.model
    if size is not None:
        model = dataclasses.replace(model, d_model=size[0], n_layers=size[1],
                                    n_heads=max(1, size[0] // HEAD_WIDTH),
                                    mlp_ratio=MLP_RATIO)
    return dataclasses.replace(protocol.base, objective=objective, seed=seed, model=model,
                               lr=protocol.base.lr if lr is None else lr)


def run_name(protocol, cfg):
    """good_views-lr1.00e-03-seed0; in a sweep good_views-d128-l4-lr1.00e-03-seed0."""
    size = f"-d{cfg.model.d_model}-l{cfg.model.n_layers}" if protocol.sizes else ""
    return f"{cfg.objective}{size}-lr{cfg.lr:.2e}-seed{cfg.seed}"


def planned(protocol):
    """{name: cfg} known before any result: the seed grid, then each search's first grid."""
    return wanted_runs(protocol, ".", score=lambda run_dir: None)[0]


def protocol_json(protocol):
    """The protocol, its kind, its input files' sha256 (however their paths are spelled)."""
    files = {f"{key}_sha256": runs.sha256_file(getattr(protocol.base, key))
             for key in ("captions", "vocab") if getattr(protocol.base, key)}
    return json.loads(json.dumps({"kind": protocol.kind, **dataclasses.asdict(protocol), **files}))


def load_protocol(out):
    """The Protocol in OUT/protocol.json. Raises FileNotFoundError / ValueError naming it."""
    path = Path(out) / "protocol.json"
    try:
        return Protocol(**{k: v for k, v in runs.read_json(path).items()
                           if k in Protocol.__dataclass_fields__})
    except (TypeError, ValueError, AssertionError) as err:
        raise ValueError(f"{path}: not a protocol of this minialign ({err})") from None


def lr_search(protocol, score_of):
    """score_of(lr): higher better, -inf diverged, None not done. Returns {"lrs", "scores",
    "missing", "chosen" (None while any is missing), "interior"}; an edge best extends it."""
    n = round(math.log10(protocol.lr_max / protocol.lr_min) * protocol.lr_per_decade) + 1
    ks = list(range(n))                     # the first grid; lr_min * 10^(k / per decade) ...
    while True:                             # ... to 3 digits, from the integer k: no drift
        lrs = [float(f"{protocol.lr_min * 10 ** (k / protocol.lr_per_decade):.3g}") for k in ks]
        scores = [score_of(lr) for lr in lrs]
        missing = [lr for lr, s in zip(lrs, scores) if s is None]
        best = None if missing else int(np.argmax(scores))        # ties: the lower lr
        interior = best is not None and 0 < best < len(lrs) - 1
        if missing or interior or len(ks) - n >= protocol.max_extensions:
            return {"lrs": lrs, "scores": scores, "missing": missing, "interior": interior,
                    "chosen": None if missing else lrs[best]}
        ks = [ks[0] - 1] + ks if best == 0 else ks + [ks[-1] + 1]   # extend past the edge


def state(run_dir):
    """"finished", "diverged", or None (not started, or stopped: train resumes it)."""
    if (Path(run_dir) / "diverged.json").is_file():
        return "diverged"
    metrics = Path(run_dir) / "metrics.json"
    return "finished" if metrics.is_file() and "final" in runs.read_json(metrics) else None


def selection_score(run_dir, emb=None):
    """Final val mutual-kNN against emb, else val paraphrase R@1; -inf diverged, None not done."""
    if (found := state(run_dir)) != "finished":
        return -math.inf if found == "diverged" else None
    if emb is None:
        return runs.read_metrics(run_dir)["final"]["val"]["paraphrase_R@1"]
    return images.score_run(run_dir, emb)["val"]["mutual_knn"]


def wanted_runs(protocol, out, score=selection_score):
    """({name: cfg} needed so far, seed grid first; {objective: lr_search of score(run_dir)})."""
    seed_grid = (run_config(protocol, obj, seed, size=size) for seed in protocol.seeds
                 for size in protocol.sizes or (None,) for obj in protocol.objectives)
    wanted, searches = {run_name(protocol, c): c for c in seed_grid}, {}
    for obj in protocol.objectives if protocol.lr_per_decade else ():
        at_lr = lambda lr: run_config(protocol, obj, protocol.seeds[0], lr)
        searches[obj] = lr_search(protocol, lambda lr: score(
            Path(out) / "runs" / run_name(protocol, at_lr(lr))))
        for cfg in map(at_lr, searches[obj]["lrs"]):
            wanted.setdefault(run_name(protocol, cfg), cfg)          # base.lr: the seed grid's
    return wanted, searches


def run_memory_mb(cfg, vocab_size):
    """One run's peak memory, MB, estimated high (float64 doubles all but the base)."""
    m, V = cfg.model, vocab_size
    n = 2 * cfg.batch_photos * 14              # tokens a step: a COCO caption ~14 with BOS, EOS
    activations = n * m.d_model * (90 * m.n_layers + 100)
    weights = 16 * (V * m.d_model + m.n_layers * (4 + 2 * m.mlp_ratio) * m.d_model ** 2)
    head = 12 * (n if m.layers == "reference" else 2048) * V if CAUSAL[cfg.objective] else 0
    wide = np.dtype(m.dtype).itemsize / 4
    return MEM_MARGIN * (MEM_BASE_MB + wide * (activations + weights + head) / 2**20)


def choose_jobs(jobs, per_run_mb, n_runs, cores=None, free_mb=None):
    """--jobs: default one per core, at most n_runs and what fits; too many: ValueError."""
    cores = cores or runs.cores()
    if free_mb is None:                   # Linux's MemAvailable, else half the physical memory
        with contextlib.suppress(OSError, IndexError):
            meminfo = Path("/proc/meminfo").read_text()                      # in kB
            free_mb = int(meminfo.split("MemAvailable:")[1].split()[0]) / 1024
    if free_mb is None and hasattr(os, "sysconf"):                           # macOS
        free_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**21
    fit = (jobs or cores) if free_mb is None else int((free_mb - MEM_FREE_MB) // per_run_mb)
    if jobs is None:
        return max(1, min(cores, n_runs, fit))
    if jobs > max(1, fit):
        raise ValueError(f"--jobs {jobs}: {jobs} runs need ~{jobs * per_run_mb:,.0f} MB (~"
                         f"{per_run_mb:,.0f} MB each) but {free_mb:,.0f} MB are available "
                         f"({MEM_FREE_MB} MB kept free); use --jobs {max(1, fit)} or fewer")
    return jobs


def makespan(durations, slots):
    """Seconds until `durations` are done on `slots` slots, each in turn on the first free."""
    free = [0.0] * slots
    for d in durations:
        free[free.index(min(free))] += d
    return max(free)


def hours(s):
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def train_argv(cfg, run_dir):
    """`python -m minialign train ...`: every field off its default (a float's str is its repr)."""
    argv = [sys.executable, "-m", "minialign", "train", "--out", str(run_dir), "--resume",
            "--threads", "1"]
    values = {**vars(cfg), **vars(cfg.model), **vars(cfg.loss)}
    for key, (_, default) in runs.config_fields().items():
        if key in ("objective", "captions", "seed", "lr") or values[key] != default:
            argv += ["--" + key.replace("_", "-"), str(values[key])]
    return argv


def start(cfg, run_dir, log):
    """A run's process, BLAS on one thread; on Linux SIGTERM when we die (PR_SET_PDEATHSIG)."""
    return subprocess.Popen(train_argv(cfg, run_dir), stdin=subprocess.DEVNULL,
                            env={**os.environ, **{name: "1" for name in THREAD_ENV}},
                            stdout=log, stderr=subprocess.STDOUT if log else None,
                            preexec_fn=(lambda: ctypes.CDLL(None).prctl(1, signal.SIGTERM))
                            if sys.platform == "linux" else None)


def replicate(protocol, out, jobs=None, embeddings=None, dry_run=False):
    """Check the inputs, run the protocol (cli then writes the report): {"runs", "lr_search"}."""
    out, plan, tag = Path(out), planned(protocol), f"[{protocol.kind}]"
    info, emb = check_inputs(protocol, out, embeddings)
    jobs = choose_jobs(jobs, max(run_memory_mb(cfg, info["vocab_size"]) for cfg in plan.values()),
                       len(plan))
    print(f"{tag} {len(plan)} runs planned, --jobs {jobs}; encoder: {info['parameters']:,} "
          f"parameters{' at the first size' * bool(protocol.sizes)}, {protocol.base.tokenizer} "
          f"vocabulary of {info['vocab_size']}", flush=True)
    if dry_run:
        return estimate(protocol, out, jobs, plan)
    with runs.lock(out):
        save_protocol(out, protocol, embeddings)
        ended, searches = run_grid(protocol, out, jobs, tag, emb)
    return {"runs": ended, "lr_search": searches}


def check_inputs(protocol, out, embeddings=None):
    """Check every input file (one line naming it). Returns (config.json "info", Embeddings)."""
    cfg, emb, path = next(iter(planned(protocol).values())), None, Path(out) / "protocol.json"
    data, now = prepare(cfg), protocol_json(protocol)
    if path.is_file() and any(Path(out).glob("runs/*/config.json")):
        saved = {k: v for k, v in runs.read_json(path).items() if k != "embeddings"}
        if saved["captions_sha256"] != now["captions_sha256"]:
            raise ValueError(f"{out}: holds runs of other captions ({saved['base']['captions']}; "
                             f"now {protocol.base.captions}, whose bytes differ); choose another "
                             f"--out")
        if first := first_difference(saved, now):
            raise ValueError(f"{path}: holds runs of other settings ("
                             f"{first.removeprefix('base.')}); rerun with the saved settings "
                             f"or choose another --out")
    if embeddings is not None:
        emb = images.load_embeddings(embeddings)
        images.images_of(emb, data["captions"].image_ids, protocol.base.captions)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, vocab_size=data["tokenizer"].vocab_size))
    return config_json(cfg, data, init_weights(cfg, np.random.default_rng(0)))["info"], emb


def save_protocol(out, protocol, embeddings=None):
    """OUT/protocol.json, with the embeddings file for `report OUT`; OUT/logs/."""
    path, saved = out / "protocol.json", protocol_json(protocol)
    embeddings = embeddings or (runs.read_json(path).get("embeddings") if path.is_file() else None)
    runs.write_json(path, {**saved, **({"embeddings": str(embeddings)} if embeddings else {})})
    (out / "logs").mkdir(exist_ok=True)


def run_grid(protocol, out, jobs, tag, emb):
    """Start wanted runs while a slot is free; a failed run (OSError) stops the others. Returns
    ({name: state}, {objective: lr_search}); emb: selection_score's."""
    running, ended = {}, {}       # {name: process}, {name: state}
    log_of = lambda name: out / "logs" / f"{name}.log" if jobs > 1 else None   # None: ours
    say = lambda text: print(f"{tag} {text} | {len(ended)}/{len(wanted)} runs done", flush=True)
    try:
        while True:
            wanted, searches = wanted_runs(protocol, out, lambda d: selection_score(d, emb))
            for name in [n for n in wanted if n not in ended and n not in running]:
                if found := state(out / "runs" / name):         # a run of an earlier session
                    ended[name] = found
                    print(f"{tag} {name}: {found} earlier, skipped", flush=True)
                elif len(running) < jobs:
                    say(f"start {name}{f', output in {log_of(name)}' if jobs > 1 else ''}")
                    with open(log_of(name), "ab") if jobs > 1 else contextlib.nullcontext() as log:
                        running[name] = start(wanted[name], out / "runs" / name, log)
            if not running:
                return ended, searches
            while all(process.poll() is None for process in running.values()):
                time.sleep(0.2)
            for name in [n for n, process in running.items() if process.poll() is not None]:
                if (code := running.pop(name).poll()) not in (0, EXIT_DIVERGED):
                    raise OSError(f"{name}: its run's process failed (exit code {code}); its "
                                  f"output: {log_of(name) or 'above'}")
                ended[name] = "diverged" if code == EXIT_DIVERGED else "finished"
                say(f"{ended[name]}: {name}")
    finally:
        for process in running.values():
            process.terminate()                     # SIGTERM: the run stops cleanly
        for process in running.values():
            process.wait()


def run_seconds(cfg, timed):
    """One run's seconds, high: the fixed part twice, the steps, a val share of it per eval."""
    val_evals = (cfg.steps - 1) // cfg.eval_every
    return timed["fixed_s"] * (2 + val_evals * timed["val_share"]) + cfg.steps * timed["step_s"]


def estimate(protocol, out, jobs, plan):
    """--dry-run: time 1 + 3 steps of each group here, quietly (the median step, the rest of the
    wall time, the val photos' share); print how long the runs left take. Writes nothing."""
    left = [n for n in plan if not state(out / "runs" / n)]
    first = list(plan)[:len(protocol.objectives)]             # one run of each objective
    group = lambda name: name.split("-lr")[0]         # what a run times like: objective (, size)
    groups = {group(n): plan[n] for n in first + left}
    print(f"[eta] timing a few steps of {len(groups)} objective(s)/size(s) ...", flush=True)
    timed = {}
    for g, cfg in groups.items():
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
            t0 = time.perf_counter()
            train(dataclasses.replace(cfg, eval_every=10**9), tmp, progress=False, stop_after=1 + 3)
            wall = time.perf_counter() - t0
            seconds = [json.loads(line)["seconds"] for line in open(Path(tmp) / "log.jsonl")]
            photos = runs.read_json(Path(tmp) / "config.json")["info"]["photos"]
        timed[g] = {"step_s": float(np.median(seconds[1:])), "fixed_s": wall - sum(seconds),
                    "val_share": photos["val"] / sum(photos.values())}
        print(f"[eta] {g}: {1000 * timed[g]['step_s']:.0f} ms/step, one run "
              f"{hours(run_seconds(cfg, timed[g]))}", flush=True)
    took = lambda names: [run_seconds(plan[n], timed[group(n)]) for n in names]
    seconds = makespan(took(left), jobs)
    extra = protocol.max_extensions * makespan(took(first), jobs) * bool(protocol.lr_per_decade)
    more = (f", up to {hours(seconds + extra)} if every lr search extends its grid "
            f"({protocol.max_extensions * len(protocol.objectives)} more runs)" if extra else "")
    print(f"[eta] {len(left)} of {len(plan)} runs left, --jobs {jobs}: {hours(seconds)}{more}")
    return {"left": len(left), "seconds": seconds, "seconds_max": seconds + extra}


def slurm_script(protocol, out, embeddings=None):
    """An sbatch array of the runs `replicate` would start now, one core each."""
    out, (info, emb) = Path(out), check_inputs(protocol, out, embeddings)
    with runs.lock(out):
        save_protocol(out, protocol, embeddings)
        todo = {name: cfg for name, cfg in wanted_runs(
            protocol, out, lambda run_dir: selection_score(run_dir, emb))[0].items()
            if not state(out / "runs" / name)}
    if not todo:
        return f"# every run of {out} has finished: python -m minialign report {out}\n"
    mem = math.ceil(max(run_memory_mb(cfg, info["vocab_size"]) for cfg in todo.values()))
    header = [f"--job-name=minialign-{out.name}", f"--array=0-{len(todo) - 1}",
              "--cpus-per-task=1", f"--mem={mem}M", f"--chdir={Path.cwd()}",
              f"--output={out.resolve() / 'logs'}/slurm-%A_%a.log"]
    cases = [f"{i}) exec {shlex.join(train_argv(cfg, out / 'runs' / name))} ;;"
             for i, (name, cfg) in enumerate(todo.items())]
    return "\n".join(["#!/bin/sh", *(f"#SBATCH {h}" for h in header),
                      f"# {len(todo)} runs of {out}, one per task; once they have ended, write "
                      f"this script again for what is still missing", "set -eu",
                      *(f"export {name}=1" for name in THREAD_ENV),
                      'case "$SLURM_ARRAY_TASK_ID" in', *cases,
                      '*) echo "no run $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;', "esac", ""])
