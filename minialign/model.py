"""The text encoder: token + position embeddings -> L pre-LN transformer blocks -> final
LayerNorm -> masked mean pool -> one D-dim caption embedding z. Plus the tied next-token head.

Parameters and gradients are two flat dicts with the same keys:
    tok_emb (V, D), pos_emb (T_max, D),
    blocks.{i}.ln1.gamma/beta (D,), blocks.{i}.attn.w_qkv (D, 3D), .b_qkv (3D,),
    blocks.{i}.attn.w_o (D, D), .b_o (D,), blocks.{i}.ln2.gamma/beta (D,),
    blocks.{i}.mlp.w_in (D, F), .b_in (F,), blocks.{i}.mlp.w_out (F, D), .b_out (D,),
    ln_f.gamma/beta (D,).
"""
from dataclasses import dataclass

import numpy as np

from .fast_layers import (attention_groups, gelu_backward_fast, gelu_forward_fast,
                          mha_backward_fast, mha_forward_fast)
from .layers import (embedding_backward, embedding_forward, layernorm_backward, layernorm_forward,
                     linear_backward, linear_forward, mean_pool_backward, mean_pool_forward)
from .tokenizer import PAD, SPECIALS

INIT_STD = 0.02  # N(0, 0.02^2) for every weight matrix and embedding (GPT-2, Radford et al. 2019)
MIN_MAX_LEN = 3  # the shortest max_len that holds BOS, one word and EOS (tokenizer.encode)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the text encoder. Defaults: the replication's 4-layer, width-256 encoder."""
    vocab_size: int = 6000      # V, set from the tokenizer built on the training captions
    max_len: int = 64           # T_max: learned positions, captions are truncated to this
    d_model: int = 256          # D
    n_layers: int = 4           # L
    n_heads: int = 4            # H (D must divide by H)
    mlp_ratio: int = 4          # F = mlp_ratio * D

    def __post_init__(self):
        """Raises ValueError naming the field and its valid range."""
        for name, low in (("vocab_size", len(SPECIALS)), ("max_len", MIN_MAX_LEN),
                          ("d_model", 1), ("n_layers", 1), ("n_heads", 1), ("mlp_ratio", 1)):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ValueError(f"ModelConfig: {name}={value!r} must be an integer >= {low}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")


def init_params(cfg, rng, dtype=np.float32):
    """Fresh weights: N(0, INIT_STD^2) matrices and embeddings, with the two projections that
    write into the residual stream (attn.w_o, mlp.w_out) scaled by 1/sqrt(2L) as in GPT-2;
    zero biases, LayerNorm gains 1 and shifts 0. rng: numpy Generator. Returns {name: array}."""
    D, F, L = cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.n_layers
    normal = lambda *shape, std=INIT_STD: (std * rng.standard_normal(shape)).astype(dtype)
    resid_std = INIT_STD / np.sqrt(2 * L)
    params = {"tok_emb": normal(cfg.vocab_size, D), "pos_emb": normal(cfg.max_len, D)}
    for i in range(L):
        p = f"blocks.{i}."
        params.update({
            p + "ln1.gamma": np.ones(D, dtype), p + "ln1.beta": np.zeros(D, dtype),
            p + "attn.w_qkv": normal(D, 3 * D), p + "attn.b_qkv": np.zeros(3 * D, dtype),
            p + "attn.w_o": normal(D, D, std=resid_std), p + "attn.b_o": np.zeros(D, dtype),
            p + "ln2.gamma": np.ones(D, dtype), p + "ln2.beta": np.zeros(D, dtype),
            p + "mlp.w_in": normal(D, F), p + "mlp.b_in": np.zeros(F, dtype),
            p + "mlp.w_out": normal(F, D, std=resid_std), p + "mlp.b_out": np.zeros(D, dtype),
        })
    params["ln_f.gamma"], params["ln_f.beta"] = np.ones(D, dtype), np.zeros(D, dtype)
    return params


def param_count(params):
    """Total number of scalars in a parameter dict."""
    return int(sum(p.size for p in params.values()))


