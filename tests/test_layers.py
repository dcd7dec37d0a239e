"""Every layer's backward against central finite differences, in float64, every element."""
import numpy as np
import pytest
from gradcheck import numerical_grad, rel_err

from minialign.layers import (attention_bias, attention_groups, embedding_backward, embedding_forward,
                              gelu_backward, gelu_forward, layernorm_backward, layernorm_forward,
                              linear_backward, linear_forward, mean_pool_backward,
                              mean_pool_forward, mha_backward, mha_forward, pack,
                              softmax_attention_backward, softmax_attention_forward, unpack)

TOL = 1e-7


def check(loss, analytic, wrt, names):
    for name, a, x in zip(names, analytic, wrt):
        err = rel_err(a, numerical_grad(loss, x))
        assert err < TOL, f"d{name}: relative error {err:.1e}"


def test_linear_backward():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    dy = rng.standard_normal((2, 3, 5))
    loss = lambda: np.sum(linear_forward(x, w, b)[0] * dy)
    check(loss, linear_backward(dy, linear_forward(x, w, b)[1]), (x, w, b), "xwb")


def test_layernorm_backward():
    rng = np.random.default_rng(1)
    x, gamma, beta = rng.standard_normal((2, 3, 5)), rng.standard_normal(5), rng.standard_normal(5)
    dy = rng.standard_normal((2, 3, 5))
    loss = lambda: np.sum(layernorm_forward(x, gamma, beta)[0] * dy)
    check(loss, layernorm_backward(dy, layernorm_forward(x, gamma, beta)[1]),
          (x, gamma, beta), ("x", "gamma", "beta"))


def test_layernorm_forward_values():
    y, _ = layernorm_forward(np.array([[1.0, 2.0, 3.0]]), np.ones(3), np.zeros(3), eps=0.0)
    np.testing.assert_allclose(y, [[-np.sqrt(1.5), 0.0, np.sqrt(1.5)]], rtol=1e-12)


def test_gelu_backward_and_values():
    rng = np.random.default_rng(2)
    x, dy = 2 * rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    loss = lambda: np.sum(gelu_forward(x)[0] * dy)
    check(loss, (gelu_backward(dy, gelu_forward(x)[1]),), (x,), "x")
    # the tanh form at x = 1: 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.841192...
    np.testing.assert_allclose(gelu_forward(np.array([1.0, 0.0, -1.0]))[0],
                               [0.8411919906, 0.0, -0.1588080094], atol=1e-9)


def test_embedding_backward_repeated_ids():
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((6, 4))
    ids = np.array([1, 2, 1, 5, 1, 0])                    # id 1 read three times
    dy = rng.standard_normal((6, 4))
    loss = lambda: np.sum(embedding_forward(ids, weight)[0] * dy)
    check(loss, (embedding_backward(dy, embedding_forward(ids, weight)[1]),), (weight,), ["w"])


def test_mean_pool_values_and_backward():
    rng = np.random.default_rng(4)
    h = rng.standard_normal((6, 2))                       # rows of sequences 0, 0, 1, 1, 1, 1
    seq = np.array([0, 0, 1, 1, 1, 1])
    z, cache = mean_pool_forward(h, seq, 3)               # sequence 2 has no real token
    np.testing.assert_allclose(z[0], h[:2].mean(axis=0))
    np.testing.assert_allclose(z[1], h[2:].mean(axis=0))
    np.testing.assert_array_equal(z[2], 0.0)               # pools to 0, not NaN
    dz = rng.standard_normal((3, 2))
    loss = lambda: np.sum(mean_pool_forward(h, seq, 3)[0] * dz)
    check(loss, (mean_pool_backward(dz, cache),), (h,), "h")


