"""The fast set's per-token layers (machinery/fastpath/fast.py), on packed rows (n, C) in blocks
spread over the cores: embeddings, linear, LayerNorm, GELU. Read layers.py first (each has its reference
there; tests/test_rows.py checks them against it, and bit for bit across thread counts);
fast_layers.py holds the rest of the fast path (row layout, attention, pooling, cross-entropy).

Each layer is its layers.py reference as a chain of passes over one ROW BLOCK of the packed
rows at a time (rows.block_rows(C) rows, 512 KB: the block stays in L2 from pass to pass; a
linear layer's GEMMs take the blocks of rows.gemm_blocks), the blocks spread over rows.run's
threads. Sums over rows (bias, gain and weight gradients) are one partial per block, added in
block order: the same bits for any number of threads. Constants are cast to the array's dtype first (_const), so float32 arrays never meet a
float64 scalar (NumPy 2 would run the float64 loop and round back) and float64 gradient checks
keep their full-precision constants.

Two rewrites of the reference's arithmetic, each faster (docs/performance.md has the figures):
sums along a row or down a block's columns are GEMVs with a ones vector (BLAS beats np.sum
over a short axis), and GELU's tanh is a logistic sigmoid of 2u (one np.exp is cheaper than
np.tanh). Both round differently from layers.py, within a few float32 ulps (tested).
"""
import numpy as np

from ...layers import GELU_A, GELU_C, LN_EPS
from .rows import (block_rows, gemm_blocks, map_blocks, map_partition, matmul_tn_rows, row_blocks,
                   sum_partials)

SCATTER_ROUNDS = 8   # scatter_add_rows: ids read more often than this are summed one by one


def _const(value, like):
    """value as a scalar of like's dtype (np.float32(c) for float32 arrays)."""
    return like.dtype.type(value)


def embedding_forward_rows(ids, weight):
    """layers.embedding_forward in row blocks: y[i] = weight[ids[i]].
    ids: (n,) int; weight: (V, D). Returns y (n, D) and a cache."""
    n, D = len(ids), weight.shape[1]
    y = np.empty((n, D), dtype=weight.dtype)                              # (n, D)
    map_blocks(lambda i, s, e: np.take(weight, ids[s:e], axis=0, out=y[s:e]), n, block_rows(D))
    return y, (ids, weight.shape)


def embedding_backward_rows(dy, cache):
    """dy: (n, D) -> dweight (V, D): each row sums the dy of every row that read it, in row
    order: the bits of np.add.at (layers.embedding_backward), tested."""
    ids, shape = cache
    return scatter_add_rows(dy, ids, shape)


def scatter_add_rows(dy, ids, shape):
    """dweight (shape = (V, D)) with dweight[v] = 0 + the dy[i] of every i with ids[i] = v,
    added in increasing i: np.add.at(zeros, ids, dy)'s sums (tested bit for bit), as a
    segment sum over the rows sorted by id, instead of np.add.at's one small add per row
    (much slower). An id read at most SCATTER_ROUNDS times: round j adds the j-th row of
    every such id still open (ids sorted by count, most first, so they are a prefix), one
    gathered (m_j, D) add per round; an id read more often (BOS, EOS, "a", positions): one
    np.sum over its gathered rows (axis 0: row after row, for D > 1)."""
    n = len(ids)
    dweight = np.zeros(shape, dtype=dy.dtype)                             # (V, D)
    if n == 0:
        return dweight
    order = np.argsort(ids, kind="stable")                                # (n,) by id, then row
    sorted_ids = ids[order]                                               # (n,)
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])  # (u,) segments
    counts = np.diff(np.r_[starts, n])                                    # (u,) rows per id
    by_count = np.argsort(-counts, kind="stable")                         # (u,) most rows first
    starts, counts = starts[by_count], counts[by_count]
    heavy = int(np.sum(counts > SCATTER_ROUNDS))                          # ids summed one by one
    zero = dy.dtype.type(0)
    for start, count in zip(starts[:heavy], counts[:heavy]):
        # + 0 as np.add.at's zeros: 0 + (-0) = +0
        dweight[sorted_ids[start]] = np.sum(dy[order[start:start + count]], axis=0) + zero
    starts, counts = starts[heavy:], counts[heavy:]
    if len(starts):
        active = np.searchsorted(-counts, -np.arange(counts[0]))          # (rounds,) ids in round j
        acc = np.zeros((len(starts), shape[1]), dtype=dy.dtype)           # (u, D) 0 + ..., as add.at
        for j, m in enumerate(active):
            acc[:m] += dy[order[starts[:m] + j]]                          # j-th row of each id
        dweight[sorted_ids[starts]] = acc
    return dweight


