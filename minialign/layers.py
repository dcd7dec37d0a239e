"""Transformer layers as forward/backward function pairs, written out by hand.

Sizes used in shape comments throughout minialign:
    B  batch (sequences)        T  tokens per sequence (after trimming padding)
    D  model width              H  attention heads, Dh = D // H per head
    F  MLP hidden width         L  blocks
    V  vocabulary               N  evaluation photos

Every `*_forward` returns `(y, cache)`; the matching `*_backward(dy, cache)` returns the
gradients of the forward's array arguments, in the forward's argument order. A cache is a
plain tuple the caller holds, so one layer can run twice (two views) before any backward.
Layers never cast: float64 in the gradient checks, float32 in training. No layer writes into
its `dy` or its cache.
"""
import numpy as np

LN_EPS = 1e-5  # variance floor inside LayerNorm (GPT-2 / PyTorch default)
GELU_C = np.sqrt(2.0 / np.pi)  # tanh approximation of GELU (Hendrycks & Gimpel 2016, eq. in sec. 2)
GELU_A = 0.044715  # cubic coefficient of the same approximation


# ---------------------------------------------------------------- embedding lookup
def embedding_forward(ids, weight):
    """Row lookup y[i] = weight[ids[i]] (token embeddings, and position embeddings with
    ids = positions). ids: (n,) int; weight: (V, D). Returns y: (n, D) and a cache."""
    y = weight[ids]                                                       # (n, D)
    return y, (ids, weight.shape)


def embedding_backward(dy, cache):
    """dy: (n, D) -> dweight (V, D): each row sums the dy of every position that read it."""
    ids, shape = cache
    dweight = np.zeros(shape, dtype=dy.dtype)                             # (V, D)
    np.add.at(dweight, ids, dy)                                           # repeated ids accumulate
    return dweight


# ---------------------------------------------------------------- packing
# Per-token layers (embeddings, LayerNorm, linear, GELU) run on the n real tokens of a batch,
# stacked as rows of an (n, D) array in the order of tokens[tokens != PAD]: no work on padding.
# Attention needs a (B, T) grid. It runs on groups of captions of similar length, each group
# scattered into its own grid trimmed to its longest caption, so its T^2 work shrinks too.
ATTENTION_GROUP = 64  # captions per attention grid (sorted by length: little padding in each)


