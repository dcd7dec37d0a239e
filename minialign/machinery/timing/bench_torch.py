"""minialign's training step side by side with PyTorch CPU eager on the same batch.

The PyTorch side is benchmarks/torch_step.py in this repository: a plain PyTorch eager
implementation of the same model and step, not part of the package and never imported by it;
it runs in its own process, with its own interpreter (--torch-python) where torch is installed
(the optional [bench] extra).

    python -m minialign.machinery.timing.bench_torch [--torch-step benchmarks/torch_step.py]
        [--pairs 3] [--threads 2] [--max-len 16 | --fixed-length 16] [--objective good_views]

For each objective (good_views -> torch_step.py --kind views; next_token -> --kind ntp, the
head on the rows that have a target, as minialign's):
  1. draw the batch `bench` times (bench.bench_batch: a real COCO batch, captions truncated to
     --max-len tokens, or --fixed-length T random word ids), save its encoded (2B, T) ids,
     PAD = 0, caption a | caption b, to DIR/OBJECTIVE.npy;
  2. alternate A B A B, --pairs times: a minialign child (this module with --child: times
     train.train_step on exactly that batch and replays its GEMMs, bench.measure) and a torch
     child (torch_step.py --tokens DIR/OBJECTIVE.npy), each with --threads threads;
  3. print each pair's ms/step, the median ratio minialign / torch over the pairs and its
     range, and the median non-GEMM share of minialign's step.
These machines are noisy (shared cores): only a ratio measured side by side means something.

The two steps compute the same loss from the same weights (tests/test_torch_step.py checks it
to float32 rounding): same sizes L=4, D=256, H=4, F=1024, 512 captions, float32, tanh GELU,
tied next-token head, VICReg 25/25/1 per half, gradient clipping at 1, AdamW. What differs is
how: minialign packs the real tokens and runs attention per length group, torch runs every
layer on the padded (512, T) grid (the padding costs it time) in its own fused kernels.
"""
import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ...data import Batch
from ...train import TrainConfig
from . import bench
from ..run.flags import add_config_flags, config_from_args, nonnegative_int, positive_int
from ..run.machine import OPENBLAS_ENV, keep_freed_memory, use_cores

# in a clone (or an editable install): <repo>/benchmarks/torch_step.py
TORCH_STEP = Path(__file__).resolve().parents[3] / "benchmarks" / "torch_step.py"
KINDS = {"good_views": ["--kind", "views"], "next_token": ["--kind", "ntp", "--head", "valid"]}
TORCH_MODEL = {"d_model": 256, "n_layers": 4, "n_heads": 4, "mlp_ratio": 4}  # torch_step.py's
TORCH_CAPTIONS = 512   # torch_step.B: its VICReg splits the batch at row 256
PAIRS = 3
THREADS = 2            # the targets are at 2 threads
FIELDS = ("seed", "max_len", "tokenizer", "vocab")


# ---------------------------------------------------------------- one side (child)
def run_child_side(args):
    """--child NAME: time objective NAME on the saved batch --tokens (bench.measure) in this
    process; print its dict as one JSON line."""
    tokens = np.load(args.tokens)                                         # (2B, T) int
    B = len(tokens) // 2
    batch = Batch(photos=np.arange(B), tokens_a=tokens[:B].astype(np.int32),
                  tokens_b=tokens[B:].astype(np.int32))                   # 2 x (B, T)
    cfg = config_from_args(args, TrainConfig(), objective=args.child)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model,
                                                             vocab_size=args.vocab_size))
    print(json.dumps(bench.measure(args.child, cfg, batch, args)), flush=True)


