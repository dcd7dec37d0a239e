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
  row blocks    The per-token layers (section "rows") run as chains of passes over blocks of
                64 packed rows that stay in L2, spread over the cores by rows.py's thread pool;
                their sums over rows are per-block partials added in block order, so the bits
                do not depend on the thread count (tests/test_rows.py).

Constants are scalars of the array's dtype: np.float32(c) on float32 arrays. Under NumPy 2,
`a *= np.float64(c)` on a float32 buffer runs the float64 loop and rounds back (~4x slower per
pass), so no float64 scalar touches a float32 array here (tests/test_rows.py fails a float32
step on any; the attention's `scores *= scale` is the one left, listed there as a known leak
until its rewrite). tests/test_reference.py pins this module's float32 rounding: a change to a pass,
its order or a block size changes the pinned numbers and must say so when it regenerates them.
"""
from typing import NamedTuple

import numpy as np

from ..layers import (GELU_A, GELU_C, LN_EPS, attention_bias, linear_backward, linear_forward,
                     merge_heads, split_heads)
from .rows import map_blocks, matmul_tn_rows, row_blocks, run, sum_partials

ATTENTION_GROUP = 64  # captions per attention grid (sorted by length: little padding in each)


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


# ---------------------------------------------------------------- rows: per-token layers
# Each layer below is its layers.py reference as a chain of passes over one ROW BLOCK of the
# packed (n, C) rows at a time (rows.ROW_BLOCK rows: the block stays in L2 from pass to pass),
# the blocks spread over rows.run's threads. Sums over rows (bias, gain and weight gradients)
# are one partial per block (or per rows.REDUCE_BLOCKS blocks), added in block order: the same
# bits for any number of threads. Constants are cast to the array's dtype first (_const), so
# float32 arrays never meet a float64 scalar (NumPy 2 would run the float64 loop and round
# back) and float64 gradient checks keep their full-precision constants.
def _const(value, like):
    """value as a scalar of like's dtype (np.float32(c) for float32 arrays)."""
    return like.dtype.type(value)


def embedding_forward_rows(tok_ids, pos_ids, tok_emb, pos_emb):
    """layers.embedding_forward twice, summed: h[i] = tok_emb[tok_ids[i]] + pos_emb[pos_ids[i]].
    tok_ids, pos_ids: (n,) int; tok_emb: (V, D); pos_emb: (T_max, D). Returns h (n, D), a cache."""
    n, D = len(tok_ids), tok_emb.shape[1]
    h = np.empty((n, D), dtype=tok_emb.dtype)                             # (n, D)

    def block(i, s, e):
        np.take(tok_emb, tok_ids[s:e], axis=0, out=h[s:e])
        h[s:e] += pos_emb[pos_ids[s:e]]

    map_blocks(block, n)
    return h, (tok_ids, pos_ids, tok_emb.shape, pos_emb.shape)


def embedding_backward_rows(dh, cache):
    """dh: (n, D) -> dtok_emb (V, D), dpos_emb (T_max, D): each row sums the dh of every row
    that read it, in row order (np.add.at, as layers.embedding_backward)."""
    tok_ids, pos_ids, tok_shape, pos_shape = cache
    dtok = np.zeros(tok_shape, dtype=dh.dtype)                            # (V, D)
    dpos = np.zeros(pos_shape, dtype=dh.dtype)                            # (T_max, D)
    # two scatters into different arrays: one per thread
    run(lambda i: np.add.at(*((dtok, tok_ids) if i == 0 else (dpos, pos_ids)), dh), 2)
    return dtok, dpos


def add_rows(x, y):
    """x + y on (n, C) rows, as a new array (the residual stream: h = h + a)."""
    out = np.empty_like(x)                                                # (n, C)
    map_blocks(lambda i, s, e: np.add(x[s:e], y[s:e], out=out[s:e]), len(x))
    return out


def linear_forward_rows(x, w, b):
    """layers.linear_forward on packed rows: y = x @ w + b, one BLAS call per row block.
    x: (n, D_in); w: (D_in, D_out); b: (D_out,). Returns y: (n, D_out) and a cache."""
    y = np.empty((len(x), w.shape[1]), dtype=x.dtype)                     # (n, D_out)

    def block(i, s, e):
        np.matmul(x[s:e], w, out=y[s:e])
        y[s:e] += b

    map_blocks(block, len(x))
    return y, (x, w)


def linear_backward_rows(dy, cache):
    """dy: (n, D_out) -> dx (n, D_in), dw (D_in, D_out), db (D_out,); dw and db summed over
    rows per fixed block, then in block order (rows.matmul_tn_rows)."""
    x, w = cache
    blocks = row_blocks(len(dy))
    dx = np.empty((len(dy), w.shape[0]), dtype=dy.dtype)                  # (n, D_in)
    db_parts = np.empty((max(len(blocks), 1), w.shape[1]), dtype=dy.dtype)  # (P, D_out)
    db_parts[0] = 0

    def block(i, s, e):
        np.matmul(dy[s:e], w.T, out=dx[s:e])
        np.sum(dy[s:e], axis=0, out=db_parts[i])

    map_blocks(block, len(dy))
    return dx, matmul_tn_rows(x, dy), sum_partials(db_parts)


