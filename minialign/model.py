"""The text encoder: token + position embeddings -> L pre-LN transformer blocks -> final
LayerNorm -> masked mean pool -> one D-dim caption embedding z.

encode and encode_backward are written once, in the calls of a layer set: minialign/layers.py,
the readable reference, or machinery/fastpath/fast.py, the fast path under the same names
(packed rows sorted by length, attention per group of one length, row blocks over the cores). The config
picks one (ModelConfig.layers, `--layers`), in one place: layer_set. The tied next-token head
is the set's lm_head_forward / lm_head_backward (objectives.next_token).

Parameters and gradients are two flat dicts with the same keys:
    tok_emb (V, D), pos_emb (T_max, D),
    blocks.{i}.ln1.gamma/beta (D,), blocks.{i}.attn.w_qkv (D, 3D), .b_qkv (3D,),
    blocks.{i}.attn.w_o (D, D), .b_o (D,), blocks.{i}.ln2.gamma/beta (D,),
    blocks.{i}.mlp.w_in (D, F), .b_in (F,), blocks.{i}.mlp.w_out (F, D), .b_out (D,),
    ln_f.gamma/beta (D,);
and with a projector (ModelConfig.projector_dim = P > 0; project below, the objectives' loss
reads its output, every metric the encoder's z):
    projector.w_in (D, P), .b_in (P,), projector.ln.gamma/beta (P,), .w_out (P, P), .b_out (P,).
BLOCK_PARAMS names a block's twelve, in the order init_params and encode use.
Names: h is the residual stream, hf = ln_f(h) the final hidden states, z their pooled mean.
"""
from dataclasses import dataclass

import numpy as np

from . import layers
from .machinery import fastpath
if fastpath.PRESENT:               # a student copy has no fast path (docs/course.md)
    from .machinery.fastpath import fast   # the fast set: layers.py's names over the fast path
from .tokenizer import PAD, SPECIALS

INIT_STD = 0.02  # N(0, 0.02^2) for every weight matrix and embedding (GPT-2, Radford et al. 2019)
MIN_MAX_LEN = 3  # the shortest max_len that holds BOS, one word and EOS (tokenizer.encode)
# one block's parameters; blocks.{i}.<name> in the dicts (block_keys)
BLOCK_PARAMS = ("ln1.gamma", "ln1.beta", "attn.w_qkv", "attn.b_qkv", "attn.w_o", "attn.b_o",
                "ln2.gamma", "ln2.beta", "mlp.w_in", "mlp.b_in", "mlp.w_out", "mlp.b_out")
PROJECTOR_PARAMS = ("projector.w_in", "projector.b_in", "projector.ln.gamma", "projector.ln.beta",
                    "projector.w_out", "projector.b_out")   # init_params' order
POOLS = ("mean", "last")   # ModelConfig.causal_pool: a causal caption's vector (encode)
DTYPES = ("float32", "float64")   # ModelConfig.dtype: the arithmetic the run trains in
LAYER_SETS = {"fast": fast, "reference": layers} if fastpath.PRESENT else {"reference": layers}
DEFAULT_LAYERS = "fast" if fastpath.PRESENT else "reference"  # ModelConfig.layers' default
STUDENT_COPY_LAYERS = ("layers=fast: a student copy has no fast path (docs/course.md, \"What the "
                       "student copy holds\"); it trains minialign/layers.py: --layers reference")
RANGES = {"> 0": lambda v: v > 0, ">= 0": lambda v: v >= 0,       # check_fields' number ranges
          "in [0, 1]": lambda v: 0 <= v <= 1, "in [0, 1)": lambda v: 0 <= v < 1}


