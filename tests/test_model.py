"""The encoder (minialign/model.py): shapes, parameter names, what a caption's embedding may and
may not depend on, and encode_backward against central differences on a 1-block D = 8 model."""
import numpy as np
import pytest
from gradcheck import numerical_grad, rel_err

from minialign.model import (BLOCK_PARAMS, ModelConfig, block_keys, encode, encode_backward,
                             init_params)
from minialign.tokenizer import PAD

ONE_BLOCK = ModelConfig(vocab_size=20, max_len=8, d_model=8, n_layers=1, n_heads=2, mlp_ratio=2)
LENGTHS = (6, 3, 8, 1, 4)                                  # ragged; caption 3 is one token


def ragged_tokens(rng, lengths=LENGTHS, T=8):
    """(B, T) word ids in [5, 20), PAD after each caption's length."""
    tokens = rng.integers(5, 20, size=(len(lengths), T)).astype(np.int32)   # (B, T)
    tokens[np.arange(T)[None, :] >= np.array(lengths)[:, None]] = PAD
    return tokens


def float64_params(cfg, rng):
    """float64 weights with gains, shifts and biases moved off 1 / 0, so none is trivially exact."""
    params = init_params(cfg, rng, dtype=np.float64)
    for k in params:
        params[k] += 0.1 * rng.standard_normal(params[k].shape)
    return params


def test_encode_shapes_and_dtype():
    cfg = ModelConfig(vocab_size=20, max_len=8, d_model=16, n_layers=2, n_heads=4)
    params = init_params(cfg, np.random.default_rng(0))          # float32, as in training
    tokens = ragged_tokens(np.random.default_rng(1))
    z, hf, cache = encode(params, tokens, cfg)
    assert z.shape == (5, 16) and hf.shape == (sum(LENGTHS), 16)
    assert z.dtype == hf.dtype == np.float32
    grads = encode_backward(np.ones_like(z), None, cache)
    assert sorted(grads) == sorted(params)
    assert all(grads[k].shape == params[k].shape and grads[k].dtype == np.float32 for k in params)


def test_block_params_name_every_parameter():
    params = init_params(ModelConfig(vocab_size=20, n_layers=3), np.random.default_rng(0))
    blocks = [k for i in range(3) for k in block_keys(i)]
    assert sorted(params) == sorted(blocks + ["tok_emb", "pos_emb", "ln_f.gamma", "ln_f.beta"])
    assert block_keys(2)[0] == "blocks.2." + BLOCK_PARAMS[0]


@pytest.mark.parametrize("causal", [False, True])
def test_z_ignores_padding_and_the_other_captions(causal):
    """Each caption encoded alone, unpadded, gets the z it gets in a ragged, padded batch."""
    rng = np.random.default_rng(2)
    params, tokens = float64_params(ONE_BLOCK, rng), ragged_tokens(rng)
    z, _, _ = encode(params, tokens, ONE_BLOCK, causal)
    for b, length in enumerate(LENGTHS):
        z_alone, _, _ = encode(params, tokens[b:b + 1, :length], ONE_BLOCK, causal)
        np.testing.assert_allclose(z_alone[0], z[b], rtol=1e-10, atol=1e-12)


def test_causal_hidden_state_ignores_later_tokens():
    """Causal: the final hidden state at position t is that of the caption cut after t."""
    rng = np.random.default_rng(3)
    params, tokens = float64_params(ONE_BLOCK, rng), ragged_tokens(rng)[:1]   # one caption of 6
    _, hf, _ = encode(params, tokens, ONE_BLOCK, causal=True)                  # (6, D)
    for t in range(LENGTHS[0]):
        _, hf_cut, _ = encode(params, tokens[:, :t + 1], ONE_BLOCK, causal=True)  # (t+1, D)
        np.testing.assert_allclose(hf_cut[t], hf[t], rtol=1e-10, atol=1e-12)
    _, hf_full, _ = encode(params, tokens, ONE_BLOCK, causal=False)
    assert not np.allclose(hf_full[0], hf[0])                   # bidirectional reads ahead


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_dhf", [False, True])
def test_encode_backward_against_finite_differences(causal, with_dhf):
    """Every parameter's gradient of sum(z * dz) (+ sum(hf * dhf), as the next-token head adds)."""
    rng = np.random.default_rng(4)
    params, tokens = float64_params(ONE_BLOCK, rng), ragged_tokens(rng)
    dz = rng.standard_normal((len(LENGTHS), ONE_BLOCK.d_model))
    dhf = rng.standard_normal((sum(LENGTHS), ONE_BLOCK.d_model)) if with_dhf else None

    def loss():
        z, hf, _ = encode(params, tokens, ONE_BLOCK, causal)
        return np.sum(z * dz) + (np.sum(hf * dhf) if with_dhf else 0.0)

    grads = encode_backward(dz, dhf, encode(params, tokens, ONE_BLOCK, causal)[2])
    assert sorted(grads) == sorted(params)
    for k in sorted(params):
        err = rel_err(grads[k], numerical_grad(loss, params[k]))
        assert err < 1e-7, f"d{k}: relative error {err:.1e}"


def test_grads_keep_the_order_backward_computes_them():
    """clip_grad_norm sums grads.values() in dict order: the order is part of the rounding."""
    params = init_params(ONE_BLOCK, np.random.default_rng(5))
    z, _, cache = encode(params, ragged_tokens(np.random.default_rng(6)), ONE_BLOCK)
    order = list(encode_backward(np.ones_like(z), None, cache))
    assert order == ["ln_f.gamma", "ln_f.beta"] + [f"blocks.0.{name}" for name in (
        "mlp.w_out", "mlp.b_out", "mlp.w_in", "mlp.b_in", "ln2.gamma", "ln2.beta",
        "attn.w_qkv", "attn.b_qkv", "attn.w_o", "attn.b_o", "ln1.gamma", "ln1.beta")] + [
        "pos_emb", "tok_emb"]
