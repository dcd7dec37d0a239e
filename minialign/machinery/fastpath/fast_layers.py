"""The fast path: the maths of layers.py, arranged for speed (cs231n keeps `fast_layers.py`
beside `layers.py` the same way); machinery/fastpath/fast.py hands it to the model under layers.py's
names. Read layers.py first: each function here has a reference there and
tests/test_fast_layers.py checks that they give the same outputs and gradients on ragged
batches. What is rearranged, and why:

  packing       Per-token layers (embeddings, LayerNorm, linear, GELU) run on the n real tokens
                of a batch, stacked as rows of an (n, D) array: no work on padding. The rows go
                caption by caption, captions sorted by length once per batch (packed_layout),
                so each caption is one contiguous slice of rows.
  grouping      Attention needs a (B, T) grid. mha_forward_fast runs it on groups of captions of
                one length Tg: a group's rows reshape to its (Bg, Tg, 3D) grid, so q, k, v are
                views, the merged heads are written straight into the output rows, and no T^2
                work is spent on padding. Reference: layers.mha_forward on (B, T, D).
  segments      Pooling sums each caption's slice (a group's (Bg, Tg, D) rows over Tg), not a
                (B, n) matrix product.
  in-place      softmax_attention_forward, cross_entropy_fast and gelu_forward_fast write each
                pass into one buffer: their arrays are the largest in the model. Their scalars
                have the array's dtype (a float64 scalar runs NumPy's float64 loop). One
                buffer instead of a new array per pass: faster (docs/performance.md).
  row blocks    The per-token layers (fast_rows.py: embeddings, linear, LayerNorm, GELU)
                run as chains of passes over blocks of packed rows that stay
                in L2 (rows.py says how big), spread over the cores by rows.py's thread pool; their sums over rows are
                per-block partials added in block order, so the bits do not depend on the
                thread count (tests/test_rows.py). Attention's groups and cross-entropy's
                blocks go through the same pool.

Constants are scalars of the array's dtype: np.float32(c) on float32 arrays. Under NumPy 2,
`a *= np.float64(c)` on a float32 buffer runs the float64 loop and rounds back (several times
slower per pass), so no float64 scalar touches a float32 array here (tests/test_rows.py fails a float32
training step on any). tests/test_reference.py pins this module's float32 rounding: a change to a pass,
its order or a block size changes the pinned numbers and must say so when it regenerates them.
"""
import math
from typing import NamedTuple, Optional

import numpy as np

from ...layers import attention_bias, split_heads
from .fast_rows import linear_backward_rows, linear_forward_rows
from .rows import gemm_blocks, row_blocks, run, sum_partials

ATTENTION_GROUP = 64  # at most this many equal-length captions per attention group
CE_BLOCK = 32  # logits rows per fused cross-entropy block: 32 x 5814 float32 = 0.7 MB, in L2


# ---------------------------------------------------------------- packed layout and groups
class AttentionGroup(NamedTuple):
    """Bg captions of exactly Tg tokens, stored caption after caption as the packed rows
    start:stop, so their (Bg, Tg, C) grid is a reshape of those rows: a view, no copy."""
    start: int         # first packed row of the group
    stop: int          # one past its last row: stop - start = Bg * Tg
    first: int         # its first caption's index into PackedLayout.order
    Bg: int            # captions in the group
    Tg: int            # tokens in each of them, >= 1 (an empty caption is in no group)
    bias: Optional[np.ndarray]  # causal: attention_bias of one caption, (1, 1, Tg, Tg); else None


class PackedLayout(NamedTuple):
    """Where the n real tokens of a (B, T) batch sit as the rows of the packed (n, D) arrays:
    captions sorted by length (shortest first, ties in batch order), each caption's tokens in
    position order. So each caption and each attention group is one contiguous slice of rows."""
    flat: np.ndarray          # (n,) b * T + t of each row's token in the (B, T) batch
    seq: np.ndarray           # (n,) its caption b
    pos: np.ndarray           # (n,) its position t
    order: np.ndarray         # (B,) the captions in row order
    lengths: np.ndarray       # (B,) real tokens of order[i] (ascending: empty captions first)
    caption_rows: np.ndarray  # (n,) the row of each token of tokens[tokens != PAD], in that order
    groups: tuple             # AttentionGroup, ...: every row in exactly one


