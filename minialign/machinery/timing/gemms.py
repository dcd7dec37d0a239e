"""Every matrix product of one training step, listed once. `bench` counts the step's FLOPs
from this list (step_flops) and times the same products on their own (replay_gemms): the
step's GEMM floor, from which the non-GEMM share of a step follows.

What the list holds, per block (L of them), n real tokens packed as rows, D = d_model,
F = mlp_ratio * D, H heads of Dh = D / H:
  linear layers   x (n, K) @ w (K, N) for q|k|v (K=D, N=3D), the output projection (D, D),
                  the MLP in (D, F) and out (F, D); backward dx = dy @ w^T (n, N) @ (N, K)
                  and dw = x^T @ dy (K, n) @ (n, N): three products of 2 n K N FLOPs each.
  attention       per length group g of Bg captions trimmed to Tg tokens (attention_grids:
                  fast_layers.packed_layout's groups, each of one length), Bg * H products each of
                  q k^T (Tg, Dh) @ (Dh, Tg) and probs v (Tg, Tg) @ (Tg, Dh); backward
                  dv = probs^T dy, dprobs = dy v^T, dq = dscores k, dk = dscores^T q.
                  Causal attention runs the same full Tg x Tg products (the hidden half is
                  -inf, not skipped), so it counts the same.
and once per step:
  tied head       next_token only, on its n_t target rows: hf (n_t, D) @ tok_emb^T (D, V);
                  backward dhf = dlogits tok_emb, dtok_emb = dlogits^T hf.
  VICReg          per view (two views of N = B2 / 2 captions): C = zc^T zc (D, N) @ (N, D)
                  and its gradient zc @ off (N, D) @ (D, D) (losses._covariance_term).
Not products, so not listed: embeddings (a gather, a scatter-add), LayerNorm, GELU, softmax,
the mean pool over each caption's rows (a segment mean, O(n D) work, even where it is written
as a product with a sparse (B2, n) matrix), cross-entropy, clipping, AdamW.
"""
import time
from typing import NamedTuple

import numpy as np

from .. import fastpath
if fastpath.PRESENT:    # a student copy has no fast path, and no bench (cli.check_copy)
    from ..fastpath.fast_layers import ATTENTION_GROUP, packed_layout
else:
    ATTENTION_GROUP = packed_layout = None


class Gemm(NamedTuple):
    """`count` x `batch` products (M, K) @ (K, N); a_t / b_t: that operand is read as the
    transpose of a stored array (x.T, w.T in the code), which BLAS takes without a copy."""
    name: str
    count: int
    batch: int
    M: int
    K: int
    N: int
    a_t: bool = False
    b_t: bool = False

    @property
    def flops(self):
        """2 M K N per product (a multiply-add counted as 2), times batch and count."""
        return 2 * self.count * self.batch * self.M * self.K * self.N


def attention_grids(lengths, group_size=ATTENTION_GROUP):
    """(Bg, Tg) of each attention grid the model runs: fast_layers.packed_layout's own groups
    (the captions of one length, split into near-equal groups of at most group_size; empty
    captions in none). lengths: (B,) int, real tokens per caption. Returns [(Bg, Tg), ...]."""
    lengths = np.asarray(lengths)
    mask = np.arange(max(1, int(lengths.max(initial=0))))[None, :] < lengths[:, None]  # (B, T)
    return [(g.Bg, g.Tg) for g in packed_layout(mask, False, np.float32, group_size).groups]


def linear_gemms(name, count, M, K, N):
    """y = x (M, K) @ w (K, N), and its backward dx = dy @ w^T, dw = x^T @ dy."""
    return [Gemm(name, count, 1, M, K, N),
            Gemm(f"{name} dx", count, 1, M, N, K, b_t=True),
            Gemm(f"{name} dw", count, 1, K, M, N, a_t=True)]