def linear_forward_rows(x, w, b):
    """layers.linear_forward on packed rows: y = x @ w + b, one BLAS call per row block.
    x: (n, D_in); w: (D_in, D_out); b: (D_out,). Returns y: (n, D_out) and a cache."""
    y = np.empty((len(x), w.shape[1]), dtype=x.dtype)                     # (n, D_out)

    def block(i, s, e):
        np.matmul(x[s:e], w, out=y[s:e])
        y[s:e] += b

    map_partition(block, gemm_blocks(len(x)))
    return y, (x, w)


def linear_backward_rows(dy, cache):
    """dy: (n, D_out) -> dx (n, D_in), dw (D_in, D_out), db (D_out,); dw and db summed over
    rows per fixed block, then in block order (rows.matmul_tn_rows)."""
    x, w = cache
    blocks = gemm_blocks(len(dy))
    dx = np.empty((len(dy), w.shape[0]), dtype=dy.dtype)                  # (n, D_in)
    db_parts = np.empty((max(len(blocks), 1), w.shape[1]), dtype=dy.dtype)  # (P, D_out)
    db_parts[0] = 0

    ones = np.ones(max((e - s for s, e in blocks), default=0), dtype=dy.dtype)  # (rows,)

    def block(i, s, e):
        np.matmul(dy[s:e], w.T, out=dx[s:e])
        np.matmul(ones[:e - s], dy[s:e], out=db_parts[i])                 # column sums, a GEMV

    map_partition(block, blocks)
    return dx, matmul_tn_rows(x, dy), sum_partials(db_parts)


def layernorm_forward_rows(x, gamma, beta, eps=LN_EPS):
    """layers.layernorm_forward on packed rows, fused per row block (mean, centre, variance,
    scale, gain and shift in one block's passes; row sums as GEMVs with a ones vector, ~3x
    faster than np.sum over a short last axis). x: (n, D); gamma, beta: (D,).
    Returns y: (n, D) and a cache (xhat (n, D), inv_std (n, 1), gamma)."""
    n, D = x.shape
    y, xhat = np.empty_like(x), np.empty_like(x)                          # (n, D), (n, D)
    inv_std = np.empty((n, 1), dtype=x.dtype)                             # (n, 1)
    inv_D, eps = _const(1.0 / D, x), _const(eps, x)
    ones = np.ones(D, dtype=x.dtype)                                      # (D,)

    def block(i, s, e):
        xb, xh, yb, st = x[s:e], xhat[s:e], y[s:e], inv_std[s:e]
        np.matmul(xb, ones, out=st[:, 0])                                 # row sums
        st *= inv_D                                                       # mu
        np.subtract(xb, st, out=xh)                                       # xc = x - mu
        np.multiply(xh, xh, out=yb)
        np.matmul(yb, ones, out=st[:, 0])
        st *= inv_D
        st += eps
        np.sqrt(st, out=st)
        np.reciprocal(st, out=st)                                         # 1 / sqrt(var + eps)
        xh *= st                                                          # xhat
        np.multiply(xh, gamma, out=yb)
        yb += beta                                                        # xhat * gamma + beta

    map_blocks(block, n, block_rows(D))
    return y, (xhat, inv_std, gamma)


