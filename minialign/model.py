"""The text encoder: token + position embeddings -> L pre-LN transformer blocks -> final
LayerNorm -> mean over each caption's real tokens -> one D-dim caption embedding z.

encode and encode_backward are written once, in the calls of a layer set: minialign/layers.py,
the readable reference, or machinery/fast.py, the same names over packed rows (ModelConfig.layers,
`--layers`; layer_set is the one switch). Parameters and gradients are two flat dicts:
    tok_emb (V, D), pos_emb (T_max, D),
    blocks.{i}.ln1.gamma/beta (D,), .attn.w_qkv (D, 3D), .attn.b_qkv (3D,), .attn.w_o (D, D),
    .attn.b_o (D,), .ln2.gamma/beta (D,), .mlp.w_in (D, F), .mlp.b_in (F,), .mlp.w_out (F, D),
    .mlp.b_out (D,), ln_f.gamma/beta (D,).
Names: h is the residual stream, hf = ln_f(h) the final hidden states, z their pooled mean.
"""
from dataclasses import dataclass

import numpy as np

from . import layers
from .tokenizer import PAD
try:
    from .machinery import fast          # absent from a student copy: it trains layers.py
except ImportError:
    fast = None

INIT_STD = 0.02  # N(0, 0.02^2) for every weight matrix and embedding (GPT-2)
BLOCK_PARAMS = ("ln1.gamma", "ln1.beta", "attn.w_qkv", "attn.b_qkv", "attn.w_o", "attn.b_o",
                "ln2.gamma", "ln2.beta", "mlp.w_in", "mlp.b_in", "mlp.w_out", "mlp.b_out")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the text encoder, its layer set and arithmetic. Defaults: the replication's."""
    vocab_size: int = 6000      # V, set from the tokenizer
    max_len: int = 64           # T_max: learned positions; captions are cut to this
    d_model: int = 256          # D
    n_layers: int = 4           # L
    n_heads: int = 4            # H (D must divide by H)
    mlp_ratio: int = 4          # F = mlp_ratio * D
    layers: str = "fast" if fast else "reference"   # "fast" (machinery/fast.py) | "reference"
    dtype: str = "float32"      # of every weight and so every activation; or "float64"

    def __post_init__(self):
        assert self.layers in ("fast", "reference") and self.dtype in ("float32", "float64")
        if self.layers == "fast" and fast is None:
            raise ValueError("a student copy has no fast path: train it with --layers reference")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")


def layer_set(cfg):
    """The one switch: minialign/layers.py ("reference") or machinery/fast.py ("fast")."""
    return fast if cfg.layers == "fast" else layers


def init_params(cfg, rng):
    """Fresh weights of cfg.dtype: N(0, INIT_STD^2) matrices and embeddings, the two
    projections into the residual stream (attn.w_o, mlp.w_out) scaled by 1/sqrt(2L) as in
    GPT-2; zero biases, LayerNorm gains 1, shifts 0. rng: numpy Generator."""
    D, F, L = cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.n_layers
    dtype = np.dtype(cfg.dtype)
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
    """["blocks.{i}.ln1.gamma", ...] in BLOCK_PARAMS order."""
    return [f"blocks.{i}.{name}" for name in BLOCK_PARAMS]


