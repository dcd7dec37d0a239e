"""Speed of one training step of each objective, against numpy's own float32 GEMM peak.

`python -m minialign bench` runs each objective in a fresh child process,
`python -m minialign bench --only NAME --json` (so that each one's peak memory, the
process-wide ru_maxrss, is its own), and each child:
  1. builds batches the way training does (train.prepare, data.sample_batch: 256 photos, two
     captions each, 512 captions), or with --fixed-length T 512 captions of exactly T word ids;
  2. times numpy float32 matmuls of the model's shapes: the best GFLOP/s is `peak_gflops`;
  3. runs warm-up steps, then timed steps of train.train_step (objective, clip_grad_norm,
     adam_step: a whole training step on one fixed batch), and reports the median and min
     ms/step, the step's FLOPs (gemms.step_flops: every matrix product of the step, counted
     from the batch's caption lengths), GFLOP/s and the fraction of peak;
  4. replays the same matrix products alone (gemms.replay_gemms): the step's GEMM time, and
     the non-GEMM share of a step = 1 - GEMM ms / step ms (element-wise work, copies, Python).
Each objective runs on both layer sets (ModelConfig.layers; --layers fast or reference for
one): the fast set, which trains by default, and the reference (minialign/layers.py), what
`--layers reference` trains on; the last line gives reference ms / fast ms.
The side-by-side comparison with PyTorch eager is bench_torch.py.
This is a benchmark, not a test: nothing here asserts a speed.
"""
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

try:                      # peak memory (peak_rss_mb): POSIX only; Windows has no resource module
    import resource
except ImportError:
    resource = None

from ...data import Batch, sample_batch
from ...model import init_params
from ...objectives import OBJECTIVES
from ...optim import adam_init
from ...tokenizer import PAD, SPECIALS
from ...train import prepare, train_step
from .gemms import attention_grids, replay_gemms, step_gemms
from ..run.machine import OPENBLAS_ENV, blas_on, cores, describe

# the captions to time, inside the checkout: what `make data` writes, else COCO's own val2017 file
CAPTION_FILES = ("coco/captions_train2017_subset10000_seed0.json",
                 "coco/annotations/captions_val2017.json")
DEFAULT_CAPTIONS = next((f for f in CAPTION_FILES if Path(f).is_file()), CAPTION_FILES[0])
WARMUP_STEPS = 2      # untimed steps first: page faults, BLAS thread start-up
TIMED_STEPS = 5
FIXED_CAPTIONS = 512  # --fixed-length batch: 512 captions = 256 photos x 2, as in training
GEMM_ROWS = 8192      # tokens per GEMM in the peak measurement (~512 captions x 16 tokens)
GEMM_SQUARE = 2048    # plus one square GEMM, the shape BLAS libraries are tuned for
GEMM_REPEATS = 5      # best of this many runs per shape
PYTORCH_PAIR = ("against PyTorch eager (benchmarks/torch_step.py), timed side by side on the "
                "same batch: make bench-torch (needs the [bench] extra)")
LAYER_SETS = ("fast", "reference")   # model.LAYER_SETS, each benchmarked
KEYS = ("objective", "ms_per_step", "gflop_per_step", "gflops", "peak_gflops",
        "fraction_of_peak", "peak_rss_mb", "gemm_ms", "non_gemm_share")


# ---------------------------------------------------------------- the batch's counts
def encoded_tokens(name, batch):
    """The (2B, T) ids objective `name` encodes, up to bad_views' masking (which replaces words
    by MASK and so keeps every count step_flops reads): a | b, or a | a for bad_views."""
    second = batch.tokens_a if name == "bad_views" else batch.tokens_b
    return np.concatenate([batch.tokens_a, second])                       # (2B, T)


def token_counts(name, tokens):
    """gemms.step_gemms' inputs from the encoded (B2, T) ids (PAD only after each caption's
    last token): lengths (B2,) real tokens per caption, n_tokens = their sum, n_seqs = B2, T,
    n_targets = next-token targets (real tokens followed by a real token; 0 for the views)."""
    real = tokens != PAD                                                  # (B2, T)
    n_targets = int(real[:, 1:].sum()) if name == "next_token" else 0     # tokens with a successor
    return {"lengths": real.sum(axis=1), "n_tokens": int(real.sum()), "n_seqs": tokens.shape[0],
            "T": tokens.shape[1], "n_targets": n_targets}


