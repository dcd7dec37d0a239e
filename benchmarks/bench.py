"""Speed of one training step: each objective on the fast and the reference layer set, the
matrix products (GEMMs) of a step, and numpy's float32 GEMM peak on this machine.

    python benchmarks/bench.py [--captions FILE] [--threads K] [--gemms]

Training's first batch (256 photos x 2 captions) is timed by one process per objective x layer
set (BLAS on one thread, the fast set's row blocks on K threads): --warmup untimed, then --steps
timed train.train_step calls (objective, clipping, AdamW). Columns: ms/step, median (fastest);
GFLOP of the step's products (step_gemms; --gemms lists them); GF/s against numpy's best
float32 rate at the model's shapes, K products at once; GEMM ms, the same products alone on K
threads, and non-GEMM = 1 - GEMM ms / ms/step (LayerNorm, softmax, GELU, copies, Python).
Nothing asserts a speed; the figures move with the machine's load, so compare A B A B.
"""
import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from minialign.data import Batch, sample_batch
from minialign.model import ModelConfig, layer_set
from minialign.objectives import OBJECTIVES, next_token_targets
from minialign.optim import adam_init
from minialign.tokenizer import PAD
from minialign.machinery.cli import keep_freed_memory
from minialign.train import TrainConfig, init_weights, prepare, train_step

CAPTIONS = next((f for f in ("coco/captions_train2017_subset10000_seed0.json",
                             "coco/annotations/captions_val2017.json") if Path(f).is_file()),
                "coco/annotations/captions_val2017.json")   # what `make data` writes
ONE_BLAS_THREAD = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
ROW = "{:<11} {:<9} {:>13} {:>7} {:>6} {:>6} {:>7} {:>7} {:>8}"
Gemm = namedtuple("Gemm", "name count batch M K N")   # count x batch products (M, K) @ (K, N)
SIZES = ("seed", "threads", "warmup", "steps", "batch_photos", "max_len", "d_model", "n_layers",
         "n_heads")                    # the flags a child takes from its parent


def flops(gemms):
    """FLOPs of the products, a multiply-add counted as 2."""
    return sum(2 * g.count * g.batch * g.M * g.K * g.N for g in gemms)


def linear(name, count, M, K, N):
    """y = x w: (M, K) @ (K, N), and its backward dx = dy w^T, dw = x^T dy."""
    return [Gemm(name, count, 1, M, K, N), Gemm(f"{name} dx", count, 1, M, N, K),
            Gemm(f"{name} dw", count, 1, K, M, N)]


