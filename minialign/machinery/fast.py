"""The fast layer set: layers.py's names and signatures over packed rows, arranged for speed.
ModelConfig.layers = "fast" picks it; tests/test_fast.py checks its outputs and gradients against
layers.py's on ragged batches (float64 ~1e-10, float32 ~1e-4). layers.py is the maths; here:

  packed rows   token_rows sorts the captions by length: a caption, and a group of captions of
                one length, is a contiguous slice of the (n, D) rows.
  attention     per group of length Tg, on (Bg, Tg, ...) views of its rows: nothing computed on
                padding, no (B, T, T) grid. Pooling: a sum over each group's (Bg, Tg, D) rows.
  fused passes  LayerNorm, GELU and the softmaxes in place over one buffer per row block (it
                stays in cache); sums along a row or a column are products with a ones vector.
  the head      lm_head_forward -> cross_entropy -> lm_head_backward: one pass over row blocks
                that never holds all (n, V) logits.
  threads       set_threads(k) spreads the blocks over k threads; every partition depends on the
                shapes only and sums over blocks are added in block order: the same bits for any k.
Every constant is a scalar of the array's dtype: float32 stays float32.
"""
import math
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Optional

import numpy as np

from ..layers import GELU_A, GELU_C, LN_EPS

GROUP = 64         # at most this many captions in one attention group
BLOCK = 1 << 17    # elements per block of an in-place chain: row_blocks(n, BLOCK // C)
SPLITS = 4         # a linear layer's rows in this many chunks (x^T dy: one partial each)
HEAD_ROWS = 512    # rows of logits at a time in the fused head
CE_ROWS = 32       # rows per in-place cross-entropy pass (32 x V float32 stays in cache)
_pool = None       # set_threads(k > 1)'s threads


def set_threads(k):
    """Run the blocks on k >= 1 threads from now on (1: on the calling thread). numpy's BLAS
    should then run one thread each (OPENBLAS_NUM_THREADS=1), or the threads fight for cores."""
    global _pool
    if _pool is not None:
        _pool.shutdown()
    _pool = ThreadPoolExecutor(k) if k > 1 else None


def run(task, blocks):
    """task(i, start, stop) for each blocks[i] = (start, stop), on set_threads's threads, with
    the caller's np.errstate. Each task writes only its own outputs; re-raises a task's error."""
    err = np.geterr()

    def one(i):
        with np.errstate(**err):
            task(i, *blocks[i])
    list((_pool.map if _pool and len(blocks) > 1 else map)(one, range(len(blocks))))


def row_blocks(n, rows, start=0):
    """[(start, stop), ...]: the rows start:n in blocks of `rows`, the last one shorter."""
    return [(s, min(s + rows, n)) for s in range(start, n, rows)]


