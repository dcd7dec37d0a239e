"""minialign's training step side by side with the same step in PyTorch eager (CPU), A B A B.

    python benchmarks/torch_step.py [--captions FILE] [--pairs 3] [--threads K]
                                    [--objectives good_views next_token] [--layers fast]

For each objective: training's first batch (as benchmarks/bench.py draws it), then --pairs
times a minialign process (bench.py's: train.train_step on that batch) and a PyTorch process
(this file with --torch), each on K threads, both from minialign's initial weights. Prints each
pair's ms/step and minialign / torch. The figures move with the machine's load; only a ratio
measured side by side holds. Needs torch (the CPU wheel: `pip install -e '.[bench]'`).

The PyTorch step is what a user would write instead: token + position embeddings, L pre-LN
blocks (tanh GELU), final LayerNorm, mean over real tokens; VICReg 25/25/1 between the two
halves of the batch (good_views) or the tied next-token head's cross-entropy + VICReg's variance
and covariance (next_token); clipping at 1; AdamW, decay on the block matrices. Unlike
minialign, every layer runs on the padded (2B, T) grid. Its first loss is minialign's
(tests/test_benchmarks.py).
"""
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import bench
from minialign.optim import ADAM_EPS, DECAYED_SUFFIXES
from minialign.tokenizer import PAD
from minialign.train import init_weights

KINDS = ("good_views", "next_token")
VAR_EPS, STD_TARGET = 1e-4, 1.0      # VICReg's variance floor and hinge target (losses.py)