def test_pack_unpack_round_trip():
    mask = np.array([[1, 1, 0], [1, 0, 0]], dtype=bool)
    real = np.flatnonzero(mask)
    x = np.arange(6.0).reshape(3, 2)
    grid = unpack(x, real, 2, 3)
    np.testing.assert_array_equal(grid, [[[0, 1], [2, 3], [0, 0]], [[4, 5], [0, 0], [0, 0]]])
    np.testing.assert_array_equal(pack(grid, real), x)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_attention_backward_with_padding(causal):
    rng = np.random.default_rng(5)
    B, H, T, Dh = 3, 2, 5, 3
    q, k, v = (rng.standard_normal((B, H, T, Dh)) for _ in range(3))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=bool)
    bias = attention_bias(mask, causal, np.float64)
    dy = rng.standard_normal((B, H, T, Dh))
    y, cache = softmax_attention_forward(q, k, v, bias)
    assert np.isfinite(y).all()
    np.testing.assert_array_equal(y[2], 0.0)               # fully padded row: zeros, never NaN
    loss = lambda: np.sum(softmax_attention_forward(q, k, v, bias)[0] * dy)
    check(loss, softmax_attention_backward(dy, cache), (q, k, v), "qkv")


def test_attention_reads_only_allowed_keys():
    """Changing a padded key, or (causal) a later key, leaves earlier outputs unchanged."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 1, 4, 2)) for _ in range(3))
    mask = np.array([[1, 1, 1, 0]], dtype=bool)
    y, _ = softmax_attention_forward(q, k, v, attention_bias(mask, True, np.float64))
    k2, v2 = k.copy(), v.copy()
    k2[..., 2:, :] += 5.0
    v2[..., 2:, :] += 5.0
    y2, _ = softmax_attention_forward(q, k2, v2, attention_bias(mask, True, np.float64))
    np.testing.assert_allclose(y2[..., :2, :], y[..., :2, :], rtol=1e-12)
    # first query under the causal mask reads only key 0: y = v[0]
    np.testing.assert_allclose(y[0, 0, 0], v[0, 0, 0], rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group_size", [2, 64])
def test_mha_backward(causal, group_size):
    """Against finite differences, with the batch in one attention grid or split in several."""
    rng = np.random.default_rng(7)
    B, T, D, H = 4, 4, 6, 2
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=bool)
    n = int(mask.sum())
    x = rng.standard_normal((n, D))                        # 10 packed real tokens
    w_qkv, b_qkv = rng.standard_normal((D, 3 * D)) / 2, rng.standard_normal(3 * D)
    w_o, b_o = rng.standard_normal((D, D)) / 2, rng.standard_normal(D)
    groups = attention_groups(mask, causal, np.float64, group_size)
    assert len(groups) == -(-B // group_size)
    assert sorted(np.concatenate([g[0] for g in groups]).tolist()) == list(range(n))
    dy = rng.standard_normal((n, D))
    fwd = lambda: mha_forward(x, w_qkv, b_qkv, w_o, b_o, groups, H)
    loss = lambda: np.sum(fwd()[0] * dy)
    check(loss, mha_backward(dy, fwd()[1]), (x, w_qkv, b_qkv, w_o, b_o),
          ("x", "w_qkv", "b_qkv", "w_o", "b_o"))


def test_attention_groups_do_not_change_the_output():
    """Grids of 1, 2 or all captions give the same attention output: only padding differs."""
    rng = np.random.default_rng(9)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], bool)
    x = rng.standard_normal((int(mask.sum()), 8))
    w_qkv, w_o = rng.standard_normal((8, 24)), rng.standard_normal((8, 8))
    b_qkv, b_o = rng.standard_normal(24), rng.standard_normal(8)
    for causal in (False, True):
        ys = [mha_forward(x, w_qkv, b_qkv, w_o, b_o, attention_groups(mask, causal, np.float64, g),
                          2)[0] for g in (1, 2, 4)]
        np.testing.assert_allclose(ys[0], ys[2], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ys[1], ys[2], rtol=1e-12, atol=1e-12)
    # the grid of the two shortest captions is trimmed to their longest: 2 tokens
    rows, real, Bg, Tg, bias = attention_groups(mask, False, np.float64, 2)[0]
    assert (Bg, Tg) == (2, 2) and rows.tolist() == [10, 5, 6] and real.tolist() == [0, 2, 3]


def test_layers_keep_float32():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    g, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    assert layernorm_forward(x, g, b)[0].dtype == np.float32
    assert gelu_forward(x)[0].dtype == np.float32
    groups = attention_groups(np.ones((2, 3), bool), True, np.float32)
    w_qkv, w_o = np.ones((4, 12), np.float32), np.ones((4, 4), np.float32)
    y, _ = mha_forward(x.reshape(6, 4), w_qkv, np.zeros(12, np.float32), w_o, b, groups, 2)
    assert y.dtype == np.float32
