"""The fast path the model runs: the maths of layers.py, arranged for speed (cs231n keeps
`fast_layers.py` beside `layers.py` the same way). Read layers.py first: each function here has
a reference there and tests/test_fast_layers.py checks that they give the same outputs and
gradients on ragged batches. What is rearranged, and why:

  packing       Per-token layers (embeddings, LayerNorm, linear, GELU) run on the n real tokens
                of a batch, stacked as rows of an (n, D) array in the order of
                tokens[tokens != PAD]: no work on padding.
  grouping      Attention needs a (B, T) grid. mha_forward_fast runs it on groups of captions of
                similar length, each scattered into its own (Bg, Tg) grid trimmed to its longest
                caption, so the T^2 work shrinks too. Reference: layers.mha_forward on (B, T, D).
  in-place      softmax_attention_forward and gelu_forward_fast write each pass into one buffer:
                their arrays are the largest in the model. The GELU chain measured 1.8x faster
                than layers.gelu_forward (forward + backward on (6873, 1024) float32).

tests/test_reference.py pins this module's float32 rounding: keep every pass, its order and its
float64 scalar constants (under NumPy 2, `a *= np.float64(c)` on a float32 buffer multiplies in
float64 and rounds once; a Python float would round c to float32 first). A rewrite that reads
better but rounds differently belongs in layers.py.
"""
from typing import NamedTuple

import numpy as np

from ..layers import (GELU_A, GELU_C, attention_bias, linear_backward, linear_forward, merge_heads,
                     split_heads)

ATTENTION_GROUP = 64  # captions per attention grid (sorted by length: little padding in each)
GELU_C64 = np.float64(GELU_C)  # float64 on purpose: the rounding described above


# ---------------------------------------------------------------- packing and grouping
class AttentionGroup(NamedTuple):
    """One attention grid: Bg captions of similar length, trimmed to the longest, Tg tokens."""
    rows: np.ndarray   # (n_g,) packed rows of the group's real tokens, in grid order
    cells: np.ndarray  # (n_g,) their flat positions b * Tg + t in the (Bg, Tg) grid
    Bg: int            # captions in the group
    Tg: int            # tokens in its longest caption (at least 1)
    bias: np.ndarray   # attention_bias of the grid: (Bg, 1, 1, Tg), or causal (Bg, 1, Tg, Tg)


