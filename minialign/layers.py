"""Transformer layers as forward/backward pairs, written out by hand: the reference set that
model.encode is written in (machinery/fast.py has the same names, faster, tested against it).

Sizes: B captions, T tokens per caption, D width, H heads (Dh = D / H), F MLP width, V
vocabulary, n real (non-PAD) tokens of a batch packed as the rows of an (n, D) array.
Every `*_forward` returns (y, cache); `*_backward(dy, cache)` returns the gradients of the
forward's float arguments in their order. Layers never cast and never write into dy or cache.
"""
import math
from typing import NamedTuple

import numpy as np

from .losses import cross_entropy  # noqa: F401 (next_token's loss: the set is one module)

LN_EPS = 1e-5  # variance floor inside LayerNorm (GPT-2 / PyTorch default)
GELU_C = math.sqrt(2.0 / math.pi)  # tanh approximation of GELU (Hendrycks & Gimpel 2016, sec. 2)
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
    # --- exercise 1: linear backward ---
    x, w = cache
    d_in, d_out = w.shape
    dx = (dy.reshape(-1, d_out) @ w.T).reshape(*dy.shape[:-1], d_in)     # (..., D_in)
    dw = x.reshape(-1, d_in).T @ dy.reshape(-1, d_out)                    # (D_in, D_out)
    db = dy.reshape(-1, d_out).sum(axis=0)                                # (D_out,)
    return dx, dw, db
    # --- end of exercise 1 ---


# ---------------------------------------------------------------- layernorm
def layernorm_forward(x, gamma, beta, eps=LN_EPS):
    """LayerNorm over the last axis (Ba, Kiros & Hinton 2016, eq. 4).
    x: (..., D); gamma, beta: (D,). Returns y: (..., D) and a cache."""
    mu = x.mean(axis=-1, keepdims=True)                                   # (..., 1)
    xc = x - mu                                                           # (..., D)
    inv_std = 1.0 / np.sqrt((xc**2).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = xc * inv_std                                                   # (..., D)
    y = xhat * gamma + beta                                               # (..., D)
    return y, (xhat, inv_std, gamma)


def layernorm_backward(dy, cache):
    """dy: (..., D) -> dx (..., D), dgamma (D,), dbeta (D,)."""
    # --- exercise 4: LayerNorm backward ---
    xhat, inv_std, gamma = cache
    D = xhat.shape[-1]
    dbeta = dy.reshape(-1, D).sum(axis=0)                                 # (D,) forward: + beta
    dgamma = (dy * xhat).reshape(-1, D).sum(axis=0)                       # (D,) forward: xhat*gamma
    g = dy * gamma                                                        # (..., D) d/dxhat
    # xhat rows have zero mean and unit variance: drop g's parts along ones and along xhat
    dx = inv_std * (g - g.mean(axis=-1, keepdims=True)
                    - xhat * (g * xhat).mean(axis=-1, keepdims=True))     # (..., D)
    return dx, dgamma, dbeta
    # --- end of exercise 4 ---


# ---------------------------------------------------------------- GELU (tanh form)
def gelu_forward(x):
    """GELU, tanh approximation: y = x/2 (1 + tanh(c (x + a x^3))), c = sqrt(2/pi), a = 0.044715
    (Hendrycks & Gimpel 2016; the form GPT-2 and BERT use). x: any shape. Returns y and a cache."""
    th = np.tanh(GELU_C * (x + GELU_A * x**3))                            # (...)
    y = 0.5 * x * (1.0 + th)                                              # (...)
    return y, (x, th)


def gelu_backward(dy, cache):
    """dy: same shape as x -> dx = dy * [ (1 + th)/2 + x/2 (1 - th^2) c (1 + 3 a x^2) ]."""
    # --- exercise 2: GELU backward ---
    x, th = cache
    # forward: th = tanh(u), u = c (x + a x^3): dth/dx = (1 - th^2) c (1 + 3 a x^2)
    dth_dx = (1.0 - th**2) * GELU_C * (1.0 + 3.0 * GELU_A * x**2)         # (...)
    # forward: y = x/2 (1 + th), product rule
    dx = dy * (0.5 * (1.0 + th) + 0.5 * x * dth_dx)                       # (...)
    return dx
    # --- end of exercise 2 ---


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


def split_heads(x, n_heads):
    """(B, T, D) -> (B, H, T, Dh): head j reads features j*Dh:(j+1)*Dh. A view, no copy."""
    B, T, D = x.shape
    return x.reshape(B, T, n_heads, D // n_heads).transpose(0, 2, 1, 3)   # (B, H, T, Dh)


def merge_heads(x):
    """(B, H, T, Dh) -> (B, T, D): the heads side by side again (undoes split_heads)."""
    B, H, T, Dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)                  # (B, T, D)


def mha_forward(x, w_qkv, b_qkv, w_o, b_o, bias, n_heads):
    """Multi-head self-attention (Vaswani et al. 2017), dense: q | k | v = x w_qkv + b_qkv,
    y = concat_heads(softmax(q k^T / sqrt(Dh) + bias) v) w_o + b_o. x: (B, T, D); w_qkv (D, 3D),
    head j at j*Dh:(j+1)*Dh of each of q | k | v; bias: attention_bias. Returns y (B, T, D)."""
    B, T, D = x.shape
    qkv, c_qkv = linear_forward(x, w_qkv, b_qkv)                          # (B, T, 3D)
    q, k, v = (split_heads(t, n_heads) for t in np.split(qkv, 3, axis=-1))  # 3 x (B, H, T, Dh)
    scale = 1.0 / math.sqrt(D // n_heads)  # a Python float: keeps float32 arrays float32
    scores = q @ k.swapaxes(-1, -2) * scale + bias                        # (B, H, T, T)
    # subtract each row's max before exp: the same softmax, no overflow
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))               # (B, H, T, T)
    probs = e / e.sum(axis=-1, keepdims=True)                             # (B, H, T, T) over keys
    a = probs @ v                                                         # (B, H, T, Dh)
    y, c_o = linear_forward(merge_heads(a), w_o, b_o)                     # (B, T, D)
    return y, (c_qkv, q, k, v, probs, scale, c_o)