# ---------------------------------------------------------------- the machine
def gemm_peak_gflops(cfg, repeats=GEMM_REPEATS, rows=GEMM_ROWS, square=GEMM_SQUARE):
    """Best GFLOP/s of numpy float32 matmuls shaped like the model's: (rows, D) @ (D, F),
    (rows, F) @ (F, D) and (square, square) @ (square, square), each timed `repeats` times."""
    D, F = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    rng = np.random.default_rng(0)
    best = 0.0
    for m, k, n in [(rows, D, F), (rows, F, D), (square, square, square)]:
        a = rng.standard_normal((m, k), dtype=np.float32)                 # (m, k)
        b = rng.standard_normal((k, n), dtype=np.float32)                 # (k, n)
        out = np.empty((m, n), dtype=np.float32)                          # (m, n) touched once
        np.matmul(a, b, out=out)                                          # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.matmul(a, b, out=out)
            best = max(best, 2 * m * k * n / (time.perf_counter() - t0) / 1e9)
    return best


RSS_UNIT = {"darwin": 1}   # bytes per ru_maxrss unit: bytes on macOS, KiB on Linux and the BSDs
NOT_MEASURED = "not measured here"   # peak memory where the resource module is missing (Windows)


def peak_rss_mb(platform=None):
    """Peak resident memory of this process so far, MB, from ru_maxrss (KiB on Linux and the
    BSDs, bytes on macOS: RSS_UNIT), or None where the resource module is missing (Windows).
    platform: sys.platform's name, None for this one's."""
    if resource is None:
        return None
    unit = RSS_UNIT.get(platform or sys.platform, 1024)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit / 2**20


def rss_text(mb):
    """A peak memory for a sentence: "1,234 MB", or NOT_MEASURED for None."""
    return NOT_MEASURED if mb is None else f"{mb:,.0f} MB"


def max_rss(values):
    """The largest of some peak_rss_mb readings, None when none was measured."""
    found = [v for v in values if v is not None]
    return max(found) if found else None


# ---------------------------------------------------------------- one objective (child)
def fixed_length_batch(T, vocab_size, rng, n_captions=FIXED_CAPTIONS):
    """n_captions captions of exactly T random word ids each, no padding, as a Batch of
    n_captions / 2 photos: the layout of the PyTorch reference point."""
    ids = rng.integers(len(SPECIALS), vocab_size, size=(n_captions, T)).astype(np.int32)
    B = n_captions // 2
    return Batch(photos=np.arange(B), tokens_a=ids[:B], tokens_b=ids[B:])  # 2 x (B, T)


def time_steps(name, cfg, batch, params, rng, warmup, steps):
    """Run warmup + steps whole training steps (train.train_step at lr = cfg.lr) of objective
    `name` (= cfg.objective) on one batch; returns the timed steps' durations in seconds."""
    state = adam_init(params)
    seconds = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        loss, _, _ = train_step(params, state, batch, cfg, cfg.lr, rng)
        if step >= warmup:
            seconds.append(time.perf_counter() - t0)
        if not np.isfinite(loss):
            raise FloatingPointError(f"[{name}] loss is {loss} at bench step {step}")
    return seconds


def bench_batch(name, cfg, fixed_length=0):
    """The batch the benchmark of objective `name` times: with fixed_length T, FIXED_CAPTIONS
    captions of exactly T random word ids, else one sample_batch of the training split, as
    step 1 of training draws it (seed cfg.seed). cfg: TrainConfig (captions, batch_photos,
    seed, model sizes). Returns cfg with objective = name and the tokenizer's vocab_size
    (as train.train sets it), and the data.Batch."""
    cfg = dataclasses.replace(cfg, objective=name)
    data = prepare(cfg)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, vocab_size=data["tokenizer"].vocab_size))
    rng_data = np.random.default_rng(np.random.SeedSequence(cfg.seed).spawn(3)[1])
    if fixed_length:
        return cfg, fixed_length_batch(fixed_length, cfg.model.vocab_size, rng_data)
    return cfg, sample_batch(data["tables"]["train"], cfg.batch_photos, rng_data)


