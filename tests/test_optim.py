"""AdamW, clipping and the schedule against updates worked out by hand."""
import math

import numpy as np
import pytest

from minialign.optim import adam_init, adam_step, clip_grad_norm, decays, lr_at


def test_adamw_two_steps_by_hand():
    params = {"blocks.0.attn.w_o": np.array([1.0, -2.0]), "ln_f.beta": np.array([0.5])}
    state = adam_init(params)
    lr, wd, b1, b2, eps = 0.1, 0.5, 0.9, 0.999, 1e-8
    g1 = {"blocks.0.attn.w_o": np.array([0.5, -1.0]), "ln_f.beta": np.array([2.0])}
    g2 = {"blocks.0.attn.w_o": np.array([-0.5, 2.0]), "ln_f.beta": np.array([0.0])}
    adam_step(params, g1, state, lr, weight_decay=wd)
    adam_step(params, g2, state, lr, weight_decay=wd)

    def by_hand(p, ga, gb, decay):
        m1, v1 = 0.1 * ga, 0.001 * ga ** 2
        p = p * (1 - lr * wd if decay else 1.0)
        p = p - lr * (m1 / 0.1) / (math.sqrt(v1 / 0.001) + eps)
        m2, v2 = 0.9 * m1 + 0.1 * gb, 0.999 * v1 + 0.001 * gb ** 2
        p = p * (1 - lr * wd if decay else 1.0)
        return p - lr * (m2 / (1 - 0.9 ** 2)) / (math.sqrt(v2 / (1 - 0.999 ** 2)) + eps)

    # first weight, spelled out: step 1 decays 1 -> 0.95 and moves by lr * g / |g| to 0.85;
    # step 2: m = 0.9 * 0.05 + 0.1 * (-0.5) = -0.005, v = 0.999 * 0.00025 + 0.001 * 0.25
    expected = [by_hand(1.0, 0.5, -0.5, True), by_hand(-2.0, -1.0, 2.0, True)]
    np.testing.assert_allclose(params["blocks.0.attn.w_o"], expected, rtol=1e-12)
    np.testing.assert_allclose(params["ln_f.beta"], [by_hand(0.5, 2.0, 0.0, False)], rtol=1e-12)
    assert expected[0] == pytest.approx((0.95 - 0.1 * 0.5 / (0.5 + eps)) * 0.95 + 0.1 * (0.005 / 0.19) / (math.sqrt(
        0.00049975 / (1 - 0.999 ** 2)) + eps), rel=1e-12)
    assert state["t"] == 2


def test_decay_only_weight_matrices():
    assert decays("blocks.3.mlp.w_in") and decays("blocks.0.attn.w_qkv")
    assert not decays("blocks.0.mlp.b_in") and not decays("blocks.0.ln1.gamma")
    assert not decays("tok_emb") and decays("tok_emb", decay_embeddings=True)


def test_clip_grad_norm():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([4.0])}
    assert clip_grad_norm(grads, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(grads["a"], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(grads["b"], [0.8], rtol=1e-6)
    grads = {"a": np.array([0.3, 0.4])}
    assert clip_grad_norm(grads, 1.0) == pytest.approx(0.5)
    np.testing.assert_array_equal(grads["a"], [0.3, 0.4])   # under the limit: untouched


def test_warmup_then_cosine():
    assert lr_at(0, 1.0, 10, 110) == pytest.approx(0.1)
    assert lr_at(9, 1.0, 10, 110) == pytest.approx(1.0)
    assert lr_at(10, 1.0, 10, 110) == pytest.approx(1.0)
    assert lr_at(60, 1.0, 10, 110) == pytest.approx(0.5)
    assert lr_at(110, 1.0, 10, 110) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(110, 1.0, 10, 110, min_lr_ratio=0.1) == pytest.approx(0.1)
