"""The text encoder: token + position embeddings -> L pre-LN transformer blocks -> final
LayerNorm -> masked mean pool -> one D-dim caption embedding z. Plus the tied next-token head.

Parameters and gradients are two flat dicts with the same keys:
    tok_emb (V, D), pos_emb (T_max, D),
    blocks.{i}.ln1.gamma/beta (D,), blocks.{i}.attn.w_qkv (D, 3D), .b_qkv (3D,),
    blocks.{i}.attn.w_o (D, D), .b_o (D,), blocks.{i}.ln2.gamma/beta (D,),
    blocks.{i}.mlp.w_in (D, F), .b_in (F,), blocks.{i}.mlp.w_out (F, D), .b_out (D,),
    ln_f.gamma/beta (D,).
BLOCK_PARAMS names a block's twelve, in the order init_params, encode and encode_backward use.
Names: h is the residual stream, hf = ln_f(h) the final hidden states, z their pooled mean.
"""
from dataclasses import dataclass

import numpy as np

from .machinery.fast_layers import (mean_pool_backward_fast, mean_pool_forward_fast,
                                    mha_backward_fast, mha_forward_fast, packed_layout)
from .machinery.fast_rows import (add_rows, embedding_backward_rows, embedding_forward_rows,
                                  gelu_backward_fast, gelu_forward_fast, layernorm_backward_rows,
                                  layernorm_forward_rows, linear_backward_rows,
                                  linear_forward_rows)
from .machinery.rows import matmul_rows, matmul_tn_rows
from .tokenizer import PAD, SPECIALS

INIT_STD = 0.02  # N(0, 0.02^2) for every weight matrix and embedding (GPT-2, Radford et al. 2019)
MIN_MAX_LEN = 3  # the shortest max_len that holds BOS, one word and EOS (tokenizer.encode)
# one block's parameters; blocks.{i}.<name> in the dicts (block_keys)
BLOCK_PARAMS = ("ln1.gamma", "ln1.beta", "attn.w_qkv", "attn.b_qkv", "attn.w_o", "attn.b_o",
                "ln2.gamma", "ln2.beta", "mlp.w_in", "mlp.b_in", "mlp.w_out", "mlp.b_out")


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
        block = {
            "ln1.gamma": np.ones(D, dtype), "ln1.beta": np.zeros(D, dtype),
            "attn.w_qkv": normal(D, 3 * D), "attn.b_qkv": np.zeros(3 * D, dtype),
            "attn.w_o": normal(D, D, std=resid_std), "attn.b_o": np.zeros(D, dtype),
            "ln2.gamma": np.ones(D, dtype), "ln2.beta": np.zeros(D, dtype),
            "mlp.w_in": normal(D, F), "mlp.b_in": np.zeros(F, dtype),
            "mlp.w_out": normal(F, D, std=resid_std), "mlp.b_out": np.zeros(D, dtype),
        }
        assert tuple(block) == BLOCK_PARAMS
        params.update(zip(block_keys(i), block.values()))
    params["ln_f.gamma"], params["ln_f.beta"] = np.ones(D, dtype), np.zeros(D, dtype)
    return params


def param_count(params):
    """Total number of scalars in a parameter dict."""
    return int(sum(p.size for p in params.values()))


def block_keys(i):
    """The parameter names of block i, in BLOCK_PARAMS order: "blocks.{i}.ln1.gamma", ..."""
    return [f"blocks.{i}.{name}" for name in BLOCK_PARAMS]


def encode(params, tokens, cfg, causal=False):
    """Caption embeddings of a batch of token ids.
    tokens: (B, T) int, PAD (0) after each caption's last token; T <= cfg.max_len.
    causal: each token reads only itself and earlier tokens (next-token training) instead of
    the whole caption. Per-token layers run on the n real tokens only, as rows laid out
    caption by caption, sorted by length (fast_layers.packed_layout: attention reads each
    group of equal-length captions as a view of its rows, and pooling is a segment mean), in
    blocks of rows spread over the cores (machinery/fast_rows.py, machinery/rows.py).
    Returns z (B, D): the mean of hf over each caption's real tokens; hf (n, D): the final
    hidden states (the residual stream h after the final LayerNorm) of the real tokens, in
    the order of tokens[tokens != PAD]; and a cache for encode_backward."""
    B, T = tokens.shape
    assert T <= cfg.max_len, f"sequence length {T} > max_len {cfg.max_len}"
    mask = tokens != PAD                                                  # (B, T) real tokens
    layout = packed_layout(mask, causal, params["tok_emb"].dtype)         # rows sorted by length
    # h = tok_emb[tokens] + pos_emb[positions]
    h, c_emb = embedding_forward_rows(tokens.ravel()[layout.flat], layout.pos, params["tok_emb"],
                                      params["pos_emb"])                  # (n, D)
    blocks = []
    for i in range(cfg.n_layers):
        (ln1_gamma, ln1_beta, w_qkv, b_qkv, w_o, b_o,
         ln2_gamma, ln2_beta, w_in, b_in, w_out, b_out) = (params[k] for k in block_keys(i))
        a, c_ln1 = layernorm_forward_rows(h, ln1_gamma, ln1_beta)         # (n, D)
        a, c_att = mha_forward_fast(a, w_qkv, b_qkv, w_o, b_o, layout.groups, cfg.n_heads)
        h = add_rows(h, a)                                                # (n, D) residual
        m, c_ln2 = layernorm_forward_rows(h, ln2_gamma, ln2_beta)         # (n, D)
        m, c_in = linear_forward_rows(m, w_in, b_in)                      # (n, F)
        m, c_gelu = gelu_forward_fast(m)                                  # (n, F)
        m, c_out = linear_forward_rows(m, w_out, b_out)                   # (n, D)
        h = add_rows(h, m)                                                # (n, D) residual
        blocks.append((c_ln1, c_att, c_ln2, c_in, c_gelu, c_out))
    hf, c_lnf = layernorm_forward_rows(h, params["ln_f.gamma"], params["ln_f.beta"])  # (n, D)
    z, c_pool = mean_pool_forward_fast(hf, layout)                        # (B, D)
    # hf back in the order of tokens[tokens != PAD], the order next-token targets use
    return z, hf[layout.caption_rows], (c_emb, blocks, c_lnf, c_pool, layout)


