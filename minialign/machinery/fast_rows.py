"""The per-token layers the model runs, on packed rows (n, C) in blocks spread over the cores:
embeddings, residual add, linear, LayerNorm, GELU. Read layers.py first (each has its reference
there; tests/test_rows.py checks them against it, and bit for bit across thread counts);
fast_layers.py holds the rest of the fast path (row layout, attention, pooling, cross-entropy).

Each layer is its layers.py reference as a chain of passes over one ROW BLOCK of the packed
rows at a time (rows.ROW_BLOCK rows: the block stays in L2 from pass to pass), the blocks spread
over rows.run's threads. Sums over rows (bias, gain and weight gradients) are one partial per
block (or per rows.REDUCE_BLOCKS blocks), added in block order: the same bits for any number of
threads. Constants are cast to the array's dtype first (_const), so float32 arrays never meet a
float64 scalar (NumPy 2 would run the float64 loop and round back) and float64 gradient checks
keep their full-precision constants.
"""
import numpy as np

from ..layers import GELU_A, GELU_C, LN_EPS
from .rows import map_blocks, matmul_tn_rows, row_blocks, run, sum_partials


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