def attention_groups(mask, causal, dtype, group_size=ATTENTION_GROUP):
    """Split a batch into attention grids of similar-length captions.
    mask: (B, T) bool, True at real tokens, padding only at the end of each row.
    Returns a list of AttentionGroup; every packed row is in exactly one group."""
    lengths = mask.sum(axis=1)                                            # (B,)
    row_of = np.cumsum(mask.ravel()).reshape(mask.shape) - 1              # (B, T) packed row
    order = np.argsort(lengths, kind="stable")                            # (B,) short to long
    groups = []
    for seqs in np.array_split(order, -(-len(order) // group_size)):      # ceil(B / group_size)
        Tg = max(1, int(lengths[seqs].max()))
        sub = mask[seqs, :Tg]                                             # (Bg, Tg)
        groups.append(AttentionGroup(rows=row_of[seqs, :Tg][sub], cells=np.flatnonzero(sub),
                                     Bg=len(seqs), Tg=Tg, bias=attention_bias(sub, causal, dtype)))
    return groups


def unpack(x, cells, B, T):
    """Packed rows x: (n, C) -> (B, T, C) grid, zeros at padding; cells: (n,) flat b * T + t."""
    grid = np.zeros((B * T, x.shape[1]), dtype=x.dtype)                   # (B*T, C)
    grid[cells] = x
    return grid.reshape(B, T, x.shape[1])                                 # (B, T, C)


def pack(grid, cells):
    """(B, T, C) grid -> its rows at the real positions, (n, C)."""
    return grid.reshape(-1, grid.shape[-1])[cells]                        # (n, C)


# ---------------------------------------------------------------- attention
def softmax_attention_forward(q, k, v, bias):
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1), batched over (B, H), as
    in-place passes over the (B, H, T, T) scores: y = softmax(q k^T / sqrt(Dh) + bias) v.
    q, k, v: (B, H, T, Dh); bias: broadcastable to (B, H, T, T), 0 or -inf.
    A query with every key hidden (an empty caption) gets all-zero weights and y = 0, never NaN.
    Returns y: (B, H, T, Dh) and a cache. Reference: the core of layers.mha_forward."""
    scale = 1.0 / np.sqrt(q.shape[-1])                                    # float64 scalar
    scores = q @ k.swapaxes(-1, -2)                                       # (B, H, T, T)
    scores *= scale
    scores += bias
    m = scores.max(axis=-1, keepdims=True)                                # (B, H, T, 1)
    m[np.isneginf(m)] = 0.0  # a row of only -inf: exp(-inf - 0) = 0 instead of nan
    scores -= m
    probs = np.exp(scores, out=scores)                                    # (B, H, T, T)
    total = probs.sum(axis=-1, keepdims=True)                             # (B, H, T, 1)
    total[total == 0.0] = 1.0  # the same fully hidden rows: 0 / 1 = 0
    probs /= total
    y = probs @ v                                                         # (B, H, T, Dh)
    return y, (q, k, v, probs, scale)


def softmax_attention_backward(dy, cache):
    """dy: (B, H, T, Dh) -> dq, dk, dv, each (B, H, T, Dh)."""
    q, k, v, probs, scale = cache
    dv = probs.swapaxes(-1, -2) @ dy                                      # (B, H, T, Dh)
    dprobs = dy @ v.swapaxes(-1, -2)                                      # (B, H, T, T)
    # softmax Jacobian: dscores = probs * (dprobs - sum_s probs dprobs); hidden keys have probs 0
    dscores = dprobs
    dscores -= (dprobs * probs).sum(axis=-1, keepdims=True)
    dscores *= probs
    dscores *= scale                                                      # forward: scores *= scale
    dq = dscores @ k                                                      # (B, H, T, Dh)
    dk = dscores.swapaxes(-1, -2) @ q                                     # (B, H, T, Dh)
    return dq, dk, dv


def mha_forward_fast(x, w_qkv, b_qkv, w_o, b_o, groups, n_heads):
    """layers.mha_forward on packed rows, one length-grouped attention grid at a time.
    x: (n, D) packed real tokens; w_qkv: (D, 3D); b_qkv: (3D,); w_o: (D, D); b_o: (D,);
    groups: attention_groups(...) of the batch. Returns y: (n, D) and a cache."""
    n, D = x.shape
    qkv, c_qkv = linear_forward(x, w_qkv, b_qkv)                          # (n, 3D)
    a = np.empty_like(x)                                                  # (n, D)
    c_att = []
    for g in groups:
        grid = unpack(qkv[g.rows], g.cells, g.Bg, g.Tg)                   # (Bg, Tg, 3D)
        q, k, v = (split_heads(t, n_heads) for t in np.split(grid, 3, axis=-1))  # (Bg, H, Tg, Dh)
        ag, c = softmax_attention_forward(q, k, v, g.bias)                # (Bg, H, Tg, Dh)
        a[g.rows] = pack(merge_heads(ag), g.cells)                        # (n_g, D)
        c_att.append(c)
    y, c_o = linear_forward(a, w_o, b_o)                                  # (n, D)
    return y, (c_qkv, c_att, c_o, groups, n_heads)


def mha_backward_fast(dy, cache):
    """dy: (n, D) -> dx (n, D), dw_qkv (D, 3D), db_qkv (3D,), dw_o (D, D), db_o (D,)."""
    c_qkv, c_att, c_o, groups, n_heads = cache
    n, D = dy.shape
    da, dw_o, db_o = linear_backward(dy, c_o)                             # (n, D)
    dqkv = np.empty((n, 3 * D), dtype=dy.dtype)                           # (n, 3D)
    for g, c in zip(groups, c_att):
        # forward: a[g.rows] = pack(merge_heads(ag), g.cells)
        dag = split_heads(unpack(da[g.rows], g.cells, g.Bg, g.Tg), n_heads)  # (Bg, H, Tg, Dh)
        dq, dk, dv = softmax_attention_backward(dag, c)                   # 3 x (Bg, H, Tg, Dh)
        # forward: q, k, v = split_heads of np.split(grid, 3)
        dgrid = np.concatenate([merge_heads(d) for d in (dq, dk, dv)], axis=-1)  # (Bg, Tg, 3D)
        dqkv[g.rows] = pack(dgrid, g.cells)                               # (n_g, 3D)
    dx, dw_qkv, db_qkv = linear_backward(dqkv, c_qkv)                     # (n, D)
    return dx, dw_qkv, db_qkv, dw_o, db_o


# ---------------------------------------------------------------- GELU, fused
def gelu_forward_fast(x):
    """layers.gelu_forward, y = x/2 (1 + tanh(c (x + a x^3))), as in-place passes over one
    buffer. x: any shape. Returns y and a cache."""
    u = x * x                                                             # (...) x^2
    u *= GELU_A * GELU_C64
    u += GELU_C64
    u *= x                                                                # c (x + a x^3)
    th = np.tanh(u, out=u)                                                # (...)
    y = th * x                                                            # (...)
    y += x
    y *= 0.5                                                              # x/2 (1 + th)
    return y, (x, th)


def gelu_backward_fast(dy, cache):
    """layers.gelu_backward: dx = dy * [ (1 + th)/2 + x/2 (1 - th^2) c (1 + 3 a x^2) ]."""
    x, th = cache
    dx = x * x                                                            # (...) x^2
    dx *= 3.0 * GELU_A * GELU_C64
    dx += GELU_C64                                                        # c (1 + 3 a x^2)
    dx *= x
    sech2 = th * th                                                       # (...)
    np.subtract(1.0, sech2, out=sech2)                                    # 1 - tanh^2
    dx *= sech2                                                           # x (1-th^2) c (1+3a x^2)
    dx += th
    dx += 1.0
    dx *= 0.5
    dx *= dy
    return dx