def chunks(n):
    """SPLITS near-equal row blocks of n rows (fewer if n is small)."""
    return row_blocks(n, max(1, -(-n // SPLITS)))


def _c(value, like):
    return like.dtype.type(value)                                         # a scalar of like's dtype


# ---------------------------------------------------------------- the rows of a batch
class Group(NamedTuple):
    """Bg captions of Tg tokens, the rows start:stop; first: its first caption in Rows.order."""
    start: int
    stop: int
    first: int
    Bg: int
    Tg: int
    bias: Optional[np.ndarray]   # causal: (Tg, Tg), 0 on and below the diagonal, -inf above


class Rows(NamedTuple):
    """layers.TokenRows's flat, pos, seq and caption_rows (the same meaning) in the fast order:
    captions shortest first (ties in batch order), each caption's tokens in order."""
    flat: np.ndarray          # (n,) b * T + t of each row's token
    pos: np.ndarray           # (n,) its position t
    seq: np.ndarray           # (n,) its caption b
    caption_rows: np.ndarray  # (n,) the row of each token of tokens[tokens != PAD], in order
    order: np.ndarray         # (B,) the captions in row order
    lengths: np.ndarray       # (B,) real tokens of order[i], ascending
    groups: tuple             # Group, ...: every row in exactly one; no empty caption in any


def token_rows(mask, causal, dtype):
    """layers.token_rows in the fast order, with the attention groups: the captions of one
    length in near-equal groups of at most GROUP. Returns a Rows."""
    B, T = mask.shape
    lengths = mask.sum(axis=1)                                            # (B,)
    order = np.argsort(lengths, kind="stable")                            # (B,) short to long
    i, pos = np.divmod(np.flatnonzero(mask[order]), T)                    # (n,), (n,)
    seq = order[i]                                                        # (n,)
    flat = seq * T + pos                                                  # (n,)
    lengths = lengths[order]                                              # (B,) ascending
    first_row = np.concatenate([[0], np.cumsum(lengths)])                 # (B + 1,)
    groups = []
    for Tg in map(int, np.unique(lengths[lengths > 0])):
        a, b = np.searchsorted(lengths, [Tg, Tg + 1])                     # captions of length Tg
        bias = np.triu(np.full((Tg, Tg), -np.inf, dtype), 1) if causal else None
        for caps in np.array_split(np.arange(a, b), -(-(b - a) // GROUP)):
            start = int(first_row[caps[0]])
            groups.append(Group(start, start + len(caps) * Tg, int(caps[0]), len(caps), Tg, bias))
    return Rows(flat, pos, seq, np.argsort(flat, kind="stable"), order, lengths, tuple(groups))


# ---------------------------------------------------------------- per-token layers
def embedding_forward(ids, weight):
    """layers.embedding_forward: y = weight[ids]. ids: (n,) int; weight: (V, D)."""
    return weight[ids], (ids, weight.shape)


def embedding_backward(dy, cache):
    """layers.embedding_backward as a segment sum (np.add.reduceat) over rows sorted by id."""
    ids, shape = cache
    dweight = np.zeros(shape, dtype=dy.dtype)                             # (V, D)
    order = np.argsort(ids, kind="stable")                                # (n,) by id
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])  # (u,) first of each
    dweight[sorted_ids[starts]] = np.add.reduceat(dy[order], starts, axis=0)
    return dweight


def linear_forward(x, w, b):
    """layers.linear_forward on (n, D_in) rows: a GEMM per chunk of rows, the bias in place."""
    y = np.empty((len(x), w.shape[1]), dtype=x.dtype)                     # (n, D_out)

    def block(i, s, e):
        np.matmul(x[s:e], w, out=y[s:e])
        y[s:e] += b
    run(block, chunks(len(x)))
    return y, (x, w)


def linear_backward(dy, cache):
    """layers.linear_backward per chunk of rows: dx, and partials of dw = x^T dy and db = 1^T dy
    added in chunk order."""
    x, w = cache
    blocks = chunks(len(dy))
    dx = np.empty((len(dy), w.shape[0]), dtype=dy.dtype)                  # (n, D_in)
    parts = np.zeros((len(blocks), w.shape[0] + 1, w.shape[1]), dy.dtype)  # dw | db, per chunk
    ones = np.ones(len(dy), dy.dtype)

    def block(i, s, e):
        np.matmul(dy[s:e], w.T, out=dx[s:e])
        np.matmul(x[s:e].T, dy[s:e], out=parts[i, :-1])
        np.matmul(ones[:e - s], dy[s:e], out=parts[i, -1])
    run(block, blocks)
    total = parts.sum(axis=0)                                             # (D_in + 1, D_out)
    return dx, total[:-1], total[-1]


def layernorm_forward(x, gamma, beta, eps=LN_EPS):
    """layers.layernorm_forward as one chain of in-place passes per row block. x: (n, D)."""
    n, D = x.shape
    y, xhat = np.empty_like(x), np.empty_like(x)                          # (n, D), (n, D)
    inv_std = np.empty((n, 1), dtype=x.dtype)                             # (n, 1)
    inv_D, eps, ones = _c(1.0 / D, x), _c(eps, x), np.ones(D, x.dtype)

    def block(i, s, e):
        xb, xh, yb, st = x[s:e], xhat[s:e], y[s:e], inv_std[s:e]
        np.matmul(xb, ones, out=st[:, 0])
        st *= inv_D                                                       # mu
        np.subtract(xb, st, out=xh)                                       # xc
        np.multiply(xh, xh, out=yb)
        np.matmul(yb, ones, out=st[:, 0])
        st *= inv_D
        st += eps
        np.sqrt(st, out=st)
        np.reciprocal(st, out=st)                                         # 1 / sqrt(var + eps)
        xh *= st                                                          # xhat
        np.multiply(xh, gamma, out=yb)
        yb += beta
    run(block, row_blocks(n, BLOCK // D))
    return y, (xhat, inv_std, gamma)


def layernorm_backward(dy, cache):
    """layers.layernorm_backward as one chain per row block; dgamma, dbeta: a partial a block."""
    xhat, inv_std, gamma = cache
    n, D = xhat.shape
    blocks = row_blocks(n, BLOCK // D)
    dx, t = np.empty_like(dy), np.empty_like(dy)                          # (n, D), (n, D)
    m1, m2 = np.empty(n, dy.dtype), np.empty(n, dy.dtype)                 # (n,), (n,)
    dgamma, dbeta = np.zeros((2, len(blocks), D), dy.dtype)               # (P, D) partials
    inv_D, ones_D, ones_r = _c(1.0 / D, dy), np.ones(D, dy.dtype), np.ones(n, dy.dtype)

    def block(i, s, e):
        g, tb, xh, a, c = dx[s:e], t[s:e], xhat[s:e], m1[s:e], m2[s:e]
        np.multiply(dy[s:e], xh, out=tb)
        np.matmul(ones_r[:e - s], tb, out=dgamma[i])                      # forward: xhat gamma
        np.matmul(ones_r[:e - s], dy[s:e], out=dbeta[i])                  # forward: + beta
        np.multiply(dy[s:e], gamma, out=g)                                # g = d/dxhat
        np.matmul(g, ones_D, out=a)
        a *= inv_D                                                        # mean(g)
        np.multiply(g, xh, out=tb)
        np.matmul(tb, ones_D, out=c)
        c *= inv_D                                                        # mean(g xhat)
        np.multiply(xh, c[:, None], out=tb)
        g -= a[:, None]
        g -= tb
        g *= inv_std[s:e]
    run(block, blocks)
    return dx, dgamma.sum(axis=0), dbeta.sum(axis=0)


def gelu_forward(x):
    """layers.gelu_forward with (1 + tanh(u)) / 2 as the logistic 1 / (1 + exp(-2u)) (one exp
    costs less than a tanh), in place per row block: y = x s, s = 1 / (1 + exp(-2c (x + a x^3)))."""
    s_all, y = np.empty_like(x), np.empty_like(x)                         # (n, F), (n, F)
    ac2, c2, one = _c(-2.0 * GELU_A * GELU_C, x), _c(-2.0 * GELU_C, x), _c(1.0, x)

    def block(i, s, e):
        xb, u = x[s:e], s_all[s:e]
        np.multiply(xb, xb, out=u)
        u *= ac2
        u += c2
        u *= xb                                                           # -2u
        with np.errstate(over="ignore"):                                  # exp -> inf: s = 0
            np.exp(u, out=u)
        u += one
        np.reciprocal(u, out=u)                                           # s
        np.multiply(xb, u, out=y[s:e])
    run(block, row_blocks(len(x), BLOCK // x.shape[1]))
    return y, (x, s_all)


def gelu_backward(dy, cache):
    """layers.gelu_backward in the forward's s, with (1 - th^2) / 2 = 2 s (1 - s):
    dx = dy [s + 2 x s (1 - s) c (1 + 3 a x^2)], in place per row block."""
    x, s_all = cache
    dx = np.empty_like(dy)                                                # (n, F)
    ac6, c2, one = _c(6.0 * GELU_A * GELU_C, dy), _c(2.0 * GELU_C, dy), _c(1.0, dy)

    def block(i, s, e):
        xb, sb, d = x[s:e], s_all[s:e], dx[s:e]
        t = one - sb
        t *= sb                                                           # s (1 - s)
        np.multiply(xb, xb, out=d)
        d *= ac6
        d += c2
        d *= xb
        d *= t
        d += sb
        d *= dy[s:e]
    run(block, row_blocks(len(x), BLOCK // x.shape[1]))
    return dx


# ---------------------------------------------------------------- attention, per group
def group_heads(rows, Bg, n_heads):
    """A group's rows (Bg * Tg, C) -> (Bg, n_heads, Tg, C / n_heads) as layers.split_heads:
    a view, so writing it writes the rows."""
    return rows.reshape(Bg, -1, n_heads, rows.shape[1] // n_heads).transpose(0, 2, 1, 3)


def attention_forward(x, w_qkv, b_qkv, w_o, b_o, rows, n_heads):
    """layers.attention_forward one group of equal-length captions at a time: q, k, v are views
    of the group's rows of x w_qkv + b_qkv, the softmax runs in place in one (Bg, H, Tg, Tg)
    buffer, the merged heads go straight into the rows of a. x: (n, D) rows of token_rows."""
    n, D = x.shape
    H = n_heads
    qkv, c_qkv = linear_forward(x, w_qkv, b_qkv)                          # (n, 3D)
    a = np.empty((n, D), dtype=x.dtype)                                   # (n, D)
    scale = _c(1.0 / math.sqrt(D // H), x)
    probs = [np.empty((g.Bg, H, g.Tg, g.Tg), x.dtype) for g in rows.groups]

    def group(i, s, e):
        g, p = rows.groups[i], probs[i]                                   # p: (Bg, H, Tg, Tg)
        heads = group_heads(qkv[s:e], g.Bg, 3 * H)                        # (Bg, 3H, Tg, Dh)
        q, k, v = heads[:, :H], heads[:, H:2 * H], heads[:, 2 * H:]
        np.matmul(q, k.swapaxes(-1, -2), out=p)
        p *= scale
        if g.bias is not None:
            p += g.bias
        p -= p.max(axis=-1, keepdims=True)                                # no overflow
        np.exp(p, out=p)
        p /= np.einsum("...ts->...t", p)[..., None]                       # softmax over keys s
        np.matmul(p, v, out=group_heads(a[s:e], g.Bg, H))
    run(group, [(g.start, g.stop) for g in rows.groups])
    y, c_o = linear_forward(a, w_o, b_o)                                  # (n, D)
    return y, (c_qkv, qkv, probs, scale, c_o, rows.groups, H)


def attention_backward(dy, cache):
    """dy: (n, D) -> dx (n, D), dw_qkv (D, 3D), db_qkv (3D,), dw_o (D, D), db_o (D,)."""
    c_qkv, qkv, probs, scale, c_o, groups, H = cache
    da, dw_o, db_o = linear_backward(dy, c_o)                             # (n, D)
    dqkv = np.empty_like(qkv)                                             # (n, 3D)

    def group(i, s, e):
        g, p = groups[i], probs[i]
        q, k, v = np.split(group_heads(qkv[s:e], g.Bg, 3 * H), 3, axis=1)  # (Bg, H, Tg, Dh)
        dq, dk, dv = np.split(group_heads(dqkv[s:e], g.Bg, 3 * H), 3, axis=1)  # views, written
        dag = group_heads(da[s:e], g.Bg, H)                               # (Bg, H, Tg, Dh)
        np.matmul(p.swapaxes(-1, -2), dag, out=dv)
        ds = dag @ v.swapaxes(-1, -2)                                     # (Bg, H, Tg, Tg) dprobs
        ds -= np.einsum("...ts,...ts->...t", ds, p)[..., None]
        ds *= p                                                           # dscores
        ds *= scale
        np.matmul(ds, k, out=dq)
        np.matmul(ds.swapaxes(-1, -2), q, out=dk)
    run(group, [(g.start, g.stop) for g in groups])
    dx, dw_qkv, db_qkv = linear_backward(dqkv, c_qkv)                     # (n, D)
    return dx, dw_qkv, db_qkv, dw_o, db_o


# ---------------------------------------------------------------- pooling, a segment mean
def pool_forward(h, rows):
    """layers.pool_forward as each group's (Bg, Tg, D) rows summed over Tg, / Tg.
    h: (n, D) rows. Returns z (B, D) in batch order (0 for an empty caption) and a cache."""
    z = np.zeros((len(rows.order), h.shape[1]), dtype=h.dtype)            # (B, D) row order
    for g in rows.groups:
        zg = z[g.first:g.first + g.Bg]
        np.sum(h[g.start:g.stop].reshape(g.Bg, g.Tg, -1), axis=1, out=zg)
        zg /= _c(g.Tg, h)
    return z[np.argsort(rows.order)], rows                                # (B, D) batch order


def pool_backward(dz, cache):
    """dz: (B, D) -> dh (n, D): each row gets its caption's dz / its length."""
    rows = cache
    full = rows.lengths > 0
    n_b = rows.lengths[full]                                              # (B_full,)
    return np.repeat(dz[rows.order[full]] / n_b.astype(dz.dtype)[:, None], n_b, axis=0)


# ---------------------------------------------------------------- the tied head, fused with CE
def lm_head_forward(hf, tok_emb):
    """layers.lm_head_forward, deferred: the logits hf @ tok_emb^T as the pair (hf, tok_emb),
    computed by cross_entropy. hf: (n, D); tok_emb: (V, D)."""
    return (hf, tok_emb), None


def cross_entropy(logits, targets):
    """losses.cross_entropy fused with the tied head, on (hf, tok_emb): per HEAD_ROWS rows,
    logits = hf_b tok_emb^T, in place -> (softmax - onehot) / n (CE_ROWS rows at a time),
    dhf_b = dlogits_b tok_emb, dtok_emb += dlogits_b^T hf_b (a partial per chunk, summed in
    order); -log softmax at the target in float64. Returns loss, (dhf, dtok_emb), stats."""
    hf, tok_emb = logits
    n = len(hf)
    if n == 0:
        raise ValueError("cross_entropy over zero targets")
    blocks = chunks(n)
    nll = np.empty(n)                                                     # (n,) float64
    dhf = np.empty_like(hf)                                               # (n, D)
    partials = np.zeros((len(blocks), *tok_emb.shape), hf.dtype)          # (SPLITS, V, D)
    ones, inv_n = np.ones(len(tok_emb), hf.dtype), _c(1.0 / n, hf)        # (V,), 1/n

    def chunk(c, start, stop):
        for s, e in row_blocks(stop, HEAD_ROWS, start):
            x = hf[s:e] @ tok_emb.T                                       # (r, V) logits
            for i, j in row_blocks(e, CE_ROWS, s):
                xi, t, r = x[i - s:j - s], targets[i:j], np.arange(j - i)  # (r', V), (r',)
                xi -= xi.max(axis=1, keepdims=True)                       # no overflow
                x_t = xi[r, t].astype(np.float64)
                np.exp(xi, out=xi)
                total = xi @ ones                                         # (r',) sum_v exp
                nll[i:j] = np.log(total.astype(np.float64)) - x_t
                xi *= (inv_n / total)[:, None]                            # softmax / n
                xi[r, t] -= inv_n                                         # - onehot / n
            np.matmul(x, tok_emb, out=dhf[s:e])                           # (r, D)
            partials[c] += x.T @ hf[s:e]                                  # (V, D)
    run(chunk, blocks)
    loss = float(nll.mean())
    return loss, (dhf, partials.sum(axis=0)), {"ce": loss, "targets": n}


def lm_head_backward(dlogits, cache):
    """layers.lm_head_backward: cross_entropy's dlogits are (dhf, dtok_emb) already."""
    return dlogits