def layernorm_backward_rows(dy, cache):
    """layers.layernorm_backward on packed rows, fused per row block; sums over rows and over
    columns as GEMVs with ones vectors. dy: (n, D) -> dx (n, D), dgamma (D,), dbeta (D,)."""
    xhat, inv_std, gamma = cache
    n, D = xhat.shape
    rows_per = block_rows(D)
    P = max(len(row_blocks(n, rows_per)), 1)
    dx = np.empty_like(dy)                                                # (n, D)
    dgamma_parts, dbeta_parts = (np.zeros((P, D), dtype=dy.dtype) for _ in range(2))  # (P, D)
    inv_D = _const(1.0 / D, dy)
    ones_D, ones_rows = np.ones(D, dtype=dy.dtype), np.ones(rows_per, dtype=dy.dtype)

    def block(i, s, e):
        dyb, xh, g, ones = dy[s:e], xhat[s:e], dx[s:e], ones_rows[:e - s]
        m1, m2 = np.empty(e - s, dy.dtype), np.empty(e - s, dy.dtype)    # (r,), (r,)
        t = dyb * xh                                                      # (r, D)
        np.matmul(ones, dyb, out=dbeta_parts[i])                          # forward: + beta
        np.matmul(ones, t, out=dgamma_parts[i])                           # forward: xhat * gamma
        np.multiply(dyb, gamma, out=g)                                    # g = d/dxhat
        np.matmul(g, ones_D, out=m1)
        m1 *= inv_D                                                       # mean(g)
        np.multiply(g, xh, out=t)
        np.matmul(t, ones_D, out=m2)
        m2 *= inv_D                                                       # mean(g * xhat)
        np.multiply(xh, m2[:, None], out=t)
        g -= m1[:, None]
        g -= t
        g *= inv_std[s:e]                                                 # dx

    map_blocks(block, n, rows_per)
    return dx, sum_partials(dgamma_parts), sum_partials(dbeta_parts)


def gelu_forward_fast(x):
    """layers.gelu_forward as in-place passes per row block, with its tanh written as a
    logistic sigmoid, (1 + tanh(u)) / 2 = 1 / (1 + exp(-2u)) (the same function; np.exp costs
    ~60% of np.tanh on float32): y = x s, s = 1 / (1 + exp(-2 c (x + a x^3))).
    x: (n, F). Returns y: (n, F) and a cache (x, s)."""
    s_all, y = np.empty_like(x), np.empty_like(x)                         # (n, F), (n, F)
    ac2, c2, one = _const(-2.0 * GELU_A * GELU_C, x), _const(-2.0 * GELU_C, x), _const(1.0, x)

    def block(i, s, e):
        xb, u, yb = x[s:e], s_all[s:e], y[s:e]
        np.multiply(xb, xb, out=u)                                        # x^2
        u *= ac2
        u += c2
        u *= xb                                                           # -2u = -2c (x + a x^3)
        with np.errstate(over="ignore"):                                  # exp -> inf: s = 0
            np.exp(u, out=u)
        u += one
        np.reciprocal(u, out=u)                                           # s = (1 + th) / 2
        np.multiply(xb, u, out=yb)                                        # x/2 (1 + th)

    map_blocks(block, len(x), block_rows(x.shape[1]))
    return y, (x, s_all)


def gelu_backward_fast(dy, cache):
    """layers.gelu_backward per row block, in the forward's s = (1 + th) / 2, so (1 - th^2) / 2
    = 2 s (1 - s): dx = dy [s + 2 x s (1 - s) c (1 + 3 a x^2)]."""
    x, s_all = cache
    dx = np.empty_like(dy)                                                # (n, F)
    ac6, c2, one = (_const(v, dy) for v in (6.0 * GELU_A * GELU_C, 2.0 * GELU_C, 1.0))

    def block(i, s, e):
        xb, sb, d = x[s:e], s_all[s:e], dx[s:e]
        t = one - sb                                                      # (r, F) 1 - s
        t *= sb                                                           # s (1 - s)
        np.multiply(xb, xb, out=d)
        d *= ac6
        d += c2                                                           # 2 c (1 + 3 a x^2)
        d *= xb
        d *= t                                                            # 2 x s (1-s) c (1+3a x^2)
        d += sb
        d *= dy[s:e]

    map_blocks(block, len(x), block_rows(x.shape[1]))
    return dx
