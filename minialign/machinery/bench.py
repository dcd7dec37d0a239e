"""Speed of one training step of each objective, against numpy's own float32 GEMM peak.

`python -m minialign bench` runs each objective in a fresh child process,
`python -m minialign.machinery.bench --only NAME --json` (so that each one's peak memory, the
process-wide ru_maxrss, is its own), and each child:
  1. builds batches the way training does (train.prepare, data.sample_batch: 256 photos, two
     captions each, 512 captions), or with --fixed-length T 512 captions of exactly T word ids;
  2. times numpy float32 matmuls of the model's shapes: the best GFLOP/s is `peak_gflops`;
  3. runs warm-up steps, then timed steps of train.train_step (objective, clip_grad_norm,
     adam_step: a whole training step on one fixed batch), and reports the median and min
     ms/step, the step's FLOPs (step_flops, counted from the batch's token counts), GFLOP/s
     and the fraction of peak.
This is a benchmark, not a test: nothing here asserts a speed.
"""
import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..data import Batch, sample_batch
from .flags import check_heads_divide_width, int_at_least, nonnegative_int, positive_int
from ..model import ModelConfig, init_params
from ..objectives import OBJECTIVES
from ..optim import adam_init
from ..tokenizer import PAD, SPECIALS
from ..train import TrainConfig, prepare, train_step

DEFAULT_CAPTIONS = Path(__file__).resolve().parents[3] / "shared" / "coco" / "captions_val2017.json"
WARMUP_STEPS = 2      # untimed steps first: page faults, BLAS thread start-up
TIMED_STEPS = 5
FIXED_CAPTIONS = 512  # --fixed-length batch: 512 captions = 256 photos x 2, as in training
GEMM_ROWS = 8192      # tokens per GEMM in the peak measurement (~512 captions x 16 tokens)
GEMM_SQUARE = 2048    # plus one square GEMM, the shape BLAS libraries are tuned for
GEMM_REPEATS = 5      # best of this many runs per shape
OPENBLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
PYTORCH_REFERENCE = ("PyTorch CPU eager runs one good-views step of this model (512 captions, "
                     "T=16) in ~1.0 s and a next-token step in ~2.0 s")
KEYS = ("objective", "ms_per_step", "gflop_per_step", "gflops", "peak_gflops",
        "fraction_of_peak", "peak_rss_mb")


# ---------------------------------------------------------------- counting FLOPs
def step_flops(n_tokens, n_seqs, T, cfg, n_targets=0):
    """Matmul FLOPs of one training step (forward + backward), a multiply-add counted as 2.

    n_tokens: n, real (non-PAD) tokens in the n_seqs = B2 encoded sequences of padded length T;
    cfg: ModelConfig (D = d_model, F = mlp_ratio * D, L = n_layers, V = vocab_size);
    n_targets: n_t, next-token targets (real tokens whose next token is real), 0 for the views.

        forward  = L * [2 n (3 D^2 + D^2 + 2 D F)   q,k,v and output projections, MLP in and out,
                                                    on the real tokens only (packed)
                        + 4 B2 T^2 D]               q k^T and probs v on the padded (B2, H, T, T)
                                                    layout: 2 * B2 * H * T * T * Dh each, Dh H = D
                 + 2 n_t D V                        tied next-token head, next_token only
        backward = 2 * forward                      each matmul has two gradient matmuls
        step     = 3 * forward

    Not counted: the embedding lookup and its backward (a scatter-add), LayerNorm, GELU,
    softmax, the losses, clipping and Adam (all elementwise, O(n D) or O(B2 H T^2)).
    Returns an int."""
    D, L, V = cfg.d_model, cfg.n_layers, cfg.vocab_size
    F = cfg.mlp_ratio * D
    per_token = 2 * n_tokens * (3 * D * D + D * D + 2 * D * F)
    attention = 4 * n_seqs * T * T * D
    forward = L * (per_token + attention) + 2 * n_targets * D * V
    return 3 * forward


def encoded_tokens(name, batch):
    """The (2B, T) ids objective `name` encodes, up to bad_views' masking (which replaces words
    by MASK and so keeps every count step_flops reads): a | b, or a | a for bad_views."""
    second = batch.tokens_a if name == "bad_views" else batch.tokens_b
    return np.concatenate([batch.tokens_a, second])                       # (2B, T)