def check_fields(config, integers=(), numbers=(), choices=()):
    """The range checks of a config dataclass (ModelConfig, objectives.ObjectiveConfig,
    train.TrainConfig; the ranges the command line's flags.py types enforce): integers
    {field: lowest}, an int (not a bool) >= lowest; numbers {field: a RANGES key}, a finite
    int or float in that range; choices {field: allowed words}.
    Raises ValueError, one line naming the class, the field and its range."""
    where = type(config).__name__
    for name, allowed in dict(choices).items():
        value = getattr(config, name)
        if value not in allowed:
            raise ValueError(f"{where}: {name}={value!r} must be one of {', '.join(allowed)}")
    for name, low in dict(integers).items():
        value = getattr(config, name)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"{where}: {name}={value!r} must be an integer >= {low}")
    for name, allowed in dict(numbers).items():
        value = getattr(config, name)
        if (not isinstance(value, (int, float, np.number)) or isinstance(value, bool)
                or not np.isfinite(value) or not RANGES[allowed](value)):
            raise ValueError(f"{where}: {name}={value!r} must be a number {allowed}")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the text encoder, and the layer set it runs on. Defaults: the replication's
    4-layer, width-256 encoder on the fast set."""
    vocab_size: int = 6000      # V, set from the tokenizer built on the training captions
    max_len: int = 64           # T_max: learned positions, captions are truncated to this
    d_model: int = 256          # D
    n_layers: int = 4           # L
    n_heads: int = 4            # H (D must divide by H)
    mlp_ratio: int = 4          # F = mlp_ratio * D
    layers: str = DEFAULT_LAYERS  # "fast" (machinery/fastpath/fast.py) | "reference" (layers.py)
    projector_dim: int = 0      # P: VICReg's expander after the encoder (project); 0: none
    causal_pool: str = "mean"   # causal (next_token) z: "mean" of the tokens | "last" token's hf
    dtype: str = "float32"      # the weights' and so every activation's dtype (init_params);
                                # "float64": results that do not depend on rounding (docs/protocol.md)

    def __post_init__(self):
        """Raises ValueError naming the field and its valid range."""
        if self.layers == "fast" and not fastpath.PRESENT:
            raise ValueError(STUDENT_COPY_LAYERS)
        check_fields(self, choices={"layers": ("fast", "reference"), "causal_pool": POOLS,
                                     "dtype": DTYPES},
                     integers={"vocab_size": len(SPECIALS), "max_len": MIN_MAX_LEN, "d_model": 1,
                               "n_layers": 1, "n_heads": 1, "mlp_ratio": 1, "projector_dim": 0})
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")


def layer_set(cfg):
    """The layer set the model runs (cfg: a ModelConfig): minialign/layers.py for
    cfg.layers = "reference", machinery/fastpath/fast.py for "fast". The one switch between them."""
    return LAYER_SETS[cfg.layers]


def init_params(cfg, rng, dtype=None):
    """Fresh weights, of cfg.dtype unless `dtype` is given: N(0, INIT_STD^2) matrices and embeddings, with the two projections that
    write into the residual stream (attn.w_o, mlp.w_out) scaled by 1/sqrt(2L) as in GPT-2;
    zero biases, LayerNorm gains 1 and shifts 0. rng: numpy Generator. Returns {name: array}.
    The projector's weights (projector_dim > 0) are drawn last, N(0, INIT_STD^2) both, so the
    encoder's are those of a run without it."""
    D, F, L = cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.n_layers
    dtype = np.dtype(cfg.dtype if dtype is None else dtype)
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
    if cfg.projector_dim:
        P = cfg.projector_dim
        projector = (normal(D, P), np.zeros(P, dtype), np.ones(P, dtype), np.zeros(P, dtype),
                     normal(P, P), np.zeros(P, dtype))
        params.update(zip(PROJECTOR_PARAMS, projector))
    return params


def param_count(params):
    """Total number of scalars in a parameter dict."""
    return int(sum(p.size for p in params.values()))


def block_keys(i):
    """The parameter names of block i, in BLOCK_PARAMS order: "blocks.{i}.ln1.gamma", ..."""
    return [f"blocks.{i}.{name}" for name in BLOCK_PARAMS]