def step_gemms(lengths, cfg, n_targets=0, group_size=ATTENTION_GROUP):
    """The matrix products of one training step: forward, the losses', backward (a block's
    products once each, with count = L).
    lengths: (B2,) int, real tokens of each encoded caption (B2 even: two views of B2 / 2);
    cfg: ModelConfig; n_targets: n_t, next-token targets (0 for the view objectives);
    group_size: captions per attention grid. Returns a list of Gemm."""
    lengths = np.asarray(lengths)
    n, B2 = int(lengths.sum()), len(lengths)
    D, L, V, H = cfg.d_model, cfg.n_layers, cfg.vocab_size, cfg.n_heads
    F, Dh = cfg.mlp_ratio * D, D // H
    forward_attn, backward_attn = [], []
    for i, (Bg, Tg) in enumerate(attention_grids(lengths, group_size)):
        forward_attn += [Gemm(f"attn[{i}] q k^T", L, Bg * H, Tg, Dh, Tg, b_t=True),
                         Gemm(f"attn[{i}] probs v", L, Bg * H, Tg, Tg, Dh)]
        backward_attn += [Gemm(f"attn[{i}] dv", L, Bg * H, Tg, Tg, Dh, a_t=True),
                          Gemm(f"attn[{i}] dprobs", L, Bg * H, Tg, Dh, Tg, b_t=True),
                          Gemm(f"attn[{i}] dq", L, Bg * H, Tg, Tg, Dh),
                          Gemm(f"attn[{i}] dk", L, Bg * H, Tg, Tg, Dh, a_t=True)]
    qkv, out = linear_gemms("qkv", L, n, D, 3 * D), linear_gemms("attn.out", L, n, D, D)
    mlp_in, mlp_out = linear_gemms("mlp.in", L, n, D, F), linear_gemms("mlp.out", L, n, F, D)
    forward = [qkv[0], *forward_attn, out[0], mlp_in[0], mlp_out[0]]
    backward = [*mlp_out[1:], *mlp_in[1:], *out[1:], *backward_attn, *qkv[1:]]
    N = B2 // 2
    vicreg = [Gemm("vicreg C", 2, 1, D, N, D, a_t=True), Gemm("vicreg dz", 2, 1, N, D, D)]
    head = []
    if n_targets:
        head = [Gemm("head", 1, 1, n_targets, D, V, b_t=True),
                Gemm("head dhf", 1, 1, n_targets, V, D),
                Gemm("head dtok_emb", 1, 1, V, n_targets, D, a_t=True)]
    return forward + vicreg + head + backward


def step_flops(lengths, cfg, n_targets=0, group_size=ATTENTION_GROUP):
    """Matmul FLOPs of one training step: the sum of step_gemms(...)'s, a multiply-add counted
    as 2. With n = sum(lengths), F = mlp_ratio D, the (Bg, Tg) of attention_grids:
        step = 3 * [ L * (2 n (3 D^2 + D^2 + 2 D F) + sum_g 4 Bg Tg^2 D)   blocks
                     + 2 n_t D V ]                                         tied head
               + 2 * 2 * 2 * (B2 / 2) D^2                                  VICReg C, dz
    (every product's backward is two products of its size; VICReg's gradient is one).
    Returns an int."""
    return sum(g.flops for g in step_gemms(lengths, cfg, n_targets, group_size))


def gemm_calls(gemms, rng, dtype=np.float32):
    """The operands replay_gemms multiplies: one (a, b, out) per product run, each Gemm
    `count` times, in list order; a (M, K) or (batch, M, K), b (K, N) likewise, out (M, N),
    with a_t / b_t operands as transposed views. Random values (rng: numpy Generator),
    allocated once and shared between products whose stored operands have the same shape;
    outputs come from a separate pool, so no product writes into its own input."""
    inputs, outputs, calls = {}, {}, []

    def array(pool, shape):
        if shape not in pool:
            pool[shape] = rng.standard_normal(shape, dtype=dtype)
        return pool[shape]

    for g in gemms:
        a = array(inputs, (g.batch, g.K, g.M) if g.a_t else (g.batch, g.M, g.K))
        b = array(inputs, (g.batch, g.N, g.K) if g.b_t else (g.batch, g.K, g.N))
        a, b = (a.swapaxes(1, 2) if g.a_t else a), (b.swapaxes(1, 2) if g.b_t else b)
        if g.batch == 1:                                     # a 2-D product, as the code runs it
            a, b = a[0], b[0]
        out = array(outputs, (g.M, g.N) if g.batch == 1 else (g.batch, g.M, g.N))
        calls += [(a, b, out)] * g.count
    return calls


def replay_gemms(gemms, rng, repeats=5):
    """Time the listed products on their own (gemm_calls' operands, float32), with nothing
    between them: the step's GEMM floor at this process's BLAS threads.
    Returns the seconds of each of `repeats` timed passes over all of them, after one
    untimed pass (first touch of the outputs, BLAS start-up)."""
    calls = gemm_calls(gemms, rng)
    seconds = []
    for rep in range(repeats + 1):
        t0 = time.perf_counter()
        for a, b, out in calls:
            np.matmul(a, b, out=out)
        if rep:
            seconds.append(time.perf_counter() - t0)
    return seconds