def run_json(argv, what):
    """Run a child process; return the dict of the last line it prints (its stderr passes
    through). Raises ValueError naming `what` if it fails."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise ValueError(f"the {what} process failed (exit code {done.returncode}): "
                         f"{' '.join(map(str, argv))}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the pairs (parent)
def check_pair_args(args, cfg):
    """Raises ValueError / FileNotFoundError, one line naming the flag, for a comparison
    torch_step.py cannot make."""
    if args.torch_step is None:
        if not TORCH_STEP.is_file():
            raise FileNotFoundError("benchmarks/torch_step.py is not beside this installed "
                                    "package: run from a clone, or pass --torch-step PATH")
        args.torch_step = str(TORCH_STEP)
    if not Path(args.torch_step).is_file():
        raise FileNotFoundError(f"--torch-step {args.torch_step}: no such file")
    for name, value in TORCH_MODEL.items():
        if getattr(cfg.model, name) != value:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(cfg.model, name)}: "
                             f"torch_step.py's model has {name} = {value}")
    if 2 * cfg.batch_photos != TORCH_CAPTIONS:
        raise ValueError(f"--batch-photos {cfg.batch_photos}: torch_step.py's step takes "
                         f"{TORCH_CAPTIONS} captions = {TORCH_CAPTIONS // 2} photos x 2")


def side_argvs(name, args, cfg, path):
    """The two children's command lines: (minialign, torch)."""
    threads = ["--threads", str(args.threads or THREADS)]
    steps = ["--warmup", str(args.warmup)]
    ours = [sys.executable, "-m", "minialign.machinery.timing.bench_torch", "--child", name,
            "--tokens", str(path), "--vocab-size", str(cfg.model.vocab_size),
            "--seed", str(cfg.seed), "--max-len", str(cfg.model.max_len),
            "--timed-steps", str(args.timed_steps), *steps, *threads]
    theirs = [args.torch_python, str(Path(args.torch_step).resolve()), *KINDS[name],
              "--tokens", str(path), "--V", str(cfg.model.vocab_size),
              "--steps", str(args.timed_steps), *steps, *threads]
    return ours, theirs


def pair_objective(name, args, cfg, folder):
    """Save objective `name`'s batch in `folder`, run the A B pairs; returns a summary dict."""
    cfg, batch = bench.bench_batch(name, cfg, args.fixed_length)
    tokens = bench.encoded_tokens(name, batch)                            # (2B, T) a | b
    path = Path(folder) / f"{name}.npy"
    np.save(path, tokens)
    ours, theirs = side_argvs(name, args, cfg, path)
    pairs = []
    for i in range(args.pairs):
        m = run_json(ours, f"minialign {name}")
        t = run_json(theirs, f"torch_step.py {KINDS[name][1]} (torch must import in "
                             f"--torch-python {args.torch_python}: pip install -e '.[bench]')")
        if (t["T"], t["real_tokens"]) != (m["T"], m["real_tokens"]):
            raise ValueError(f"torch_step.py timed another batch: T={t['T']}, "
                             f"{t['real_tokens']} real tokens, not {m['T']}, {m['real_tokens']}")
        pairs.append((m, t))
        print(f"  {name} pair {i + 1}: minialign {m['ms_per_step']:.0f} ms/step (non-GEMM "
              f"{m['non_gemm_share']:.0%}), torch {t['ms_per_step']:.0f} ms/step, ratio "
              f"{m['ms_per_step'] / t['ms_per_step']:.2f}", file=sys.stderr, flush=True)
    ratios = [m["ms_per_step"] / t["ms_per_step"] for m, t in pairs]
    return {"objective": name, "T": int(tokens.shape[1]), "real_tokens": pairs[0][0]["real_tokens"],
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "ratios": ratios,
            "minialign_ms": statistics.median(m["ms_per_step"] for m, _ in pairs),
            "torch_ms": statistics.median(t["ms_per_step"] for _, t in pairs),
            "non_gemm_share": statistics.median(m["non_gemm_share"] for m, _ in pairs),
            "gemm_ms": statistics.median(m["gemm_ms"] for m, _ in pairs),
            "threads": args.threads or THREADS, "pairs": args.pairs, "batch": str(path)}