def mha_backward(dy, cache):
    """dy: (B, T, D) -> dx (B, T, D), dw_qkv (D, 3D), db_qkv (3D,), dw_o (D, D), db_o (D,)."""
    # --- exercise 5: attention backward ---
    c_qkv, q, k, v, probs, scale, c_o = cache
    dmerged, dw_o, db_o = linear_backward(dy, c_o)                        # (B, T, D)
    da = split_heads(dmerged, q.shape[1])                                 # (B, H, T, Dh)
    # forward: a = probs @ v
    dprobs = da @ v.swapaxes(-1, -2)                                      # (B, H, T, T)
    dv = probs.swapaxes(-1, -2) @ da                                      # (B, H, T, Dh)
    # forward: probs = softmax(scores) over keys s: dscores = probs * (dprobs - sum_s probs dprobs)
    dscores = probs * (dprobs - (probs * dprobs).sum(axis=-1, keepdims=True))  # (B, H, T, T)
    # forward: scores = q @ k^T * scale + bias
    dq = dscores @ k * scale                                              # (B, H, T, Dh)
    dk = dscores.swapaxes(-1, -2) @ q * scale                             # (B, H, T, Dh)
    # forward: q, k, v = split_heads of np.split(qkv, 3)
    dqkv = np.concatenate([merge_heads(d) for d in (dq, dk, dv)], axis=-1)  # (B, T, 3D)
    dx, dw_qkv, db_qkv = linear_backward(dqkv, c_qkv)                     # (B, T, D)
    return dx, dw_qkv, db_qkv, dw_o, db_o
    # --- end of exercise 5 ---


# ---------------------------------------------------------------- pooling
def mean_pool_forward(h, seq, n_seqs):
    """Mean over each sequence's rows as a matrix product z = P h, P[b, i] = 1 / n_b if row i
    belongs to sequence b (n_b rows). h: (n, D); seq: (n,) int. Returns z (n_seqs, D)."""
    # --- exercise 3: mean pooling ---
    counts = np.bincount(seq, minlength=n_seqs)                           # (n_seqs,) n_b
    P = np.zeros((n_seqs, len(seq)), dtype=h.dtype)                       # (n_seqs, n)
    P[seq, np.arange(len(seq))] = 1.0 / counts[seq]
    z = P @ h                                                             # (n_seqs, D)
    return z, (P,)
    # --- end of exercise 3 ---