def token_counts(name, tokens):
    """step_flops' inputs from the encoded (B2, T) ids: n_tokens, n_seqs, T, n_targets."""
    real = tokens != PAD                                                  # (B2, T)
    n_targets = int(real[:, 1:].sum()) if name == "next_token" else 0     # tokens with a successor
    return {"n_tokens": int(real.sum()), "n_seqs": tokens.shape[0], "T": tokens.shape[1],
            "n_targets": n_targets}


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


def blas_info(env):
    """numpy's BLAS (name, version) and the threads and OpenBLAS settings a process with
    environment `env` gets. threads: OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else all cores."""
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    threads = env.get("OPENBLAS_NUM_THREADS") or env.get("OMP_NUM_THREADS") or os.cpu_count()
    return {"blas": blas.get("name", "?"), "blas_version": blas.get("version", "?"),
            "threads": int(threads), **{k.lower(): env.get(k) for k in OPENBLAS_ENV}}


def peak_rss_mb():
    """Peak resident memory of this process so far, MB (Linux reports ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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


def bench_one(name, args):
    """Child: benchmark objective `name` in this process; returns its figures as a dict."""
    captions = Path(args.captions)
    model = ModelConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                        mlp_ratio=args.mlp_ratio)
    cfg = TrainConfig(objective=name, captions=str(captions), batch_photos=args.batch_photos,
                      model=model)
    data = prepare(cfg)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(      # as train.train does
        model, vocab_size=data["tokenizer"].vocab_size))
    rng_init, rng_data, rng_mask = (np.random.default_rng(s)
                                    for s in np.random.SeedSequence(args.seed).spawn(3))
    if args.fixed_length:
        batch = fixed_length_batch(args.fixed_length, cfg.model.vocab_size, rng_data)
    else:
        batch = sample_batch(data["tables"]["train"], args.batch_photos, rng_data)
    counts = token_counts(name, encoded_tokens(name, batch))
    flops = step_flops(counts["n_tokens"], counts["n_seqs"], counts["T"], cfg.model,
                       counts["n_targets"])
    peak = gemm_peak_gflops(cfg.model, rows=args.gemm_rows, square=args.gemm_square)
    params = init_params(cfg.model, rng_init)
    seconds = time_steps(name, cfg, batch, params, rng_mask, args.warmup, args.steps)
    median = statistics.median(seconds)
    return {"objective": name, "ms_per_step": 1000 * median, "gflop_per_step": flops / 1e9,
            "gflops": flops / median / 1e9, "peak_gflops": peak,
            "fraction_of_peak": flops / median / 1e9 / peak, "peak_rss_mb": peak_rss_mb(),
            "ms_per_step_min": 1000 * min(seconds), "T": counts["T"],
            "real_tokens": counts["n_tokens"], "sequences": counts["n_seqs"],
            "next_token_targets": counts["n_targets"], "steps": len(seconds),
            **blas_info(os.environ)}


# ---------------------------------------------------------------- all objectives (parent)
def child_env(unset_openblas_env):
    env = dict(os.environ)
    if unset_openblas_env:
        for k in OPENBLAS_ENV:
            env.pop(k, None)
    return env


def run_child(name, args, env):
    """Run `python -m minialign.machinery.bench --only name --json ...` (this module's own entry point,
    so a child imports only what a training step needs) and return its JSON dict.
    Raises ValueError if the child fails; its own error message is on stderr above."""
    argv = [sys.executable, "-m", "minialign.machinery.bench", "--only", name, "--json",
            "--captions", str(Path(args.captions).resolve()), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--seed", str(args.seed),
            "--batch-photos", str(args.batch_photos), "--fixed-length", str(args.fixed_length),
            "--d-model", str(args.d_model), "--n-layers", str(args.n_layers),
            "--n-heads", str(args.n_heads), "--mlp-ratio", str(args.mlp_ratio),
            "--gemm-rows", str(args.gemm_rows), "--gemm-square", str(args.gemm_square)]
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True)  # stderr passes through
    if done.returncode != 0:
        raise ValueError(f"the {name} benchmark process failed (exit code {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


ROW = "{:<11} {:>3} {:>10} {:>14} {:>10} {:>8} {:>8} {:>7} {:>8}"


def print_header(args, info):
    data = (f"{FIXED_CAPTIONS} captions of exactly {args.fixed_length} random word ids"
            if args.fixed_length else f"COCO captions {args.captions}, "
            f"{args.batch_photos} photos x 2 captions per step")
    print(f"minialign bench: {data}; model L={args.n_layers} D={args.d_model} "
          f"H={args.n_heads} F={args.mlp_ratio * args.d_model}; {args.warmup} warm-up + "
          f"{args.steps} timed steps of objective + clip + AdamW, one child process each")
    env = ", ".join(f"{k}={info[k.lower()] if info[k.lower()] is not None else 'unset'}"
                    for k in OPENBLAS_ENV)
    print(f"BLAS: {info['blas']} {info['blas_version']}, threads: {info['threads']}, {env}"
          + (" (removed for the children)" if args.unset_openblas_env else ""))
    print("FLOPs: matmuls only, per-token layers on real tokens (minialign.machinery.bench.step_flops)")
    print(ROW.format("objective", "T", "real tok", "ms/step (min)", "GFLOP/step", "GFLOP/s",
                     "peak", "of peak", "RSS MB"))


def print_row(r):
    print(ROW.format(r["objective"], r["T"], r["real_tokens"],
                     f"{r['ms_per_step']:.0f} ({r['ms_per_step_min']:.0f})",
                     f"{r['gflop_per_step']:.2f}", f"{r['gflops']:.1f}",
                     f"{r['peak_gflops']:.1f}", f"{r['fraction_of_peak']:.0%}",
                     f"{r['peak_rss_mb']:.0f}"), flush=True)


def run_bench(args):
    """The `bench` command: one child per objective (or, with --only, be that child)."""
    check_heads_divide_width(args)                  # refused before any child starts
    if not Path(args.captions).is_file():
        raise FileNotFoundError(f"{args.captions}: no such file (COCO captions JSON; pass "
                                "--captions)")
    if not 0 <= args.fixed_length <= ModelConfig().max_len:
        raise ValueError(f"--fixed-length must be in [1, {ModelConfig().max_len}] "
                         f"(or 0 for COCO batches), got {args.fixed_length}")
    if args.only:
        result = bench_one(args.only, args)
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print_row(result)
        return [result]
    env = child_env(args.unset_openblas_env)
    if not args.json:
        print_header(args, blas_info(env))
    results = []
    for name in OBJECTIVES:
        results.append(run_child(name, args, env))
        if args.json:
            print(json.dumps(results[-1]), flush=True)
        else:
            print_row(results[-1])
    if not args.json:
        print(f"reference: {PYTORCH_REFERENCE} (compare with --fixed-length 16)")
    return results


def add_bench_args(p):
    """The `bench` sub-command's options. A value out of its range (flags.py) is argparse's
    one-line error, exit code 2."""
    d = ModelConfig()
    p.add_argument("--captions", default=str(DEFAULT_CAPTIONS), help="COCO captions JSON")
    p.add_argument("--steps", type=positive_int, default=TIMED_STEPS,
                   help="timed steps per objective, >= 1")
    p.add_argument("--warmup", type=nonnegative_int, default=WARMUP_STEPS,
                   help="untimed steps first, >= 0")
    p.add_argument("--fixed-length", type=nonnegative_int, default=0, metavar="T",
                   help=f"time {FIXED_CAPTIONS} captions of exactly T random word ids "
                   f"(no padding, T in [1, {d.max_len}]) instead of COCO batches; 0: COCO batches")
    p.add_argument("--json", action="store_true", help="one JSON object per objective")
    p.add_argument("--unset-openblas-env", action="store_true",
                   help="run the children without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE")
    p.add_argument("--only", choices=sorted(OBJECTIVES),
                   help="benchmark one objective in this process (what each child runs)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="init/batch/mask seed, >= 0")
    p.add_argument("--batch-photos", type=int_at_least(2), default=TrainConfig().batch_photos,
                   help="photos per step, two captions each, >= 2")
    for name in ("d_model", "n_layers", "n_heads", "mlp_ratio"):
        p.add_argument("--" + name.replace("_", "-"), type=positive_int,
                       default=getattr(d, name), help="model size, >= 1")
    p.add_argument("--gemm-rows", type=positive_int, default=GEMM_ROWS,
                   help="rows of the peak GEMMs, >= 1")
    p.add_argument("--gemm-square", type=positive_int, default=GEMM_SQUARE,
                   help="size of the square peak GEMM, >= 1")


def main(argv=None):
    """`python -m minialign.machinery.bench`: the same options as `python -m minialign bench`; the
    parent runs each child this way."""
    from ..__main__ import keep_freed_memory      # the process-level tweak of every entry point
    parser = argparse.ArgumentParser(prog="python -m minialign.machinery.bench", description=__doc__)
    add_bench_args(parser)
    args = parser.parse_args(argv)
    keep_freed_memory()
    try:
        run_bench(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"minialign bench: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