def encode(torch, p, tokens, n_heads, causal):
    """(2B, T) ids -> z (2B, D) mean over real tokens, hf (2B, T, D) final states."""
    F = torch.nn.functional
    B, T = tokens.shape
    real = tokens != PAD                                                   # (B, T)
    h = p["tok_emb"][tokens] + p["pos_emb"][:T]                            # (B, T, D)
    D = h.shape[-1]
    allowed = real[:, None, None, :]                                       # keys: real tokens
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(sum(k.endswith(".ln1.gamma") for k in p)):
        w = lambda name: p[f"blocks.{i}.{name}"]
        a = F.layer_norm(h, (D,), w("ln1.gamma"), w("ln1.beta"), eps=1e-5)
        q, k, v = (a @ w("attn.w_qkv") + w("attn.b_qkv")).split(D, dim=-1)
        q, k, v = (x.view(B, T, n_heads, D // n_heads).transpose(1, 2) for x in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)     # (B, H, T, Dh)
        h = h + a.transpose(1, 2).reshape(B, T, D) @ w("attn.w_o") + w("attn.b_o")
        m = F.layer_norm(h, (D,), w("ln2.gamma"), w("ln2.beta"), eps=1e-5)
        m = F.gelu(m @ w("mlp.w_in") + w("mlp.b_in"), approximate="tanh")
        h = h + m @ w("mlp.w_out") + w("mlp.b_out")
    hf = F.layer_norm(h, (D,), p["ln_f.gamma"], p["ln_f.beta"], eps=1e-5)  # (B, T, D)
    weights = real.to(hf.dtype)
    return (hf * weights[..., None]).sum(1) / weights.sum(1, keepdim=True), hf


def loss_of(torch, p, tokens, objective, n_heads):
    """objectives.good_views or next_token's loss on the (2B, T) batch a | b."""
    F = torch.nn.functional
    B = len(tokens) // 2
    z, hf = encode(torch, p, tokens, n_heads, causal=objective == "next_token")

    def variance(z):
        return F.relu(STD_TARGET - torch.sqrt(z.var(dim=0) + VAR_EPS)).mean()

    def covariance(z):
        C = (z - z.mean(0)).T @ (z - z.mean(0)) / (len(z) - 1)
        return ((C - torch.diag(torch.diag(C))) ** 2).sum() / z.shape[1]
    za, zb = z[:B], z[B:]
    anti = 25.0 * (variance(za) + variance(zb)) / 2 + (covariance(za) + covariance(zb))
    if objective == "good_views":
        return 25.0 * ((za - zb) ** 2).mean() + anti
    has_target = tokens[:, 1:] != PAD                                      # (2B, T-1)
    logits = hf[:, :-1][has_target] @ p["tok_emb"].T                       # (n_t, V) tied head
    return F.cross_entropy(logits, tokens[:, 1:][has_target]) + anti


def torch_child(args):
    """--torch OBJECTIVE: time the PyTorch step on --tokens from --params; one JSON line."""
    import torch
    torch.set_num_threads(args.threads)
    tokens = torch.from_numpy(np.load(args.tokens).astype(np.int64))
    with np.load(args.params) as f:
        p = {k: torch.tensor(f[k], dtype=torch.float32, requires_grad=True) for k in f.files}
    decay = [t for k, t in p.items() if k.endswith(DECAYED_SUFFIXES)]
    rest = [t for k, t in p.items() if not k.endswith(DECAYED_SUFFIXES)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-3, eps=ADAM_EPS)
    seconds, losses = [], []
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(torch, p, tokens, args.torch, args.n_heads)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        seconds.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    print(json.dumps({"objective": args.torch, "T": tokens.shape[1], "first_loss": losses[0],
                      "real_tokens": int((tokens != PAD).sum()), "threads": args.threads,
                      "ms_per_step": 1000 * statistics.median(seconds[args.warmup:]),
                      "torch": torch.__version__}), flush=True)


def pairs(args):
    """The parent: per objective, --pairs A B pairs on training's first batch; the ratios."""
    tokens, vocab_size = bench.training_batch(args)
    layers = args.layers[0]
    print(f"{args.captions}: {len(tokens)} captions, T = {tokens.shape[1]}; minialign "
          f"({layers} layers) vs PyTorch eager, {args.pairs} pairs, {args.warmup} + "
          f"{args.steps} steps, {args.threads} threads each", flush=True)
    with tempfile.TemporaryDirectory(prefix="minialign-torch-") as tmp:
        batch, params = Path(tmp) / "batch.npy", Path(tmp) / "params.npz"
        np.save(batch, tokens)
        cfg = bench.config(args, "good_views", layers, vocab_size)
        np.savez(params, **init_weights(cfg, np.random.default_rng(
            np.random.SeedSequence(cfg.seed).spawn(3)[0])))               # the child's init
        for name in args.objectives:
            ours = bench.child_argv(args, name, layers, batch, vocab_size)
            theirs = [sys.executable, str(Path(__file__).resolve()), "--torch", name,
                      "--tokens", str(batch), "--params", str(params), "--n-heads",
                      str(args.n_heads), "--threads", str(args.threads), "--warmup",
                      str(args.warmup), "--steps", str(args.steps)]
            ratios = []
            for i in range(args.pairs):
                m = bench.run_json(ours, bench.ONE_BLAS_THREAD)["ms_per_step"]
                t = bench.run_json(theirs)["ms_per_step"]
                ratios.append(m / t)
                print(f"{name:<11} pair {i + 1}: minialign {m:.0f} ms/step, torch {t:.0f} "
                      f"ms/step, minialign / torch {m / t:.2f}", flush=True)
            print(f"{name:<11} minialign / torch: median {statistics.median(ratios):.2f} "
                  f"(range {min(ratios):.2f}-{max(ratios):.2f})", flush=True)


def main(argv=None):
    p = bench.parser()
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("--pairs", type=int, default=3, help="A B pairs per objective")
    p.add_argument("--torch", choices=KINDS, help="(a child: the PyTorch step)")
    p.add_argument("--params", help="(the torch child's initial weights, .npz)")
    p.set_defaults(objectives=list(KINDS), layers=["fast"])
    args = p.parse_args(argv)
    if args.torch:
        return torch_child(args)
    if not set(args.objectives) <= set(KINDS):
        p.error(f"--objectives: the PyTorch step has {', '.join(KINDS)}")
    try:
        pairs(args)
    except (OSError, ValueError) as e:
        sys.exit(f"torch_step.py: error: {e}")


if __name__ == "__main__":
    main()