def encode(params, tokens, cfg, causal=False):
    """Caption embeddings of token ids through cfg's layer set. tokens: (B, T) int, PAD after
    each caption; causal: a token reads only itself and earlier tokens. The per-token layers
    run on the n real tokens only, the rows of an (n, D) array (token_rows).
    Returns z (B, D), the mean of hf over each caption's real tokens; hf (n, D), the final
    hidden states in the order of tokens[tokens != PAD]; a cache for encode_backward."""
    ops = layer_set(cfg)                                                  # layers.py or fast.py
    B, T = tokens.shape
    assert T <= cfg.max_len, f"sequence length {T} > max_len {cfg.max_len}"
    rows = ops.token_rows(tokens != PAD, causal, params["tok_emb"].dtype) # n real tokens
    x, c_tok = ops.embedding_forward(tokens.ravel()[rows.flat], params["tok_emb"])  # (n, D)
    p, c_pos = ops.embedding_forward(rows.pos, params["pos_emb"])         # (n, D) positions
    h = x + p                                                             # (n, D) residual stream
    blocks = []
    for i in range(cfg.n_layers):
        (ln1_gamma, ln1_beta, w_qkv, b_qkv, w_o, b_o,
         ln2_gamma, ln2_beta, w_in, b_in, w_out, b_out) = (params[k] for k in block_keys(i))
        a, c_ln1 = ops.layernorm_forward(h, ln1_gamma, ln1_beta)          # (n, D)
        a, c_att = ops.attention_forward(a, w_qkv, b_qkv, w_o, b_o, rows, cfg.n_heads)  # (n, D)
        h = h + a                                                         # (n, D) residual
        m, c_ln2 = ops.layernorm_forward(h, ln2_gamma, ln2_beta)          # (n, D)
        m, c_in = ops.linear_forward(m, w_in, b_in)                       # (n, F)
        m, c_gelu = ops.gelu_forward(m)                                   # (n, F)
        m, c_out = ops.linear_forward(m, w_out, b_out)                    # (n, D)
        h = h + m                                                         # (n, D) residual
        blocks.append((c_ln1, c_att, c_ln2, c_in, c_gelu, c_out))
    hf, c_lnf = ops.layernorm_forward(h, params["ln_f.gamma"], params["ln_f.beta"])  # (n, D)
    z, c_pool = ops.pool_forward(hf, rows)                                # (B, D)
    # hf in the order of tokens[tokens != PAD], the order next-token targets use
    return z, hf[rows.caption_rows], (ops, rows, c_tok, c_pos, blocks, c_lnf, c_pool)


def encode_backward(dz, dhf, cache):
    """Undo `encode` call for call, in reverse; each comment quotes the line it undoes.
    dz: (B, D) gradient w.r.t. z; dhf: (n, D) w.r.t. hf, or None when the loss reads only z.
    Two views in one 2B batch sum their gradients in the shared weights.
    Returns {name: gradient} with the keys of params."""
    ops, rows, c_tok, c_pos, blocks, c_lnf, c_pool = cache
    grads = {}
    dhf_rows = ops.pool_backward(dz, c_pool)                              # z = pool(hf)
    if dhf is not None:                                                   # hf fed pool and head:
        dhf_rows[rows.caption_rows] += dhf                                # hf[rows.caption_rows]
    dh, grads["ln_f.gamma"], grads["ln_f.beta"] = ops.layernorm_backward(dhf_rows, c_lnf)  # ln_f(h)
    for i in reversed(range(len(blocks))):
        c_ln1, c_att, c_ln2, c_in, c_gelu, c_out = blocks[i]
        g = {}                                                            # block i's gradients
        dm, g["mlp.w_out"], g["mlp.b_out"] = ops.linear_backward(dh, c_out)  # m = linear(m, w_out)
        dm = ops.gelu_backward(dm, c_gelu)                                # m = gelu(m)
        dm, g["mlp.w_in"], g["mlp.b_in"] = ops.linear_backward(dm, c_in)  # m = linear(m, w_in)
        dm, g["ln2.gamma"], g["ln2.beta"] = ops.layernorm_backward(dm, c_ln2)  # m = ln2(h)
        dh = dh + dm                                                      # h = h + m: dh to both
        da, g["attn.w_qkv"], g["attn.b_qkv"], g["attn.w_o"], g["attn.b_o"] = \
            ops.attention_backward(dh, c_att)                             # a = attention(a)
        da, g["ln1.gamma"], g["ln1.beta"] = ops.layernorm_backward(da, c_ln1)  # a = ln1(h)
        dh = dh + da                                                      # h = h + a: dh to both
        grads.update({f"blocks.{i}.{name}": d for name, d in g.items()})
    # h = x + p: dh reaches both embeddings
    grads["pos_emb"] = ops.embedding_backward(dh, c_pos)                  # p = pos_emb[positions]
    grads["tok_emb"] = ops.embedding_backward(dh, c_tok)                  # x = tok_emb[tokens]
    return grads