def layernorm_forward_rows(x, gamma, beta, eps=LN_EPS):
    """layers.layernorm_forward on packed rows, fused per row block (mean, centre, variance,
    scale, gain and shift in one block's passes). x: (n, D); gamma, beta: (D,).
    Returns y: (n, D) and a cache (xhat (n, D), inv_std (n, 1), gamma)."""
    n, D = x.shape
    y, xhat = np.empty_like(x), np.empty_like(x)                          # (n, D), (n, D)
    inv_std = np.empty((n, 1), dtype=x.dtype)                             # (n, 1)
    inv_D, eps = _const(1.0 / D, x), _const(eps, x)

    def block(i, s, e):
        xb, xh, yb, st = x[s:e], xhat[s:e], y[s:e], inv_std[s:e]
        np.sum(xb, axis=1, keepdims=True, out=st)
        st *= inv_D                                                       # mu
        np.subtract(xb, st, out=xh)                                       # xc = x - mu
        np.multiply(xh, xh, out=yb)
        np.sum(yb, axis=1, keepdims=True, out=st)
        st *= inv_D
        st += eps
        np.sqrt(st, out=st)
        np.reciprocal(st, out=st)                                         # 1 / sqrt(var + eps)
        xh *= st                                                          # xhat
        np.multiply(xh, gamma, out=yb)
        yb += beta                                                        # xhat * gamma + beta

    map_blocks(block, n)
    return y, (xhat, inv_std, gamma)


def layernorm_backward_rows(dy, cache):
    """layers.layernorm_backward on packed rows, fused per row block.
    dy: (n, D) -> dx (n, D), dgamma (D,), dbeta (D,)."""
    xhat, inv_std, gamma = cache
    n, D = xhat.shape
    P = max(len(row_blocks(n)), 1)
    dx = np.empty_like(dy)                                                # (n, D)
    dgamma_parts, dbeta_parts = (np.zeros((P, D), dtype=dy.dtype) for _ in range(2))  # (P, D)
    inv_D = _const(1.0 / D, dy)

    def block(i, s, e):
        dyb, xh, g = dy[s:e], xhat[s:e], dx[s:e]
        m1, m2 = np.empty((e - s, 1), dy.dtype), np.empty((e - s, 1), dy.dtype)
        np.sum(dyb, axis=0, out=dbeta_parts[i])                           # forward: + beta
        np.multiply(dyb, xh, out=g)
        np.sum(g, axis=0, out=dgamma_parts[i])                            # forward: xhat * gamma
        np.multiply(dyb, gamma, out=g)                                    # g = d/dxhat
        np.sum(g, axis=1, keepdims=True, out=m1)
        m1 *= inv_D                                                       # mean(g)
        t = g * xh
        np.sum(t, axis=1, keepdims=True, out=m2)
        m2 *= inv_D                                                       # mean(g * xhat)
        np.multiply(xh, m2, out=t)
        g -= m1
        g -= t
        g *= inv_std[s:e]                                                 # dx

    map_blocks(block, n)
    return dx, sum_partials(dgamma_parts), sum_partials(dbeta_parts)


def gelu_forward_fast(x):
    """layers.gelu_forward as in-place passes per row block: y = x/2 (1 + tanh(c (x + a x^3))).
    x: (n, F). Returns y: (n, F) and a cache (x, th)."""
    th, y = np.empty_like(x), np.empty_like(x)                            # (n, F), (n, F)
    ac, c, half = _const(GELU_A * GELU_C, x), _const(GELU_C, x), _const(0.5, x)

    def block(i, s, e):
        xb, u, yb = x[s:e], th[s:e], y[s:e]
        np.multiply(xb, xb, out=u)                                        # x^2
        u *= ac
        u += c
        u *= xb                                                           # c (x + a x^3)
        np.tanh(u, out=u)                                                 # th
        np.multiply(u, xb, out=yb)
        yb += xb
        yb *= half                                                        # x/2 (1 + th)

    map_blocks(block, len(x))
    return y, (x, th)


def gelu_backward_fast(dy, cache):
    """layers.gelu_backward per row block: dx = dy [(1 + th)/2 + x/2 (1 - th^2) c (1 + 3 a x^2)]."""
    x, th = cache
    dx = np.empty_like(dy)                                                # (n, F)
    ac3, c, half, one = (_const(v, dy) for v in (3.0 * GELU_A * GELU_C, GELU_C, 0.5, 1.0))

    def block(i, s, e):
        xb, tb, d = x[s:e], th[s:e], dx[s:e]
        sech2 = tb * tb
        np.subtract(one, sech2, out=sech2)                                # 1 - th^2
        np.multiply(xb, xb, out=d)
        d *= ac3
        d += c                                                            # c (1 + 3 a x^2)
        d *= xb
        d *= sech2                                                        # x (1-th^2) c (1+3a x^2)
        d += tb
        d += one
        d *= half
        d *= dy[s:e]

    map_blocks(block, len(x))
    return dx