def run_pairs(args, cfg):
    """Each objective of args.objective, paired A B A B with torch_step.py (module docstring).
    args: this module's parser's options; cfg: the TrainConfig of its flags.
    Returns the list of pair_objective summaries, also printed (--json: one line each)."""
    check_pair_args(args, cfg)
    if not 0 <= args.fixed_length <= cfg.model.max_len:
        raise ValueError(f"--fixed-length must be in [1, {cfg.model.max_len}] "
                         f"(or 0 for COCO batches), got {args.fixed_length}")
    env = ", ".join(f"{k}={os.environ[k]}" for k in OPENBLAS_ENV if k in os.environ) or "none"
    data = (f"{bench.FIXED_CAPTIONS} captions of exactly {args.fixed_length} random word ids"
            if args.fixed_length else f"COCO batch of {args.captions}, captions truncated "
            f"to {cfg.model.max_len} tokens")
    print(f"minialign vs PyTorch eager ({args.torch_step}): {data}; {args.pairs} pairs A B of "
          f"{args.warmup} warm-up + {args.timed_steps} timed steps, {args.threads or THREADS} "
          f"threads each; OPENBLAS_* set: {env}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="minialign-pair-") as tmp:
        folder = args.batch_dir or tmp
        Path(folder).mkdir(parents=True, exist_ok=True)
        for name in args.objective:
            r = pair_objective(name, args, cfg, folder)
            results.append(r)
            print(json.dumps(r) if args.json else
                  f"{name:<11} T={r['T']} ({r['real_tokens']} real tokens): minialign "
                  f"{r['minialign_ms']:.0f} ms/step, torch {r['torch_ms']:.0f} ms/step; "
                  f"minialign / torch = {r['ratio_median']:.2f} (median of {args.pairs}, range "
                  f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}); minialign's GEMMs alone "
                  f"{r['gemm_ms']:.0f} ms, non-GEMM share {r['non_gemm_share']:.0%}", flush=True)
    return results


def add_pair_args(p):
    """The options `bench` has not: what to pair with, how often."""
    p.add_argument("--torch-step", "--torch-pair", default=None, metavar="PATH",
                   help="the PyTorch step to pair with (default: the repository's "
                        "benchmarks/torch_step.py)")
    p.add_argument("--pairs", type=positive_int, default=PAIRS,
                   help="A B pairs (minialign child, torch child) per objective, >= 1")
    p.add_argument("--torch-python", default=sys.executable, metavar="PYTHON",
                   help="the interpreter torch is installed in (default: this one)")
    p.add_argument("--batch-dir", default=None, metavar="DIR",
                   help="keep the saved batches (OBJECTIVE.npy) here (default: a temporary folder)")
    p.add_argument("--objective", nargs="+", choices=sorted(KINDS), default=list(KINDS),
                   help="objectives to pair")


def parser():
    p = argparse.ArgumentParser(prog="python -m minialign.machinery.timing.bench_torch",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--captions", default=str(bench.DEFAULT_CAPTIONS), help="COCO captions JSON")
    p.add_argument("--timed-steps", type=positive_int, default=bench.TIMED_STEPS)
    p.add_argument("--warmup", type=nonnegative_int, default=bench.WARMUP_STEPS)
    p.add_argument("--fixed-length", type=nonnegative_int, default=0, metavar="T",
                   help="T random word ids per caption instead of COCO batches; 0: COCO")
    p.add_argument("--threads", type=positive_int, default=THREADS, help="threads per side")
    p.add_argument("--json", action="store_true", help="one JSON line per objective")
    add_config_flags(p, FIELDS, TrainConfig())
    add_pair_args(p)
    p.add_argument("--child", choices=sorted(KINDS), help=argparse.SUPPRESS)
    p.add_argument("--tokens", help=argparse.SUPPRESS)
    p.add_argument("--vocab-size", type=positive_int, help=argparse.SUPPRESS)
    p.set_defaults(gemm_rows=bench.GEMM_ROWS, gemm_square=bench.GEMM_SQUARE)
    return p


def main(argv=None):
    """Parse and run; returns the exit code (0, or 2 with one line on bad input)."""
    keep_freed_memory()
    args = parser().parse_args(argv)
    use_cores(args.threads)
    try:
        if args.child:
            run_child_side(args)
        else:
            run_pairs(args, config_from_args(args, TrainConfig(), captions=args.captions))
    except (OSError, ValueError) as e:
        print(f"minialign bench_torch: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