def attention_groups(mask, causal, dtype, group_size=ATTENTION_GROUP):
    """Split a batch into attention grids of similar-length captions.
    mask: (B, T) bool, True at real tokens, padding only at the end of each row.
    Returns a list of groups (rows, real, Bg, Tg, bias): rows (n_g,) the packed rows of the
    group's tokens, in grid order; real (n_g,) their flat positions b * Tg + t in the group's
    (Bg, Tg) grid; bias attention_bias(...) of the grid. Every packed row is in one group."""
    lengths = mask.sum(axis=1)                                            # (B,)
    row_of = np.cumsum(mask.ravel()).reshape(mask.shape) - 1              # (B, T) packed row
    order = np.argsort(lengths, kind="stable")                            # (B,) short to long
    groups = []
    for seqs in np.array_split(order, -(-len(order) // group_size)):      # ceil(B / group_size)
        Tg = max(1, int(lengths[seqs].max()))
        sub = mask[seqs, :Tg]                                             # (Bg, Tg)
        groups.append((row_of[seqs, :Tg][sub], np.flatnonzero(sub), len(seqs), Tg,
                       attention_bias(sub, causal, dtype)))
    return groups


def unpack(x, real, B, T):
    """Packed rows x: (n, C) -> (B, T, C) grid, zeros at padding."""
    grid = np.zeros((B * T, x.shape[1]), dtype=x.dtype)                   # (B*T, C)
    grid[real] = x
    return grid.reshape(B, T, x.shape[1])


def pack(grid, real):
    """(B, T, C) grid -> its rows at the real positions, (n, C)."""
    return grid.reshape(-1, grid.shape[-1])[real]                         # (n, C)


# ---------------------------------------------------------------- linear
def linear_forward(x, w, b):
    """Affine map y = x @ w + b over the last axis.
    x: (..., D_in); w: (D_in, D_out); b: (D_out,). Returns y: (..., D_out) and a cache."""
    # as one 2-D GEMM: numpy would run a (B, T, D_in) @ w as B small products
    y = (x.reshape(-1, w.shape[0]) @ w).reshape(*x.shape[:-1], w.shape[1])  # (..., D_out)
    y += b
    return y, (x, w)


def linear_backward(dy, cache):
    """dy: (..., D_out) -> dx (..., D_in), dw (D_in, D_out), db (D_out,)."""
    x, w = cache
    d_in, d_out = w.shape
    dx = (dy.reshape(-1, d_out) @ w.T).reshape(*dy.shape[:-1], d_in)     # (..., D_in)
    dw = x.reshape(-1, d_in).T @ dy.reshape(-1, d_out)                    # (D_in, D_out)
    db = dy.reshape(-1, d_out).sum(axis=0)                                # (D_out,)
    return dx, dw, db


# ---------------------------------------------------------------- layernorm
def layernorm_forward(x, gamma, beta, eps=LN_EPS):
    """LayerNorm over the last axis (Ba, Kiros & Hinton 2016, eq. 4).
    x: (..., D); gamma, beta: (D,). Returns y: (..., D) and a cache."""
    mu = x.mean(axis=-1, keepdims=True)                                   # (..., 1)
    xc = x - mu                                                           # (..., D)
    inv_std = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = xc                                                             # (..., D) reuse xc's buffer
    xhat *= inv_std
    y = xhat * gamma                                                      # (..., D)
    y += beta
    return y, (xhat, inv_std, gamma)


def layernorm_backward(dy, cache):
    """dy: (..., D) -> dx (..., D), dgamma (D,), dbeta (D,)."""
    xhat, inv_std, gamma = cache
    D = xhat.shape[-1]
    dbeta = dy.reshape(-1, D).sum(axis=0)                                 # (D,)
    dgamma = (dy * xhat).reshape(-1, D).sum(axis=0)                       # (D,)
    g = dy * gamma                                                        # (..., D) d/dxhat
    # xhat rows have zero mean and unit variance: remove g's parts along ones and along xhat
    proj = (g * xhat).mean(axis=-1, keepdims=True)                        # (..., 1)
    dx = g - g.mean(axis=-1, keepdims=True)                               # (..., D)
    dx -= xhat * proj
    dx *= inv_std
    return dx, dgamma, dbeta


# ---------------------------------------------------------------- GELU (tanh form)
def gelu_forward(x):
    """GELU, tanh approximation: y = x/2 (1 + tanh(c (x + a x^3))), c = sqrt(2/pi), a = 0.044715
    (Hendrycks & Gimpel 2016; the form GPT-2 and BERT use). x: any shape. Returns y and a cache.
    Written as in-place passes over one buffer: these arrays are the largest in the model."""
    u = x * x                                                             # (...) x^2
    u *= GELU_A * GELU_C
    u += GELU_C
    u *= x                                                                # c (x + a x^3)
    th = np.tanh(u, out=u)                                                # (...)
    y = th * x                                                            # (...)
    y += x
    y *= 0.5                                                              # x/2 (1 + th)
    return y, (x, th)


def gelu_backward(dy, cache):
    """dy: same shape as x -> dx = dy * [ (1 + th)/2 + x/2 (1 - th^2) c (1 + 3 a x^2) ]."""
    x, th = cache
    dx = x * x                                                            # (...) x^2
    dx *= 3.0 * GELU_A * GELU_C
    dx += GELU_C                                                          # c (1 + 3 a x^2)
    dx *= x
    sech2 = th * th                                                       # (...)
    np.subtract(1.0, sech2, out=sech2)                                    # 1 - tanh^2
    dx *= sech2                                                           # x (1 - th^2) c (1 + 3a x^2)
    dx += th
    dx += 1.0
    dx *= 0.5
    dx *= dy
    return dx


# ---------------------------------------------------------------- attention
def attention_bias(key_mask, causal, dtype):
    """Additive attention bias: 0 where query t may read key s, -inf where it may not.
    key_mask: (B, T) bool, True at real (non-padding) tokens. causal: also hide keys s > t.
    Returns (B, 1, 1, T) or, if causal, (B, 1, T, T), in `dtype`."""
    bias = np.where(key_mask, 0.0, -np.inf).astype(dtype)[:, None, None, :]  # (B, 1, 1, T)
    if causal:
        T = key_mask.shape[1]
        future = np.triu(np.ones((T, T), dtype=bool), k=1)                # (T, T) s > t
        bias = bias + np.where(future, -np.inf, 0.0).astype(dtype)        # (B, 1, T, T)
    return bias


def softmax_attention_forward(q, k, v, bias):
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1), batched over (B, H):
    y = softmax(q k^T / sqrt(Dh) + bias) v.
    q, k, v: (B, H, T, Dh); bias: broadcastable to (B, H, T, T), 0 or -inf.
    A query with every key hidden (a fully padded sequence) gets all-zero weights and y = 0,
    never NaN. Returns y: (B, H, T, Dh) and a cache."""
    scale = 1.0 / np.sqrt(q.shape[-1])
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


def mha_forward(x, w_qkv, b_qkv, w_o, b_o, groups, n_heads):
    """Multi-head self-attention (Vaswani et al. 2017, sec. 3.2.2) with one fused q/k/v projection.
    x: (n, D) packed real tokens; w_qkv: (D, 3D); b_qkv: (3D,); w_o: (D, D); b_o: (D,);
    groups: attention_groups(...) of the batch. Returns y: (n, D) and a cache."""
    n, D = x.shape
    H, Dh = n_heads, D // n_heads
    qkv, c_qkv = linear_forward(x, w_qkv, b_qkv)                         # (n, 3D)
    a = np.empty_like(x)                                                  # (n, D)
    c_att = []
    for rows, real, Bg, Tg, bias in groups:
        g = unpack(qkv[rows], real, Bg, Tg).reshape(Bg, Tg, 3, H, Dh)     # (Bg, Tg, 3, H, Dh)
        q, k, v = g.transpose(2, 0, 3, 1, 4)                              # 3 x (Bg, H, Tg, Dh)
        ag, c = softmax_attention_forward(q, k, v, bias)                  # (Bg, H, Tg, Dh)
        a[rows] = pack(ag.transpose(0, 2, 1, 3).reshape(Bg, Tg, D), real)  # heads side by side
        c_att.append(c)
    y, c_o = linear_forward(a, w_o, b_o)                                  # (n, D)
    return y, (c_qkv, c_att, c_o, groups, n_heads)


def mha_backward(dy, cache):
    """dy: (n, D) -> dx (n, D), dw_qkv, db_qkv, dw_o, db_o."""
    c_qkv, c_att, c_o, groups, H = cache
    n, D = dy.shape
    Dh = D // H
    da, dw_o, db_o = linear_backward(dy, c_o)                             # (n, D)
    dqkv = np.empty((n, 3 * D), dtype=dy.dtype)                           # (n, 3D)
    for (rows, real, Bg, Tg, _), c in zip(groups, c_att):
        dag = unpack(da[rows], real, Bg, Tg).reshape(Bg, Tg, H, Dh).transpose(0, 2, 1, 3)
        grads = softmax_attention_backward(dag, c)                        # dq, dk, dv (Bg, H, Tg, Dh)
        grid = np.empty((Bg, Tg, 3, H, Dh), dtype=dy.dtype)               # forward's qkv layout
        for j, d in enumerate(grads):
            grid[:, :, j] = d.transpose(0, 2, 1, 3)                       # (Bg, Tg, H, Dh)
        dqkv[rows] = pack(grid.reshape(Bg, Tg, 3 * D), real)
    dx, dw_qkv, db_qkv = linear_backward(dqkv, c_qkv)                     # (n, D)
    return dx, dw_qkv, db_qkv, dw_o, db_o


# ---------------------------------------------------------------- pooling
def mean_pool_forward(h, seq, n_seqs):
    """Mean over each sequence's real tokens, as a matrix product: z = P h with
    P[b, i] = 1 / n_b if packed row i belongs to sequence b (n_b rows), else 0.
    h: (n, D) packed; seq: (n,) int, the sequence of each row; a sequence with no row pools
    to 0. Returns z: (n_seqs, D) and a cache."""
    counts = np.bincount(seq, minlength=n_seqs)                           # (n_seqs,) n_b
    P = np.zeros((n_seqs, len(seq)), dtype=h.dtype)                       # (n_seqs, n)
    P[seq, np.arange(len(seq))] = 1.0 / counts[seq]
    z = P @ h                                                             # (n_seqs, D)
    return z, (P,)


def mean_pool_backward(dz, cache):
    """dz: (n_seqs, D) -> dh (n, D) = P^T dz."""
    (P,) = cache
    return P.T @ dz                                                       # (n, D)