def encode(params, tokens, cfg, causal=False):
    """Caption embeddings of a batch of token ids.
    tokens: (B, T) int, PAD (0) after each caption's last token; T <= cfg.max_len.
    causal: each token reads only itself and earlier tokens (next-token training) instead of
    the whole caption. Per-token layers run on the n real tokens only (fast_layers.pack).
    Returns z (B, D): the mean of the final hidden states over each caption's real tokens;
    h (n, D): the final hidden states (after the final LayerNorm) of the real tokens, in the
    order of tokens[tokens != PAD]; and a cache for encode_backward."""
    B, T = tokens.shape
    assert T <= cfg.max_len, f"sequence length {T} > max_len {cfg.max_len}"
    mask = tokens != PAD                                                  # (B, T) real tokens
    real = np.flatnonzero(mask)                                           # (n,) flat positions b*T + t
    seq, pos = np.divmod(real, T)                                         # (n,), (n,)
    groups = attention_groups(mask, causal, params["tok_emb"].dtype)      # grids of similar length
    h, c_tok = embedding_forward(tokens.ravel()[real], params["tok_emb"])  # (n, D)
    p_emb, c_pos = embedding_forward(pos, params["pos_emb"])              # (n, D)
    h += p_emb
    blocks = []
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        a, c_ln1 = layernorm_forward(h, params[p + "ln1.gamma"], params[p + "ln1.beta"])
        a, c_att = mha_forward_fast(a, params[p + "attn.w_qkv"], params[p + "attn.b_qkv"],
                               params[p + "attn.w_o"], params[p + "attn.b_o"], groups,
                               cfg.n_heads)                               # (n, D)
        h = h + a                                                         # (n, D) residual
        m, c_ln2 = layernorm_forward(h, params[p + "ln2.gamma"], params[p + "ln2.beta"])
        m, c_in = linear_forward(m, params[p + "mlp.w_in"], params[p + "mlp.b_in"])  # (n, F)
        m, c_gelu = gelu_forward_fast(m)                                       # (n, F)
        m, c_out = linear_forward(m, params[p + "mlp.w_out"], params[p + "mlp.b_out"])  # (n, D)
        h = h + m                                                         # (n, D) residual
        blocks.append((c_ln1, c_att, c_ln2, c_in, c_gelu, c_out))
    h, c_lnf = layernorm_forward(h, params["ln_f.gamma"], params["ln_f.beta"])  # (n, D)
    z, c_pool = mean_pool_forward(h, seq, B)                              # (B, D)
    return z, h, (c_tok, c_pos, blocks, c_lnf, c_pool)


def encode_backward(dz, dh, cache, params, cfg):
    """Undo `encode` call for call, in reverse.
    dz: (B, D) gradient of the loss w.r.t. z; dh: (n, D) w.r.t. the final hidden states h,
    or None when the loss reads only z. Returns {name: gradient}, same keys as params."""
    c_tok, c_pos, blocks, c_lnf, c_pool = cache
    grads = {}
    dhf = mean_pool_backward(dz, c_pool)                                  # (n, D)
    if dh is not None:
        dhf += dh                                                         # h fed both pool and head
    dh, grads["ln_f.gamma"], grads["ln_f.beta"] = layernorm_backward(dhf, c_lnf)
    for i in reversed(range(cfg.n_layers)):
        p = f"blocks.{i}."
        c_ln1, c_att, c_ln2, c_in, c_gelu, c_out = blocks[i]
        # forward: h = h + mlp(ln2(h)); the residual passes dh through unchanged
        dm, grads[p + "mlp.w_out"], grads[p + "mlp.b_out"] = linear_backward(dh, c_out)
        dm = gelu_backward_fast(dm, c_gelu)
        dm, grads[p + "mlp.w_in"], grads[p + "mlp.b_in"] = linear_backward(dm, c_in)
        dm, grads[p + "ln2.gamma"], grads[p + "ln2.beta"] = layernorm_backward(dm, c_ln2)
        dh = dh + dm
        # forward: h = h + attn(ln1(h))
        da, grads[p + "attn.w_qkv"], grads[p + "attn.b_qkv"], grads[p + "attn.w_o"], \
            grads[p + "attn.b_o"] = mha_backward_fast(dh, c_att)
        da, grads[p + "ln1.gamma"], grads[p + "ln1.beta"] = layernorm_backward(da, c_ln1)
        dh = dh + da
    # forward: h = tok_emb[tokens] + pos_emb[positions]
    grads["pos_emb"] = embedding_backward(dh, c_pos)
    grads["tok_emb"] = embedding_backward(dh, c_tok)
    return grads


def lm_head_forward(h, tok_emb):
    """Next-token logits with the output matrix tied to the token embedding (Press & Wolf 2017):
    logits = h @ tok_emb^T, no bias, so the head adds no parameters.
    h: (n, D) hidden states at the positions that have a target; tok_emb: (V, D).
    Returns logits (n, V) and a cache."""
    logits = h @ tok_emb.T                                                # (n, V)
    return logits, (h, tok_emb)


def lm_head_backward(dlogits, cache):
    """dlogits: (n, V) -> dh (n, D), dtok_emb (V, D) (to be added to the embedding's own)."""
    h, tok_emb = cache
    dh = dlogits @ tok_emb                                                # (n, D)
    dtok_emb = dlogits.T @ h                                              # (V, D)
    return dh, dtok_emb
