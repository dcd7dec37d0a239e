"""The reference layers (layers.py) and the encoder in them (model.py): every backward against
central differences on ragged batches (one-token and empty captions, causal or not), dtype kept
(test_exercises.check_layer); forwards by hand or against a loop."""
import dataclasses
import math

import numpy as np
import pytest
from test_exercises import attention_weights, check_layer
from test_objectives import TINY as ONE_BLOCK, check_gradients, tiny_params

from minialign import layers as L
from minialign.model import ModelConfig, encode, encode_backward, init_params, param_count
from minialign.tokenizer import PAD

MASK = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], bool)  # 3, 1, 4, 2
RAGGED = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)  # one empty


def attention_on_rows(x, w_qkv, b_qkv, w_o, b_o, causal):
    """attention_forward on RAGGED's rows (its bias in x's dtype), 2 heads."""
    return L.attention_forward(x, w_qkv, b_qkv, w_o, b_o, L.token_rows(RAGGED, causal, x.dtype), 2)


def test_embedding_head_attention_and_pool_backward():
    """The embedding, the tied head, and on ragged captions (a one-token and an empty one)
    attention_forward (rows -> (B, T, D) grid -> rows, causal and not) and pool_forward.
    linear, layernorm, gelu and mha: tests/test_exercises.py, exercises 1, 4, 2 and 5."""
    rng = np.random.default_rng(0)
    n = int(RAGGED.sum())
    check_layer(L.embedding_forward, L.embedding_backward, dict(
        ids=np.array([1, 2, 1, 5, 1, 0]), weight=rng.standard_normal((6, 4))), rng)
    check_layer(L.lm_head_forward, L.lm_head_backward, dict(
        hf=rng.standard_normal((5, 4)), tok_emb=rng.standard_normal((7, 4))), rng)
    check_layer(L.pool_forward, L.pool_backward, dict(
        h=rng.standard_normal((n, 3)), rows=L.token_rows(RAGGED, False, np.float64)), rng)
    for causal in (False, True):
        check_layer(attention_on_rows, L.attention_backward, dict(
            x=rng.standard_normal((n, 4)), **attention_weights(rng, 4), causal=causal), rng)


def test_layernorm_and_gelu_values_by_hand():
    x = np.array([[1.0, 2.0, 6.0], [-3.0, -3.0, 0.0]])    # means 3, -2; biased variances 14/3, 2
    gamma, beta = np.array([1.0, 2.0, -1.0]), np.array([0.5, 0.0, 1.0])
    y, _ = L.layernorm_forward(x, gamma, beta)
    xhat = np.array([[-2, -1, 3], [-1, -1, 2]]) / np.sqrt([[14 / 3 + 1e-5], [2 + 1e-5]])
    np.testing.assert_allclose(y, xhat * gamma + beta, rtol=1e-13)
    # the tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    np.testing.assert_allclose(L.gelu_forward(np.array([1.0, 0.0, -1.0, -3.0]))[0],
                               [0.8411919906, 0.0, -0.1588080094, -0.0036373920], atol=1e-9)


def loop_attention(x, w_qkv, b_qkv, w_o, b_o, mask, causal, H):
    """Self-attention one query at a time, over the keys it may read."""
    B, T, D = x.shape
    Dh, out = D // H, np.zeros_like(x)
    for b in range(B):
        qkv = x[b] @ w_qkv + b_qkv
        for t in np.flatnonzero(mask[b]):
            keys = [s for s in np.flatnonzero(mask[b]) if not causal or s <= t]
            heads = []
            for h in range(H):
                q, k, v = (qkv[:, j * D + h * Dh:j * D + (h + 1) * Dh] for j in range(3))
                scores = np.array([q[t] @ k[s] for s in keys]) / math.sqrt(Dh)
                p = np.exp(scores - scores.max())
                heads.append((p / p.sum()) @ v[keys])
            out[b, t] = np.concatenate(heads) @ w_o + b_o
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_mha_and_attention_on_rows_against_a_loop_with_scores_far_apart(causal):
    """On the (B, T, D) grid and on the rows of real tokens. Caption 2's scores are in the
    thousands, the others' near 0: a softmax shifted by the batch's max instead of each row's
    underflows them all to 0 / 0."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 4, 6)) * np.array([1, 0.5, 30, 1])[:, None, None]
    w = attention_weights(rng, 6)
    expected = loop_attention(x, *w.values(), MASK, causal, 2)[MASK]
    grid, _ = L.mha_forward(x, *w.values(), L.attention_bias(MASK, causal, np.float64), 2)
    y, _ = L.attention_forward(x[MASK], *w.values(), L.token_rows(MASK, causal, np.float64), 2)
    np.testing.assert_allclose(grid[MASK], expected, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(y, expected, rtol=1e-11, atol=1e-11)


LENGTHS = (6, 2, 8, 1, 4)               # ragged; a 2-token (BOS, EOS) and a 1-token caption


def ragged_tokens(rng, lengths=LENGTHS, T=8):
    tokens = rng.integers(1, 20, size=(len(lengths), T)).astype(np.int32)   # specials too
    tokens[np.arange(T) >= np.array(lengths)[:, None]] = PAD
    return tokens


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_dhf", [False, True])
def test_encode_backward_against_finite_differences(causal, with_dhf):
    """Every parameter's gradient of sum(z * dz) (+ sum(hf * dhf), as the next-token head adds)."""
    rng = np.random.default_rng(6)
    tokens = ragged_tokens(rng)
    dz = rng.standard_normal((len(LENGTHS), 8))
    dhf = rng.standard_normal((sum(LENGTHS), 8)) if with_dhf else None

    def loss(params, batch, cfg, rng):                          # as an objective returns it
        z, hf, cache = encode(params, tokens, ONE_BLOCK, causal)
        value = np.sum(z * dz) + (np.sum(hf * dhf) if with_dhf else 0.0)
        return value, encode_backward(dz, dhf, cache), {}
    check_gradients(loss, None, tiny_params(ONE_BLOCK, 6), None, tol=1e-7)