def encode(params, tokens, cfg, causal=False):
    """Caption embeddings of a batch of token ids, through the layer set of cfg (layer_set).
    tokens: (B, T) int, PAD (0) after each caption's last token; T <= cfg.max_len.
    causal: each token reads only itself and earlier tokens (next-token training) instead of
    the whole caption. The per-token layers run on the n real tokens only, the rows of an
    (n, D) array (token_rows says where each token sits); attention reads them per caption.
    Returns z (B, D): the mean of hf over each caption's real tokens (causal with
    cfg.causal_pool = "last": the hf of its last real token, the one that has read all of
    it); hf (n, D): the final
    hidden states (the residual stream h after the final LayerNorm) of the real tokens, in
    the order of tokens[tokens != PAD]; and a cache for encode_backward."""
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
    last = causal and cfg.causal_pool == "last"                           # which pooling
    z, c_pool = (ops.last_pool_forward if last else ops.pool_forward)(hf, rows)  # (B, D)
    # hf in the order of tokens[tokens != PAD], the order next-token targets use
    return z, hf[rows.caption_rows], (ops, rows, c_tok, c_pos, blocks, c_lnf, (last, c_pool))


def encode_backward(dz, dhf, cache):
    """Undo `encode` call for call, in reverse, in the layer set encode ran (it is in cache);
    the comment beside each call quotes the forward line it undoes.
    dz: (B, D) gradient of the loss w.r.t. z; dhf: (n, D) w.r.t. the final hidden states hf,
    or None when the loss reads only z. When z holds two views of each caption (one encode
    call on a 2B batch), their gradients sum in the shared weights' entries of grads.
    Returns {name: gradient}, the keys of params, in the order computed: clip_grad_norm sums
    grads.values() in that order, part of the rounding tests/test_reference.py pins."""
    ops, rows, c_tok, c_pos, blocks, c_lnf, (last, c_pool) = cache
    grads = {}
    dhf_rows = (ops.last_pool_backward if last else ops.pool_backward)(dz, c_pool)  # z = pool(hf)
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


def project(params, z, cfg):
    """VICReg's projector ("expander", Bardes et al. 2022, sec. 4.2), our numpy-friendly variant:
        y = linear_out(gelu(layernorm(linear_in(z))))       (N, D) -> (N, P), P = projector_dim
    VICReg's is Linear-BatchNorm-ReLU-Linear-BatchNorm-ReLU-Linear, 8192 wide. LayerNorm stands
    for BatchNorm here (per row, so a caption's y never depends on the rest of the batch, and
    it is a layer of the set already) and GELU for ReLU (the encoder's own nonlinearity): the
    same role, normalise then bend, with the layers encode is made of. One hidden layer: the
    demo's encoder is one block deep. z: (N, D), both views stacked (per row, so stacking
    changes nothing). Returns y and a cache; without a projector (P = 0): z itself, None."""
    if not cfg.projector_dim:
        return z, None
    ops = layer_set(cfg)
    w_in, b_in, gamma, beta, w_out, b_out = (params[k] for k in PROJECTOR_PARAMS)
    u, c_in = ops.linear_forward(z, w_in, b_in)                           # (N, P)
    u, c_ln = ops.layernorm_forward(u, gamma, beta)                       # (N, P)
    u, c_gelu = ops.gelu_forward(u)                                       # (N, P)
    y, c_out = ops.linear_forward(u, w_out, b_out)                        # (N, P)
    return y, (ops, c_in, c_ln, c_gelu, c_out)


def project_backward(dy, cache):
    """Undo `project`: dy (N, P) -> dz (N, D) and {projector name: gradient}; without a
    projector (cache None): dy itself and {}."""
    if cache is None:
        return dy, {}
    ops, c_in, c_ln, c_gelu, c_out = cache
    g = {}
    du, g["projector.w_out"], g["projector.b_out"] = ops.linear_backward(dy, c_out)  # y = linear
    du = ops.gelu_backward(du, c_gelu)                                    # u = gelu(u)
    du, g["projector.ln.gamma"], g["projector.ln.beta"] = ops.layernorm_backward(du, c_ln)
    dz, g["projector.w_in"], g["projector.b_in"] = ops.linear_backward(du, c_in)  # u = linear(z)
    return dz, g