def measure(name, cfg, batch, args):
    """Time objective `name` on `batch` in this process (cfg from bench_batch; args: warmup,
    timed_steps, gemm_rows, gemm_square), then replay the step's GEMMs alone
    (gemms.replay_gemms, as many passes as timed steps). Returns the figures as a dict:
    ms_per_step is the median step, gemm_ms the median replay, non_gemm_share
    = 1 - gemm_ms / ms_per_step; peak_rss_mb is taken before the replay."""
    rng_init, _, rng_mask = (np.random.default_rng(s)
                             for s in np.random.SeedSequence(cfg.seed).spawn(3))
    counts = token_counts(name, encoded_tokens(name, batch))
    gemms = step_gemms(counts["lengths"], cfg.model, counts["n_targets"])
    flops = sum(g.flops for g in gemms)
    with blas_on(cores()):                                # the peak on every core
        peak = gemm_peak_gflops(cfg.model, rows=args.gemm_rows, square=args.gemm_square)
    params = init_params(cfg.model, rng_init)
    seconds = time_steps(name, cfg, batch, params, rng_mask, args.warmup, args.timed_steps)
    rss = peak_rss_mb()
    with blas_on(cores()):                                # as the pool's blocks: every core
        replay = replay_gemms(gemms, np.random.default_rng(0), repeats=args.timed_steps)
    median, gemm = statistics.median(seconds), statistics.median(replay)
    return {"objective": name, "ms_per_step": 1000 * median, "gflop_per_step": flops / 1e9,
            "gflops": flops / median / 1e9, "peak_gflops": peak,
            "fraction_of_peak": flops / median / 1e9 / peak, "peak_rss_mb": rss,
            "gemm_ms": 1000 * gemm, "non_gemm_share": 1 - gemm / median,
            "ms_per_step_min": 1000 * min(seconds), "gemm_ms_min": 1000 * min(replay),
            "T": counts["T"], "real_tokens": counts["n_tokens"], "sequences": counts["n_seqs"],
            "attention_grids": len(attention_grids(counts["lengths"])),
            "next_token_targets": counts["n_targets"], "steps": len(seconds),
            "cores": cores(), **describe()}


def bench_one(name, args, cfg):
    """Child: benchmark objective `name` in this process; returns measure's dict.
    cfg: the TrainConfig of the command's flags (captions, batch_photos, seed, model sizes);
    args.layer_sets: the layer set to run, "fast" or "reference"."""
    if args.layer_sets not in LAYER_SETS:
        raise ValueError(f"--only runs one layer set: pass --layers fast or --layers reference, "
                         f"not {args.layer_sets!r}")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, layers=args.layer_sets))
    cfg, batch = bench_batch(name, cfg, args.fixed_length)
    return {**measure(name, cfg, batch, args), "layers": args.layer_sets}


# ---------------------------------------------------------------- all objectives (parent)
def child_env(unset_openblas_env):
    env = dict(os.environ)
    if unset_openblas_env:
        for k in OPENBLAS_ENV:
            env.pop(k, None)
    return env


