"""minialign's training step written in plain PyTorch (CPU, eager): what a user would write
instead, to time minialign against. Not part of the package and never imported by it; it runs
in its own process (`python -m minialign.machinery.timing.bench_torch` starts it), with torch from the
optional `[bench]` extra: `pip install -e '.[bench]'` (the CPU wheel first, see docs).

The same model and step as minialign's (model.py, objectives.py, optim.py), in torch's own
layers: token + position embeddings, L pre-LN blocks (LayerNorm, multi-head attention, residual,
LayerNorm, Linear, tanh-GELU, Linear, residual), final LayerNorm, mean pool over real tokens;
VICReg 25/25/1 between the two captions of each photo (views), or next-token cross-entropy
through the head tied to the token embedding plus VICReg's variance + covariance (ntp); global
gradient-norm clipping at 1; AdamW (decay on the four block matrices only). Unlike minialign,
every layer runs on the padded (2B, T) grid, as plain PyTorch code does.

    python benchmarks/torch_step.py --kind views --tokens batch.npy --V 5814 [--threads 2]
    python benchmarks/torch_step.py --kind ntp --tokens batch.npy --V 5814 --params init.npz

--tokens: a (2B, T) int array, caption a rows then caption b rows, PAD = 0 after each caption.
--params: start from these weights (minialign's names, e.g. a model.npz) instead of fresh ones;
the sizes are read from them. Prints one JSON line: ms_per_step (median of --steps timed steps
after --warmup), T, real_tokens, the first step's loss, torch's version and threads.
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

PAD = 0
VAR_EPS, STD_TARGET = 1e-4, 1.0      # VICReg's variance floor and hinge target (losses.py)
DECAYED = (".w_qkv", ".w_o", ".w_in", ".w_out")


def fresh_params(V, T_max, D, L, mlp_ratio, generator):
    """GPT-2 initialisation, minialign's names (model.init_params)."""
    normal = lambda *shape, std=0.02: torch.randn(*shape, generator=generator) * std
    p = {"tok_emb": normal(V, D), "pos_emb": normal(T_max, D)}
    for i in range(L):
        b, resid = f"blocks.{i}.", 0.02 / (2 * L) ** 0.5
        p.update({b + "ln1.gamma": torch.ones(D), b + "ln1.beta": torch.zeros(D),
                  b + "attn.w_qkv": normal(D, 3 * D), b + "attn.b_qkv": torch.zeros(3 * D),
                  b + "attn.w_o": normal(D, D, std=resid), b + "attn.b_o": torch.zeros(D),
                  b + "ln2.gamma": torch.ones(D), b + "ln2.beta": torch.zeros(D),
                  b + "mlp.w_in": normal(D, mlp_ratio * D), b + "mlp.b_in": torch.zeros(mlp_ratio * D),
                  b + "mlp.w_out": normal(mlp_ratio * D, D, std=resid), b + "mlp.b_out": torch.zeros(D)})
    p["ln_f.gamma"], p["ln_f.beta"] = torch.ones(D), torch.zeros(D)
    return p


def encode(p, tokens, n_layers, n_heads, causal):
    """(2B, T) ids -> z (2B, D) mean-pooled caption embeddings, hf (2B, T, D) final states."""
    B, T = tokens.shape
    real = tokens != PAD                                                   # (B, T)
    h = p["tok_emb"][tokens] + p["pos_emb"][:T]                            # (B, T, D)
    D = h.shape[-1]
    allowed = real[:, None, None, :]                                       # keys: real tokens
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(n_layers):
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
    z = (hf * weights[..., None]).sum(1) / weights.sum(1, keepdim=True)    # (B, D)
    return z, hf


def variance(z):
    std = torch.sqrt(z.var(dim=0, unbiased=True) + VAR_EPS)
    return F.relu(STD_TARGET - std).mean()


def covariance(z):
    zc = z - z.mean(0)
    C = zc.T @ zc / (len(z) - 1)
    off = C - torch.diag(torch.diag(C))
    return (off * off).sum() / z.shape[1]


def loss_of(p, tokens, kind, n_layers, n_heads):
    """minialign's objectives.good_views (views) or next_token (ntp) loss on one batch."""
    B = len(tokens) // 2
    z, hf = encode(p, tokens, n_layers, n_heads, causal=(kind == "ntp"))
    za, zb = z[:B], z[B:]
    anti = 25.0 * (variance(za) + variance(zb)) / 2 + 1.0 * (covariance(za) + covariance(zb))
    if kind == "views":
        return 25.0 * ((za - zb) ** 2).mean() + anti
    has_target = (tokens[:, 1:] != PAD)                                    # (2B, T-1)
    logits = hf[:, :-1][has_target] @ p["tok_emb"].T                       # (n_t, V) tied head
    return F.cross_entropy(logits, tokens[:, 1:][has_target]) + anti


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=["views", "ntp"], required=True)
    ap.add_argument("--tokens", required=True, help="(2B, T) int .npy, PAD = 0")
    ap.add_argument("--V", type=int, default=5814, help="vocabulary size (without --params)")
    ap.add_argument("--params", default=None, help="start weights (.npz, minialign's names)")
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--head", default="valid", choices=["valid"], help="head on rows with a target")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tokens = torch.from_numpy(np.load(a.tokens).astype(np.int64))
    if a.params:
        with np.load(a.params) as f:
            p = {k: torch.from_numpy(np.array(f[k], dtype=np.float32)) for k in f.files}
    else:
        p = fresh_params(a.V, 64, 256, 4, 4, torch.Generator().manual_seed(0))
    n_layers = sum(1 for k in p if k.endswith(".ln1.gamma"))
    for t in p.values():
        t.requires_grad_(True)
    decay = [t for k, t in p.items() if k.endswith(DECAYED)]
    rest = [t for k, t in p.items() if not k.endswith(DECAYED)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": rest, "weight_decay": 0.0}], lr=a.lr, eps=1e-8)
    times, first_loss = [], None
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(p, tokens, a.kind, n_layers, a.n_heads)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
        if first_loss is None:
            first_loss = float(loss.detach())
    print(json.dumps({"kind": a.kind, "T": int(tokens.shape[1]),
                      "real_tokens": int((tokens != PAD).sum()),
                      "ms_per_step": 1000 * statistics.median(times), "first_loss": first_loss,
                      "threads": a.threads, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