def step_gemms(tokens, model, objective):
    """The products of one step of `objective` on the (2B, T) ids it encodes (encoded). Per
    block: the linear layers on the n real tokens (the reference's attention projections on
    its padded (2B, T) grid), per attention grid (the fast set's length groups of Bg captions
    x Tg tokens; the reference's one grid) q k^T, probs v and their backward; once: VICReg's
    C = zc^T zc and dz per view, the reference's pool (a (2B, n) matrix), next_token's head."""
    mask = tokens != PAD
    (B2, T), n = mask.shape, int(mask.sum())
    D, L, H, V = model.d_model, model.n_layers, model.n_heads, model.vocab_size
    F, Dh = model.mlp_ratio * D, D // H
    if model.layers == "fast":
        rows = layer_set(model).token_rows(mask, False, np.float32)
        grids, m = [(g.Bg, g.Tg) for g in rows.groups], n
    else:
        grids, m = [(B2, T)], B2 * T
    gemms = (linear("attn qkv", L, m, D, 3 * D) + linear("attn out", L, m, D, D)
             + linear("mlp in", L, n, D, F) + linear("mlp out", L, n, F, D))
    for Bg, Tg in grids:
        gemms += [Gemm("attn q k^T, dprobs", 2 * L, Bg * H, Tg, Dh, Tg),
                  Gemm("attn probs v, dv, dq, dk", 4 * L, Bg * H, Tg, Tg, Dh)]
    gemms += [Gemm("vicreg C", 2, 1, D, B2 // 2, D), Gemm("vicreg dz", 2, 1, B2 // 2, D, D)]
    if model.layers != "fast":
        gemms += [Gemm("pool", 1, 1, B2, n, D), Gemm("pool dh", 1, 1, n, B2, D)]
    if objective == "next_token":
        n_t = int(next_token_targets(tokens)[1].sum())
        gemms += [Gemm("head", 1, 1, n_t, D, V), Gemm("head dhf", 1, 1, n_t, V, D),
                  Gemm("head dtok_emb", 1, 1, V, n_t, D)]
    return gemms


def encoded(objective, tokens):
    """The (2B, T) ids `objective` encodes from a batch's a | b."""
    B = len(tokens) // 2
    return np.concatenate([tokens[:B], tokens[:B]]) if objective == "bad_views" else tokens


def replay(gemms, threads, repeats, rng):
    """Seconds of each of `repeats` passes (after one untimed) over the products alone, random
    float32 operands, dealt in turn to `threads` threads (one BLAS thread each)."""
    shapes = [(g.batch, g.M, g.K, g.N) for g in gemms for _ in range(g.count)]
    array = functools.cache(lambda shape, out=None: rng.standard_normal(shape, dtype=np.float32))
    work = [[(array((b, M, K)), array((b, K, N)), array((b, M, N), j))   # outputs: per thread
             for b, M, K, N in shapes[j::threads]] for j in range(threads)]

    def one(mine):
        for a, w, out in mine:
            np.matmul(a, w, out=out)
    seconds = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            list(pool.map(one, work))
            seconds.append(time.perf_counter() - t0)
    return seconds[1:]


def peak_gflops(model, threads, rng, repeats=3):
    """numpy's best float32 GFLOP/s at the model's shapes: (32 D, D) @ (D, F), (32 D, F) @ (F, D)
    and a square (8 D)^3, `threads` products at once."""
    D, F = model.d_model, model.mlp_ratio * model.d_model
    return max(flops([g]) / min(replay([g], threads, repeats, rng)) / 1e9 for g in
               (Gemm("", threads, 1, 32 * D, D, F), Gemm("", threads, 1, 32 * D, F, D),
                Gemm("", threads, 1, 8 * D, 8 * D, 8 * D)))


def config(args, objective, layers, vocab_size=6000):
    return TrainConfig(objective=objective, captions=args.captions, seed=args.seed,
                       batch_photos=args.batch_photos, model=ModelConfig(
                           vocab_size=vocab_size, max_len=args.max_len, d_model=args.d_model,
                           n_layers=args.n_layers, n_heads=args.n_heads, layers=layers))


def child(args):
    """Time objective args.child on the saved batch args.tokens in this process; one JSON line."""
    name, layers = args.child, args.layers[0]
    tokens = np.load(args.tokens)                                         # (2B, T) a | b
    B = len(tokens) // 2
    cfg = config(args, name, layers, args.vocab_size)
    keep_freed_memory()                                                   # as train's process
    if layers == "fast":
        layer_set(cfg.model).set_threads(args.threads)
    rng_init, _, rng_mask = map(np.random.default_rng, np.random.SeedSequence(cfg.seed).spawn(3))
    params = init_weights(cfg, rng_init)                                 # as train.train seeds
    state, batch, seconds = adam_init(params), Batch(np.arange(B), tokens[:B], tokens[B:]), []
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        train_step(params, state, batch, cfg, cfg.lr, rng_mask)
        seconds.append(time.perf_counter() - t0)
    seconds, rng, gemms = seconds[args.warmup:], np.random.default_rng(0), step_gemms(
        encoded(name, tokens), cfg.model, name)
    flop, ms = flops(gemms), 1000 * statistics.median(seconds)
    gemm_ms = 1000 * statistics.median(replay(gemms, args.threads, args.steps, rng))
    peak = peak_gflops(cfg.model, args.threads, rng)
    print(json.dumps({
        "objective": name, "layers": layers, "threads": args.threads, "T": tokens.shape[1],
        "real_tokens": int((tokens != PAD).sum()), "ms_per_step": ms,
        "ms_min": 1000 * min(seconds), "steps_ms": [round(1000 * s, 1) for s in seconds],
        "gflop_per_step": flop / 1e9, "gflops": flop / ms / 1e6, "peak_gflops": peak,
        "fraction_of_peak": flop / ms / 1e6 / peak, "gemm_ms": gemm_ms,
        "non_gemm_share": 1 - gemm_ms / ms}), flush=True)


def child_argv(args, name, layers, tokens, vocab_size):
    """The command line of one child: this file with --child and the parent's SIZES."""
    return [sys.executable, str(Path(__file__).resolve()), "--child", name, "--layers", layers,
            "--tokens", str(tokens), "--vocab-size", str(vocab_size),
            *(x for k in SIZES for x in (f"--{k.replace('_', '-')}", str(getattr(args, k))))]


def run_json(argv, env=None):
    """Run a child; the dict of the last line it prints (its stderr passes through)."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0 or not done.stdout.strip():
        raise ValueError(f"{Path(argv[1]).name} {' '.join(argv[2:4])}: the child process "
                         f"failed (exit code {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def training_batch(args):
    """(2B, T) ids a | b of training's first batch at --seed, and the vocabulary size."""
    cfg = config(args, "good_views", "reference")
    data = prepare(cfg)
    rng_data = np.random.default_rng(np.random.SeedSequence(cfg.seed).spawn(3)[1])  # train's
    batch = sample_batch(data["tables"]["train"], cfg.batch_photos, rng_data)
    return np.concatenate([batch.tokens_a, batch.tokens_b]), data["tokenizer"].vocab_size


def print_gemms(name, tokens, model):
    """The products of one step by name: how many, their shape, GFLOP and share."""
    gemms = step_gemms(encoded(name, tokens), model, name)
    print(f"\n{name}, {model.layers}: {flops(gemms) / 1e9:.2f} GFLOP")
    for key in dict.fromkeys(g.name for g in gemms):
        gs = [g for g in gemms if g.name == key]
        shape = f"({gs[0].M}, {gs[0].K}) @ ({gs[0].K}, {gs[0].N})" if len(gs) == 1 else \
            f"{len(gs)} attention grids"
        print(f"  {key:<26} {sum(g.count * g.batch for g in gs):>7,} x {shape:<26} "
              f"{flops(gs) / 1e9:7.3f} GFLOP {flops(gs) / flops(gemms):6.1%}")


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--captions", default=CAPTIONS, help="COCO captions JSON (default: %(default)s)")
    p.add_argument("--objectives", nargs="+", choices=list(OBJECTIVES),
                   default=["good_views", "bad_views", "next_token"])
    p.add_argument("--layers", nargs="+", choices=("fast", "reference"),
                   default=["fast", "reference"])
    defaults = {"threads": os.cpu_count() or 1, "warmup": 2, "steps": 5, "seed": 0,
                "batch_photos": TrainConfig.batch_photos}
    for name in SIZES:                 # --warmup untimed steps, --steps timed, sizes
        p.add_argument(f"--{name.replace('_', '-')}", type=int,
                       default=defaults.get(name, getattr(ModelConfig, name, None)))
    p.add_argument("--gemms", action="store_true", help="list each step's products")
    p.add_argument("--child", choices=list(OBJECTIVES), help=argparse.SUPPRESS)
    p.add_argument("--tokens", help=argparse.SUPPRESS)
    p.add_argument("--vocab-size", type=int, help=argparse.SUPPRESS)
    return p


def main(argv=None):
    """The parent: draw the batch, run a child per objective x layer set, print the table."""
    args = parser().parse_args(argv)
    if args.child:
        return child(args)
    try:
        tokens, vocab_size = training_batch(args)
        print(f"{args.captions}: {len(tokens)} captions, T = {tokens.shape[1]}, "
              f"{(tokens != PAD).sum()} real tokens; L={args.n_layers} D={args.d_model} "
              f"H={args.n_heads} V={vocab_size}; {args.warmup} + {args.steps} steps, "
              f"{args.threads} threads, BLAS on one")
        print(ROW.format("objective", "layers", "ms/step (min)", "GFLOP", "GF/s", "peak",
                         "of peak", "GEMM ms", "non-GEMM"))
        results = []
        with tempfile.TemporaryDirectory(prefix="minialign-bench-") as tmp:
            np.save(Path(tmp) / "batch.npy", tokens)
            for name in args.objectives:
                for layers in args.layers:
                    r = run_json(child_argv(args, name, layers, Path(tmp) / "batch.npy",
                                            vocab_size), ONE_BLAS_THREAD)
                    results.append(r)
                    print(ROW.format(name, layers, f"{r['ms_per_step']:.0f} ({r['ms_min']:.0f})",
                                     f"{r['gflop_per_step']:.2f}", f"{r['gflops']:.1f}",
                                     f"{r['peak_gflops']:.1f}", f"{r['fraction_of_peak']:.0%}",
                                     f"{r['gemm_ms']:.0f}", f"{r['non_gemm_share']:.0%}"),
                          flush=True)
    except (OSError, ValueError) as e:
        sys.exit(f"bench.py: error: {e}")
    for name in args.objectives if args.gemms else ():
        for layers in args.layers:
            print_gemms(name, tokens, config(args, name, layers, vocab_size).model)
    return results


if __name__ == "__main__":
    main()