def run_child(name, layers, args, env):
    """Run `python -m minialign bench --only name --layers layers --json ...` with the parent's
    options and return its JSON dict.
    Raises ValueError if the child fails; its own error message is on stderr above."""
    argv = [sys.executable, "-m", "minialign", "bench", "--only", name, "--layers", layers,
            "--json",
            "--captions", str(Path(args.captions).resolve()),
            "--timed-steps", str(args.timed_steps),
            "--warmup", str(args.warmup), "--seed", str(args.seed),
            "--batch-photos", str(args.batch_photos), "--fixed-length", str(args.fixed_length),
            "--d-model", str(args.d_model), "--n-layers", str(args.n_layers),
            "--n-heads", str(args.n_heads), "--mlp-ratio", str(args.mlp_ratio),
            "--gemm-rows", str(args.gemm_rows), "--gemm-square", str(args.gemm_square)]
    argv += ["--threads", str(args.threads)] if args.threads else []
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True)  # stderr passes through
    if done.returncode != 0:
        raise ValueError(f"the {name} benchmark process failed (exit code {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


ROW = "{:<11} {:<9} {:>3} {:>8} {:>14} {:>10} {:>8} {:>9} {:>7} {:>7} {:>8} {:>7}"


def print_header(args, info):
    data = (f"{FIXED_CAPTIONS} captions of exactly {args.fixed_length} random word ids"
            if args.fixed_length else f"COCO captions {args.captions}, "
            f"{args.batch_photos} photos x 2 captions per step")
    print(f"minialign bench: {data}; model L={args.n_layers} D={args.d_model} "
          f"H={args.n_heads} F={args.mlp_ratio * args.d_model}; {args.warmup} warm-up + "
          f"{args.timed_steps} timed steps of objective + clip + AdamW, one child process each")
    env = ", ".join(f"{k}={info[k.lower()] if info[k.lower()] is not None else 'unset'}"
                    for k in OPENBLAS_ENV)
    print(f"BLAS: {info['blas']}, threads: {info['blas_threads']}, {env}"
          + (" (removed for the children)" if args.unset_openblas_env else ""))
    print("FLOPs: matmuls only, linear layers on real tokens, attention per length group "
          "(minialign/machinery/timing/gemms.py); GEMM ms: those matmuls replayed alone; the "
          "reference rows count the same FLOPs (its attention on the padded grid does more)")
    print(ROW.format("objective", "layers", "T", "real tok", "ms/step (min)", "GFLOP/step",
                     "GFLOP/s", "peak GF/s", "of peak", "GEMM ms", "non-GEMM", "RSS MB"))


NEGATIVE_SHARE = ("  * non-GEMM <0: the GEMM replay was slower than the whole step (host "
                  "noise); rerun")


def print_row(r):
    """One table row; a negative non-GEMM share (JSON keeps the number) reads '<0*', with
    NEGATIVE_SHARE under the row."""
    share = r["non_gemm_share"]
    print(ROW.format(r["objective"], r.get("layers", "fast"), r["T"], r["real_tokens"],
                     f"{r['ms_per_step']:.0f} ({r['ms_per_step_min']:.0f})",
                     f"{r['gflop_per_step']:.2f}", f"{r['gflops']:.1f}",
                     f"{r['peak_gflops']:.1f}", f"{r['fraction_of_peak']:.0%}",
                     f"{r['gemm_ms']:.0f}", f"{share:.0%}" if share >= 0 else "<0*",
                     "n/a" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}"),
          flush=True)
    if share < 0:
        print(NEGATIVE_SHARE, flush=True)


def run_bench(args, cfg):
    """The `bench` command (cli.add_bench_args' options; cfg: the TrainConfig of its flags):
    one child per objective (or, with --only, be that child)."""
    if not Path(args.captions).is_file():
        raise FileNotFoundError(f"{args.captions}: no such file (COCO captions JSON: `make data` "
                                "writes it; or pass --captions)")
    if not 0 <= args.fixed_length <= cfg.model.max_len:
        raise ValueError(f"--fixed-length must be in [1, {cfg.model.max_len}] "
                         f"(or 0 for COCO batches), got {args.fixed_length}")
    if args.only:
        result = bench_one(args.only, args, cfg)
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print_row(result)
        return [result]
    env = child_env(args.unset_openblas_env)
    if not args.json:
        print_header(args, describe(env))
    results = []
    sets = LAYER_SETS if args.layer_sets == "both" else (args.layer_sets,)
    for name in OBJECTIVES:
        for layers in sets:
            results.append(run_child(name, layers, args, env))
            if args.json:
                print(json.dumps(results[-1]), flush=True)
            else:
                print_row(results[-1])
    if not args.json:
        if len(sets) == 2:
            print(price_of_reading(results))
        print(PYTORCH_PAIR)
    return results


def price_of_reading(results):
    """One line: each objective's reference ms/step over its fast ms/step."""
    ms = {(r["objective"], r["layers"]): r["ms_per_step"] for r in results}
    return "reference / fast ms/step (the price of training on layers.py): " + ", ".join(
        f"{name} {ms[name, 'reference'] / ms[name, 'fast']:.1f}x" for name in OBJECTIVES)
