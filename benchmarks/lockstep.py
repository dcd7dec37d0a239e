"""Two runs of one config side by side, from the same weights and the same batches, differing
only in how they round (layer set, arithmetic): how far their weights drift apart, step by step.

    python benchmarks/lockstep.py --captions results/synthetic/world/captions_synthetic.json \\
        --a fast:float32 --b reference:float32

A run is LAYERS:DTYPE (fast|reference : float32|float64). The other flags default to the
demo's settings (`make demo`: D = 64, 1 block, 500 steps of 128 photos, lr 3.16e-3, warm-up
25). Prints, at each step of --at, ||w_a - w_b|| / ||w_b|| over all the weights (in float64)
and the two runs' losses. Two BLAS kernels cannot share one process: for those, train each
with `OPENBLAS_CORETYPE=...` in its own command and compare their tables.
"""
import argparse
import dataclasses

import numpy as np

import minialign.machinery.variants  # noqa: F401  (the named variants, for --objective)
from minialign.data import sample_batch
from minialign.model import ModelConfig
from minialign.objectives import OBJECTIVES
from minialign.optim import adam_init, lr_at
from minialign.train import TrainConfig, init_weights, prepare, train_step


def run_spec(text):
    """'fast:float32' -> ("fast", "float32")."""
    layers, _, dtype = text.partition(":")
    if layers not in ("fast", "reference") or dtype not in ("float32", "float64"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected LAYERS:DTYPE, e.g. fast:float32")
    return layers, dtype


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--captions", required=True)
    p.add_argument("--objective", default="good_views", choices=list(OBJECTIVES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--a", type=run_spec, default=("fast", "float32"))
    p.add_argument("--b", type=run_spec, default=("reference", "float32"))
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-photos", type=int, default=128)
    p.add_argument("--warmup-steps", type=int, default=25)
    p.add_argument("--lr", type=float, default=3.16e-3)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layers", type=int, default=1)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--at", default="1,101,201,301,500",
                   help="the steps to report, comma-separated (the last step always)")
    return p.parse_args(argv)


def relative_difference(wa, wb):
    """||wa - wb|| / ||wb|| over every array of two parameter dicts, in float64."""
    diff = sum(float(np.sum((wa[k].astype(np.float64) - wb[k]) ** 2)) for k in wb)
    norm = sum(float(np.sum(wb[k].astype(np.float64) ** 2)) for k in wb)
    return float(np.sqrt(diff / norm))


def main(argv=None):
    """Prints one line per reported step; returns [(step, relative difference, loss a, loss b)]."""
    args = parse(argv)
    configs = [TrainConfig(
        objective=args.objective, captions=args.captions, seed=args.seed, steps=args.steps,
        batch_photos=args.batch_photos, warmup_steps=args.warmup_steps, lr=args.lr,
        model=ModelConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                          layers=layers, dtype=dtype)) for layers, dtype in (args.a, args.b)]
    data = prepare(configs[0])
    configs = [dataclasses.replace(c, model=dataclasses.replace(
        c.model, vocab_size=data["tokenizer"].vocab_size)) for c in configs]
    runs = []
    for cfg in configs:        # seeded as train.train seeds a run: init, batch and mask streams
        rng_init, rng_data, rng_mask = map(np.random.default_rng,
                                           np.random.SeedSequence(cfg.seed).spawn(3))
        params = init_weights(cfg, rng_init)
        runs.append((cfg, params, adam_init(params), rng_data, rng_mask))
    at = {int(s) for s in args.at.split(",")} | {args.steps}
    rows = []
    for step in range(args.steps):
        losses = []
        for cfg, params, state, rng_data, rng_mask in runs:
            lr = lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
            batch = sample_batch(data["tables"]["train"], cfg.batch_photos, rng_data)
            losses.append(train_step(params, state, batch, cfg, lr, rng_mask)[0])
        if step + 1 in at:
            rel = relative_difference(runs[0][1], runs[1][1])
            rows.append((step + 1, rel, *losses))
            print(f"step {step + 1}: ||w_a - w_b|| / ||w_b|| = {rel:.2e}; "
                  f"loss {losses[0]:.6f} / {losses[1]:.6f}", flush=True)
    return rows


if __name__ == "__main__":
    main()