def mean_pool_backward(dz, cache):
    """dz: (n_seqs, D) -> dh (n, D) = P^T dz."""
    (P,) = cache
    return P.T @ dz                                                       # (n, D)


# ---------------------------------------------------------------- the batch as rows of real tokens
class TokenRows(NamedTuple):
    """Where the n real tokens of a (B, T) batch sit as the rows of the (n, D) arrays the
    per-token layers run on. Here: batch order, caption after caption (tokens[mask])."""
    flat: np.ndarray          # (n,) b * T + t of each row's token in the (B, T) batch
    pos: np.ndarray           # (n,) its position t
    seq: np.ndarray           # (n,) its caption b
    mask: np.ndarray          # (B, T) bool, True at real tokens
    bias: np.ndarray          # attention_bias of the batch, (B, 1, 1, T) or (B, 1, T, T)
    caption_rows: np.ndarray  # (n,) the row of each token of tokens[tokens != PAD]: all, in order


def token_rows(mask, causal, dtype):
    """The rows of a batch: its real tokens in batch order. mask: (B, T) bool, True at real
    tokens; causal: the attention bias also hides later tokens; dtype: the bias's float dtype.
    Returns a TokenRows."""
    B, T = mask.shape
    flat = np.flatnonzero(mask)                                           # (n,) b * T + t
    seq, pos = np.divmod(flat, T)                                         # (n,), (n,)
    # a caption with no token reads its own padding: its outputs are never read, and no
    # softmax row is all -inf (which would be NaN and reach the weights' gradients as 0 * NaN)
    keys = mask | ~mask.any(axis=1, keepdims=True)                        # (B, T)
    return TokenRows(flat=flat, pos=pos, seq=seq, mask=mask,
                     bias=attention_bias(keys, causal, dtype), caption_rows=np.arange(len(flat)))


def attention_forward(x, w_qkv, b_qkv, w_o, b_o, rows, n_heads):
    """mha_forward on the rows x (n, D) of real tokens: back on the (B, T, D) grid (zeros at
    padding), dense attention with the batch's bias, the real tokens' outputs y (n, D)."""
    grid = np.zeros((*rows.mask.shape, x.shape[1]), dtype=x.dtype)       # (B, T, D)
    grid[rows.mask] = x                                                   # real tokens in place
    y, c_mha = mha_forward(grid, w_qkv, b_qkv, w_o, b_o, rows.bias, n_heads)  # (B, T, D)
    return y[rows.mask], (c_mha, rows.mask)                               # (n, D)


def attention_backward(dy, cache):
    """dy: (n, D) -> dx (n, D), dw_qkv (D, 3D), db_qkv (3D,), dw_o (D, D), db_o (D,)."""
    c_mha, mask = cache
    dgrid = np.zeros((*mask.shape, dy.shape[1]), dtype=dy.dtype)          # (B, T, D)
    dgrid[mask] = dy                                  # forward: y[mask]; padding outputs unread
    dx, dw_qkv, db_qkv, dw_o, db_o = mha_backward(dgrid, c_mha)           # dx (B, T, D)
    return dx[mask], dw_qkv, db_qkv, dw_o, db_o                           # forward: grid[mask] = x


def pool_forward(h, rows):
    """z[b] (B, D) = mean of caption b's rows of h (n, D): mean_pool_forward over `rows`."""
    return mean_pool_forward(h, rows.seq, rows.mask.shape[0])             # (B, D)


def pool_backward(dz, cache):
    """dz: (B, D) -> dh (n, D)."""
    return mean_pool_backward(dz, cache)                                  # (n, D)


# ---------------------------------------------------------------- the tied next-token head
def lm_head_forward(hf, tok_emb):
    """Next-token logits through the token embedding (tied, Press & Wolf 2017): logits (n, V) =
    hf @ tok_emb^T, no bias. hf: (n, D) states of the positions that have a target."""
    logits = hf @ tok_emb.T                                               # (n, V)
    return logits, (hf, tok_emb)


def lm_head_backward(dlogits, cache):
    """dlogits: (n, V) -> dhf (n, D), dtok_emb (V, D) (to be added to the embedding's own)."""
    hf, tok_emb = cache
    dhf = dlogits @ tok_emb                                               # (n, D)
    dtok_emb = dlogits.T @ hf                                             # (V, D) sum over rows
    return dhf, dtok_emb
