"""The fast layer set: layers.py's names and signatures over packed rows (ModelConfig.layers =
"fast"); tests/test_fast.py checks it against layers.py (float64 ~1e-10, float32 ~1e-4).
  packed rows   captions sorted by length: a caption, and a group of one length, is a row slice.
  attention     per group of length Tg on (Bg, Tg, ...) views: nothing on padding, no (B, T, T).
  fused passes  LayerNorm, GELU, softmaxes in place per cached row block; sums: @ a ones vector.
  the head      lm_head -> cross_entropy -> backward per row block, never all (n, V) logits.
  threads       set_threads(k); shape-only partitions, sums in block order: same bits for any k."""
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
    """Run the blocks on k >= 1 threads (1: the caller's); set OPENBLAS_NUM_THREADS=1 too."""
    global _pool
    if _pool is not None:
        _pool.shutdown()
    _pool = ThreadPoolExecutor(k) if k > 1 else None


def run(task, blocks):
    """task(i, *blocks[i]) for each block on set_threads's threads, in the caller's np.errstate."""
    err = np.geterr()

    def one(i):
        with np.errstate(**err):
            task(i, *blocks[i])
    list((_pool.map if _pool and len(blocks) > 1 else map)(one, range(len(blocks))))


def row_blocks(n, rows=None, start=0):
    """[(start, stop), ...]: the rows start:n in blocks of `rows` (default: SPLITS near-equal)."""
    rows = max(1, -(-n // SPLITS)) if rows is None else rows
    return [(s, min(s + rows, n)) for s in range(start, n, rows)]


def _c(value, like):
    return like.dtype.type(value)                # every constant: float32 arrays stay float32


class Group(NamedTuple):
    """Bg captions of Tg tokens, the rows start:stop; first: its first caption in Rows.order."""
    start: int
    stop: int
    first: int
    Bg: int
    Tg: int
    bias: Optional[np.ndarray]   # causal: (Tg, Tg), 0 on and below the diagonal, -inf above


class Rows(NamedTuple):
    """layers.TokenRows's fields in the fast order: shortest caption first (ties in batch order)."""
    flat: np.ndarray          # (n,) b * T + t of each row's token
    pos: np.ndarray           # (n,) its position t
    seq: np.ndarray           # (n,) its caption b
    caption_rows: np.ndarray  # (n,) the row of each token of tokens[tokens != PAD], in order
    order: np.ndarray         # (B,) the captions in row order
    lengths: np.ndarray       # (B,) real tokens of order[i], ascending
    groups: tuple             # Group, ...: every row in exactly one; no empty caption in any


def token_rows(mask, causal, dtype):
    """layers.token_rows in the fast order, a Rows: one length's captions in groups <= GROUP."""
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


def embedding_forward(ids, weight):
    """layers.embedding_forward: y = weight[ids]. ids: (n,) int; weight: (V, D)."""
    return weight[ids], (ids, weight.shape)


def embedding_backward(dy, cache):
    """layers.embedding_backward as a segment sum (np.add.reduceat) over rows sorted by id."""
    ids, shape = cache
    dweight, order = np.zeros(shape, dy.dtype), np.argsort(ids, kind="stable")  # (V, D), by id
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
    run(block, row_blocks(len(x)))
    return y, (x, w)


def linear_backward(dy, cache):
    """layers.linear_backward per chunk: dx, partials of dw = x^T dy, db = 1^T dy in order."""
    x, w = cache
    blocks = row_blocks(len(dy))
    dx, ones = np.empty((len(dy), w.shape[0]), dtype=dy.dtype), np.ones(len(dy), dy.dtype)
    parts = np.zeros((len(blocks), w.shape[0] + 1, w.shape[1]), dy.dtype)  # dw | db, per chunk

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
    y, xhat, inv_std = np.empty_like(x), np.empty_like(x), np.empty((n, 1), x.dtype)
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
    dx, t, (m1, m2) = np.empty_like(dy), np.empty_like(dy), np.empty((2, n), dy.dtype)
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
    """layers.gelu_forward in place per row block: y = x s, s = (1 + tanh u) / 2 = 1/(1 + e^-2u)."""
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
    """layers.gelu_backward per row block, in s: dx = dy [s + 2 x s (1 - s) c (1 + 3 a x^2)]."""
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


def group_heads(rows, Bg, n_heads):
    """A group's rows (Bg * Tg, C) -> a view (Bg, n_heads, Tg, C / n_heads), as split_heads."""
    return rows.reshape(Bg, -1, n_heads, rows.shape[1] // n_heads).transpose(0, 2, 1, 3)


def attention_forward(x, w_qkv, b_qkv, w_o, b_o, rows, n_heads):
    """layers.attention_forward a group at a time: q, k, v views of its rows of qkv, softmax in
    place in one (Bg, H, Tg, Tg) buffer, heads merged into a's rows. x: (n, D) token_rows."""
    (n, D), H = x.shape, n_heads
    qkv, c_qkv = linear_forward(x, w_qkv, b_qkv)                          # (n, 3D)
    a, scale = np.empty((n, D), dtype=x.dtype), _c(1.0 / math.sqrt(D // H), x)
    probs = [np.empty((g.Bg, H, g.Tg, g.Tg), x.dtype) for g in rows.groups]

    def group(i, s, e):
        g, p = rows.groups[i], probs[i]                                   # p: (Bg, H, Tg, Tg)
        q, k, v = np.split(group_heads(qkv[s:e], g.Bg, 3 * H), 3, axis=1)  # (Bg, H, Tg, Dh)
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


def pool_forward(h, rows):
    """layers.pool_forward: each group's (Bg, Tg, D) rows summed over Tg, / Tg. z: (B, D)."""
    z = np.zeros((len(rows.order), h.shape[1]), dtype=h.dtype)            # (B, D) row order
    for g in rows.groups:
        zg = z[g.first:g.first + g.Bg]
        np.sum(h[g.start:g.stop].reshape(g.Bg, g.Tg, -1), axis=1, out=zg)
        zg /= _c(g.Tg, h)
    return z[np.argsort(rows.order)], rows                                # (B, D) batch order


def pool_backward(dz, rows):
    """dz: (B, D) -> dh (n, D): each row gets its caption's dz / its length."""
    full = rows.lengths > 0
    n_b = rows.lengths[full]                                              # (B_full,)
    return np.repeat(dz[rows.order[full]] / n_b.astype(dz.dtype)[:, None], n_b, axis=0)


def lm_head_forward(hf, tok_emb):
    """layers.lm_head_forward deferred: the pair (hf, tok_emb), multiplied in cross_entropy."""
    return (hf, tok_emb), None


def cross_entropy(logits, targets):
    """losses.cross_entropy fused with the tied head: per HEAD_ROWS rows, logits = hf_b tok_emb^T
    -> in place (softmax - onehot) / n, CE_ROWS rows at a time; dhf_b = dlogits_b tok_emb, dtok_emb
    partials summed in order. Returns loss, (dhf, dtok_emb), stats."""
    (hf, tok_emb), n = logits, len(logits[0])
    if n == 0:
        raise ValueError("cross_entropy over zero targets")
    blocks = row_blocks(n)
    nll, dhf = np.empty(n), np.empty_like(hf)                             # (n,) float64, (n, D)
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