def packed_layout(mask, causal, dtype, group_size=ATTENTION_GROUP):
    """The row layout of a batch and its attention groups: the captions of one length, split
    into near-equal groups of at most group_size captions.
    mask: (B, T) bool, True at real tokens; causal: groups carry a causal bias, else none is
    needed (a group has no padding); dtype: the bias's float dtype. Returns a PackedLayout."""
    B, T = mask.shape
    lengths = mask.sum(axis=1)                                            # (B,)
    order = np.argsort(lengths, kind="stable")                            # (B,) short to long
    i, pos = np.divmod(np.flatnonzero(mask[order]), T)                    # (n,), (n,)
    seq = order[i]                                                        # (n,)
    flat = seq * T + pos                                                  # (n,)
    lengths = lengths[order]                                              # (B,) ascending
    first_row = np.concatenate([[0], np.cumsum(lengths)])                 # (B + 1,)
    groups = []
    for Tg in np.unique(lengths[lengths > 0]):
        first, last = np.searchsorted(lengths, [Tg, Tg + 1])              # captions of length Tg
        bias = attention_bias(np.ones((1, Tg), bool), True, dtype) if causal else None
        for caps in np.array_split(np.arange(first, last), -(-(last - first) // group_size)):
            start = int(first_row[caps[0]])
            groups.append(AttentionGroup(start, start + len(caps) * int(Tg), int(caps[0]),
                                         len(caps), int(Tg), bias))
    return PackedLayout(flat=flat, seq=seq, pos=pos, order=order, lengths=lengths,
                        caption_rows=np.argsort(flat, kind="stable"), groups=tuple(groups))


def group_heads(rows, Bg, n_heads):
    """A group's packed rows (Bg * Tg, C) -> (Bg, n_heads, Tg, C / n_heads), head j reading
    columns j*C/n_heads:(j+1)*C/n_heads: a view, so writing into it writes the rows."""
    return split_heads(rows.reshape(Bg, -1, rows.shape[1]), n_heads)      # (Bg, H, Tg, Dh)


def split_qkv(rows, Bg, n_heads):
    """A group's rows of q | k | v (Bg * Tg, 3D) -> q, k, v, each (Bg, H, Tg, Dh): views."""
    heads = group_heads(rows, Bg, 3 * n_heads)                            # (Bg, 3H, Tg, Dh)
    return heads[:, :n_heads], heads[:, n_heads:2 * n_heads], heads[:, 2 * n_heads:]


# ---------------------------------------------------------------- attention
def attention_scale(q):
    """1 / sqrt(Dh) as a scalar of q's dtype: a float64 scalar would send a float32 array
    through NumPy's float64 loop (slower; rounds differently from layers.mha_forward)."""
    return q.dtype.type(1.0 / math.sqrt(q.shape[-1]))


def softmax_attention_forward(q, k, v, bias=None, y=None, probs=None):
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1), batched over (B, H), as
    in-place passes over one (B, H, T, T) buffer: y = softmax(q k^T / sqrt(Dh) + bias) v.
    q, k, v: (B, H, T, Dh), any strides; bias: None or broadcastable to (B, H, T, T), 0 or
    -inf, hiding no query's every key. y: (B, H, T, Dh) and probs: (B, H, T, T), outputs to
    write into (e.g. views of packed rows), or None to allocate.
    Returns y and a cache (q, k, v, probs, scale). Reference: the core of layers.mha_forward."""
    scale = attention_scale(q)
    scores = np.matmul(q, k.swapaxes(-1, -2), out=probs)                  # (B, H, T, T)
    scores *= scale
    if bias is not None:
        scores += bias
    # subtract each row's max before exp: the same softmax, no overflow
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores, out=scores)                                    # (B, H, T, T)
    # sum over keys s; einsum: NumPy's sum over a short last axis costs ~3x more per row
    probs /= np.einsum("...ts->...t", probs)[..., None]
    y = np.matmul(probs, v, out=y)                                        # (B, H, T, Dh)
    return y, (q, k, v, probs, scale)


def softmax_attention_backward(dy, cache, dq=None, dk=None, dv=None):
    """dy: (B, H, T, Dh) -> dq, dk, dv, each (B, H, T, Dh), written into the given arrays
    (any strides) or allocated. The softmax Jacobian runs as in-place passes."""
    q, k, v, probs, scale = cache
    dv = np.matmul(probs.swapaxes(-1, -2), dy, out=dv)                    # (B, H, T, Dh)
    dscores = dy @ v.swapaxes(-1, -2)                                     # (B, H, T, T) dprobs
    # forward: probs = softmax(scores): dscores = probs * (dprobs - sum_s probs dprobs)
    dscores -= np.einsum("...ts,...ts->...t", dscores, probs)[..., None]
    dscores *= probs
    dscores *= scale                                                      # forward: scores *= scale
    dq = np.matmul(dscores, k, out=dq)                                    # (B, H, T, Dh)
    dk = np.matmul(dscores.swapaxes(-1, -2), q, out=dk)                   # (B, H, T, Dh)
    return dq, dk, dv


def attention_group_forward(qkv, g, n_heads, a, probs):
    """One group's attention, from packed rows to packed rows (the unit a thread pool maps):
    q | k | v are views of qkv's rows g.start:g.stop, the merged heads go straight into a's.
    qkv: (n, 3D); a: (n, D) C-contiguous, only the group's rows written; probs: (Bg, H, Tg,
    Tg), filled with the attention weights (the cache attention_group_backward reads)."""
    q, k, v = split_qkv(qkv[g.start:g.stop], g.Bg, n_heads)               # 3 x (Bg, H, Tg, Dh)
    y = group_heads(a[g.start:g.stop], g.Bg, n_heads)                     # (Bg, H, Tg, Dh) view
    softmax_attention_forward(q, k, v, g.bias, y=y, probs=probs)


def attention_group_backward(da, qkv, probs, g, n_heads, dqkv):
    """The backward of attention_group_forward: da's rows g.start:g.stop (n, D) -> dqkv's
    same rows (n, 3D, C-contiguous), dq | dk | dv written in place, as qkv held q | k | v."""
    q, k, v = split_qkv(qkv[g.start:g.stop], g.Bg, n_heads)               # 3 x (Bg, H, Tg, Dh)
    dq, dk, dv = split_qkv(dqkv[g.start:g.stop], g.Bg, n_heads)           # views, written
    dy = group_heads(da[g.start:g.stop], g.Bg, n_heads)                   # (Bg, H, Tg, Dh)
    softmax_attention_backward(dy, (q, k, v, probs, attention_scale(q)), dq, dk, dv)


def mha_forward_fast(x, w_qkv, b_qkv, w_o, b_o, groups, n_heads):
    """layers.mha_forward on packed rows, one group of equal-length captions at a time.
    x: (n, D) packed real tokens, rows laid out by packed_layout; w_qkv: (D, 3D); b_qkv:
    (3D,); w_o: (D, D); b_o: (D,); groups: packed_layout(...).groups. Returns y: (n, D), cache."""
    n, D = x.shape
    qkv, c_qkv = linear_forward_rows(x, w_qkv, b_qkv)                     # (n, 3D)
    a = np.empty((n, D), dtype=x.dtype)                                   # (n, D) every row written
    probs = [np.empty((g.Bg, n_heads, g.Tg, g.Tg), dtype=x.dtype) for g in groups]
    # independent groups, each writing its own rows of a: spread over the row pool's threads
    run(lambda i: attention_group_forward(qkv, groups[i], n_heads, a, probs[i]), len(groups))
    y, c_o = linear_forward_rows(a, w_o, b_o)                             # (n, D)
    return y, (c_qkv, qkv, probs, c_o, groups, n_heads)


def mha_backward_fast(dy, cache):
    """dy: (n, D) -> dx (n, D), dw_qkv (D, 3D), db_qkv (3D,), dw_o (D, D), db_o (D,)."""
    c_qkv, qkv, probs, c_o, groups, n_heads = cache
    n, D = dy.shape
    da, dw_o, db_o = linear_backward_rows(dy, c_o)                        # (n, D)
    dqkv = np.empty((n, 3 * D), dtype=dy.dtype)                           # (n, 3D) every row written
    run(lambda i: attention_group_backward(da, qkv, probs[i], groups[i], n_heads, dqkv),
        len(groups))                                                      # independent groups
    dx, dw_qkv, db_qkv = linear_backward_rows(dqkv, c_qkv)                # (n, D)
    return dx, dw_qkv, db_qkv, dw_o, db_o


# ---------------------------------------------------------------- pooling, a segment mean
def mean_pool_forward_fast(h, layout):
    """layers.mean_pool_forward as a segment mean: each caption's rows are one slice of the
    layout, and a group's Bg captions of Tg tokens reshape to (Bg, Tg, D), summed over Tg (n D
    additions) where the reference multiplies by a (B, n) matrix (2 B n D flops; and
    np.add.reduceat over the slices is far slower than these sums).
    h: (n, D) in layout row order; layout: packed_layout(...).
    Returns z: (B, D) in batch order, 0 for an empty caption, and a cache."""
    B, D = len(layout.order), h.shape[1]
    z_rows = np.zeros((B, D), dtype=h.dtype)                              # (B, D) in row order
    for g in layout.groups:
        z_g = z_rows[g.first:g.first + g.Bg]                              # (Bg, D) view
        np.sum(h[g.start:g.stop].reshape(g.Bg, g.Tg, D), axis=1, out=z_g)
        z_g /= h.dtype.type(g.Tg)
    z = np.empty_like(z_rows)                                             # (B, D) batch order
    z[layout.order] = z_rows
    return z, (layout,)


def mean_pool_backward_fast(dz, cache):
    """dz: (B, D) -> dh (n, D) in layout row order: each row gets dz of its caption / n_b."""
    (layout,) = cache
    full = layout.lengths > 0                                             # (B,) in row order
    counts = layout.lengths[full]                                         # (B_f,)
    dz_rows = dz[layout.order[full]] / counts.astype(dz.dtype)[:, None]   # (B_f, D)
    return np.repeat(dz_rows, counts, axis=0)                             # (n, D)


# ---------------------------------------------------------------- cross-entropy, fused
def cross_entropy_fast(logits, targets, block_rows=CE_BLOCK):
    """losses.cross_entropy (the reference: same loss, same dlogits) as fused in-place passes
    over blocks of block_rows rows, each block cache-sized: max, subtract, exp, sum, scale.
    logits: (n, V) float, C-contiguous, OVERWRITTEN with dlogits; targets: (n,) int in [0, V).
    Returns loss (float: per-row losses summed in float64), dlogits (n, V) = (softmax -
    onehot) / n (the logits buffer), stats {ce, targets (= n)}. Raises ValueError if n = 0."""
    n, V = logits.shape
    assert targets.shape == (n,), (targets.shape, n)
    if n == 0:
        raise ValueError("cross_entropy over zero targets")
    nll = np.empty(n, dtype=np.float64)                                   # (n,) -log p(target)
    blocks = row_blocks(n, block_rows)                                    # independent blocks
    run(lambda i: cross_entropy_rows(logits, targets, *blocks[i], n, nll), len(blocks))
    loss = float(nll.mean())
    return loss, logits, {"ce": loss, "targets": n}


def cross_entropy_rows(logits, targets, start, stop, n, nll):
    """One block of cross_entropy_fast (the unit a thread pool maps): rows start:stop of
    logits (n, V) become (softmax - onehot) / n, nll[start:stop] their -log softmax at the
    target, computed from the float32 row sums in float64 (the sums as a GEMV with a ones
    vector: faster than np.sum over the long last axis)."""
    x = logits[start:stop]                                                # (r, V) view
    rows, t = np.arange(stop - start), targets[start:stop]                # (r,), (r,)
    # subtract the row max before exp: same softmax, no overflow
    x -= x.max(axis=1, keepdims=True)
    x_t = x[rows, t].astype(np.float64)                                   # (r,) shifted target
    np.exp(x, out=x)
    total = x @ np.ones(x.shape[1], dtype=x.dtype)                        # (r,) sum_v exp, a GEMV
    nll[start:stop] = np.log(total.astype(np.float64)) - x_t
    x *= (1 / (total * n))[:, None]                                       # softmax / n, x's dtype
    x[rows, t] -= x.dtype.type(1 / n)                                     # - onehot / n


def tied_head_cross_entropy_fast(hf, tok_emb, targets, block_rows=CE_BLOCK):
    """The tied head + cross-entropy (layers.lm_head_forward, losses.cross_entropy,
    layers.lm_head_backward; what fast.py's three calls of those names run) in one pass over
    the row blocks of rows.gemm_blocks(n) (at most 512 rows), never holding all (n, V) logits
    (150 MB at the default batch): per block, on the pool: logits = hf_b tok_emb^T (as
    rows.matmul_rows), cross_entropy_rows in place on its CE blocks, dhf_b = dlogits_b tok_emb,
    and the block's partial dlogits_b^T hf_b of dtok_emb, added in block order (as
    rows.matmul_tn_rows): the same products on the same rows, so the same bits as matmul_rows,
    cross_entropy_fast and matmul_tn_rows one after the other (tested). hf: (n, D) final
    hidden states of the rows with a target; tok_emb: (V, D); targets: (n,) int in [0, V). Returns loss (float), dhf (n, D), dtok_emb (V, D) (the head's
    part only), stats {ce, targets (= n)}. Raises ValueError if n = 0."""
    n, D = hf.shape
    V = tok_emb.shape[0]
    assert targets.shape == (n,), (targets.shape, n)
    if n == 0:
        raise ValueError("cross_entropy over zero targets")
    blocks = gemm_blocks(n)
    nll = np.empty(n, dtype=np.float64)                                   # (n,) -log p(target)
    dhf = np.empty((n, D), dtype=hf.dtype)                                # (n, D)
    partials = np.empty((len(blocks), V, D), dtype=hf.dtype)              # (P, V, D)

    def block(i):
        start, stop = blocks[i]
        logits = hf[start:stop] @ tok_emb.T                               # (r, V) this block's
        for s, e in row_blocks(stop - start, block_rows):                 # in place: dlogits
            cross_entropy_rows(logits, targets[start:stop], s, e, n, nll[start:stop])
        np.matmul(logits, tok_emb, out=dhf[start:stop])                   # (r, D)
        np.matmul(logits.T, hf[start:stop], out=partials[i])              # (V, D)

    run(block, len(blocks))
    loss = float(nll.mean())
    return loss, dhf, sum_partials(partials), {"ce": loss, "targets": n}