@pytest.mark.parametrize("causal", [False, True])
def test_a_caption_is_encoded_alone_whatever_its_batch_and_padding(causal):
    rng = np.random.default_rng(7)
    params, tokens = tiny_params(ONE_BLOCK, 7), ragged_tokens(rng)
    z, hf, _ = encode(params, tokens, ONE_BLOCK, causal)
    for b, length in enumerate(LENGTHS):
        z_alone, hf_alone, _ = encode(params, tokens[b:b + 1, :length], ONE_BLOCK, causal)
        np.testing.assert_allclose(z_alone[0], z[b], rtol=1e-10, atol=1e-12)
        start = sum(LENGTHS[:b])
        np.testing.assert_allclose(hf_alone, hf[start:start + length], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(z[b], hf[start:start + length].mean(axis=0), rtol=1e-12)
    # causal: the state at position t is that of the caption cut after t
    for t in range(LENGTHS[0]):
        _, hf_cut, _ = encode(params, tokens[:1, :t + 1], ONE_BLOCK, causal)
        assert np.allclose(hf_cut[t], hf[t], rtol=1e-10, atol=1e-12) == (causal or t == 5)


def test_encode_without_blocks_by_hand():
    """No block: z is the mean over a caption's tokens of LayerNorm(tok_emb[token] + pos_emb[t]),
    t = 0, 1, ... its position."""
    rng = np.random.default_rng(8)
    params, tokens = tiny_params(ONE_BLOCK, 8), ragged_tokens(rng)   # blocks unread
    z, _, _ = encode(params, tokens, dataclasses.replace(ONE_BLOCK, n_layers=0))
    for b, n in enumerate(LENGTHS):
        h = params["tok_emb"][tokens[b, :n]] + params["pos_emb"][:n]
        hf = (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(z[b], (hf * params["ln_f.gamma"] + params["ln_f.beta"]).mean(0),
                                   rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_encode_keeps_the_configs_dtype(dtype):
    cfg = ModelConfig(vocab_size=20, max_len=8, d_model=8, n_layers=2, n_heads=2,
                      layers="reference", dtype=dtype)
    params = init_params(cfg, np.random.default_rng(0))
    z, hf, cache = encode(params, ragged_tokens(np.random.default_rng(1)), cfg, causal=True)
    grads = encode_backward(np.ones_like(z), np.ones_like(hf), cache)
    assert {a.dtype for a in (z, hf, *params.values(), *grads.values())} == {np.dtype(dtype)}
    wide = init_params(ModelConfig(**{**cfg.__dict__, "dtype": "float64"}),
                       np.random.default_rng(0))
    assert all(np.array_equal(wide[k].astype(dtype), params[k]) for k in params)  # same draws


def test_default_encoder_size():
    """4 blocks of width 256: 3.16M parameters; the rest is V x D, T x D and the final LN."""
    params = init_params(ModelConfig(vocab_size=5814), np.random.default_rng(0))
    block = 256 * 768 + 768 + 256 * 256 + 256 + 256 * 1024 + 1024 + 1024 * 256 + 256 + 4 * 256
    assert param_count(params) == 5814 * 256 + 64 * 256 + 4 * block + 2 * 256
    # N(0, 0.02^2); the two projections into the residual stream / sqrt(2 L); biases 0, gains 1
    for name, std in [("tok_emb", 0.02), ("blocks.3.attn.w_qkv", 0.02), ("blocks.0.mlp.w_in", 0.02),
                      ("blocks.2.attn.w_o", 0.02 / 8**0.5), ("blocks.1.mlp.w_out", 0.02 / 8**0.5)]:
        assert abs(params[name].std() / std - 1) < 0.02, name
    assert not params["blocks.0.mlp.b_in"].any() and (params["ln_f.gamma"] == 1).all()
    assert param_count(init_params(ModelConfig(vocab_size=30522, layers="reference"),
                                   np.random.default_rng(0))) == 10_989_568   # WordPiece