def encode_backward(dz, dhf, cache):
    """Undo `encode` call for call, in reverse.
    dz: (B, D) gradient of the loss w.r.t. z; dhf: (n, D) w.r.t. the final hidden states hf,
    or None when the loss reads only z. When z holds two views of each caption (one encode
    call on a 2B batch), their gradients sum in the shared weights' entries of grads.
    Returns {name: gradient}, the keys of params."""
    c_emb, blocks, c_lnf, c_pool, layout = cache
    grads = {}
    dhf_rows = mean_pool_backward_fast(dz, c_pool)                        # (n, D) layout order
    if dhf is not None:                                                   # hf fed pool and head
        dhf_rows[layout.caption_rows] += dhf                              # forward: hf[caption_rows]
    dh, grads["ln_f.gamma"], grads["ln_f.beta"] = layernorm_backward_rows(dhf_rows, c_lnf)
    for i in reversed(range(len(blocks))):
        c_ln1, c_att, c_ln2, c_in, c_gelu, c_out = blocks[i]
        # forward: h = h + mlp(ln2(h)); the residual passes dh through unchanged
        dm, dw_out, db_out = linear_backward_rows(dh, c_out)              # (n, F)
        dm = gelu_backward_fast(dm, c_gelu)                               # (n, F)
        dm, dw_in, db_in = linear_backward_rows(dm, c_in)                 # (n, D)
        dm, dln2_gamma, dln2_beta = layernorm_backward_rows(dm, c_ln2)    # (n, D)
        dh = add_rows(dh, dm)                                             # (n, D)
        # forward: h = h + attn(ln1(h))
        da, dw_qkv, db_qkv, dw_o, db_o = mha_backward_fast(dh, c_att)     # (n, D)
        da, dln1_gamma, dln1_beta = layernorm_backward_rows(da, c_ln1)    # (n, D)
        dh = add_rows(dh, da)                                             # (n, D)
        # in the order computed above: clip_grad_norm sums grads.values() in dict order, and
        # that order is part of the float rounding tests/test_reference.py pins
        key = dict(zip(BLOCK_PARAMS, block_keys(i)))                      # "ln1.gamma" -> full key
        grads.update({key["mlp.w_out"]: dw_out, key["mlp.b_out"]: db_out,
                      key["mlp.w_in"]: dw_in, key["mlp.b_in"]: db_in,
                      key["ln2.gamma"]: dln2_gamma, key["ln2.beta"]: dln2_beta,
                      key["attn.w_qkv"]: dw_qkv, key["attn.b_qkv"]: db_qkv,
                      key["attn.w_o"]: dw_o, key["attn.b_o"]: db_o,
                      key["ln1.gamma"]: dln1_gamma, key["ln1.beta"]: dln1_beta})
    # forward: h = tok_emb[tokens] + pos_emb[positions]
    dtok_emb, dpos_emb = embedding_backward_rows(dh, c_emb)               # (V, D), (T_max, D)
    grads["pos_emb"], grads["tok_emb"] = dpos_emb, dtok_emb               # the pinned dict order
    return grads


def lm_head_forward(hf, tok_emb):
    """Next-token logits with the output matrix tied to the token embedding (Press & Wolf 2017):
    logits = hf @ tok_emb^T, no bias, so the head adds no parameters.
    hf: (n, D) final hidden states at the positions that have a target; tok_emb: (V, D).
    Returns logits (n, V) and a cache."""
    logits = matmul_rows(hf, tok_emb.T)                                   # (n, V) row blocks
    return logits, (hf, tok_emb)


def lm_head_backward(dlogits, cache):
    """dlogits: (n, V) -> dhf (n, D), dtok_emb (V, D) (to be added to the embedding's own)."""
    hf, tok_emb = cache
    dhf = matmul_rows(dlogits, tok_emb)                                   # (n, D) row blocks
    dtok_emb = matmul_tn_rows(dlogits, hf)                                # (V, D) sum over rows
    return dhf, dtok_emb
