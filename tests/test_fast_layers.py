"""The fast path (minialign/fast_layers.py) against the readable reference (minialign/layers.py):
the same outputs and gradients on ragged batches, plus its own gradient checks and edge cases."""
import numpy as np
import pytest
from gradcheck import check_layer, rel_err

from minialign.machinery.fast_layers import (AttentionGroup, attention_groups, gelu_backward_fast,
                                   gelu_forward_fast, mha_backward_fast, mha_forward_fast, pack,
                                   softmax_attention_backward, softmax_attention_forward, unpack)
from minialign.layers import attention_bias, gelu_backward, gelu_forward, mha_backward, mha_forward

# 6 captions of lengths 5, 2, 7, 1, 4, 7 in a T = 8 grid: ragged, every row padded but two
RAGGED = np.arange(8)[None, :] < np.array([5, 2, 7, 1, 4, 7])[:, None]   # (B, T) bool


def attention_weights(rng, D):
    return dict(w_qkv=rng.standard_normal((D, 3 * D)) / 2, b_qkv=rng.standard_normal(3 * D),
                w_o=rng.standard_normal((D, D)) / 2, b_o=rng.standard_normal(D))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group_size", [1, 4, 64])
def test_fast_attention_equals_dense(causal, group_size):
    """Packed, length-grouped attention == dense attention on the (B, T) grid, at real tokens:
    outputs and every gradient (float64, rel err < 1e-10); dense dx is 0 at padding."""
    rng = np.random.default_rng(0)
    B, T, D, H = *RAGGED.shape, 8, 2
    cells = np.flatnonzero(RAGGED)                                        # (n,)
    x_grid = rng.standard_normal((B, T, D)) * RAGGED[..., None]           # (B, T, D) 0 at padding
    w = attention_weights(rng, D)
    dy = rng.standard_normal((len(cells), D))                             # (n, D)
    bias = np.broadcast_to(attention_bias(RAGGED, causal, np.float64), (B, 1, T, T))
    y, cache = mha_forward(x_grid, **w, bias=bias, n_heads=H)             # (B, T, D)
    dense = mha_backward(unpack(dy, cells, B, T), cache)                  # dy 0 at padding
    groups = attention_groups(RAGGED, causal, np.float64, group_size)
    y_fast, cache_fast = mha_forward_fast(pack(x_grid, cells), **w, groups=groups, n_heads=H)
    fast = mha_backward_fast(dy, cache_fast)
    assert rel_err(y_fast, pack(y, cells)) < 1e-10
    assert rel_err(fast[0], pack(dense[0], cells)) < 1e-10, "dx"
    np.testing.assert_array_equal(dense[0][~RAGGED], 0.0)                 # padding reads nothing
    for name, d_fast, d_dense in zip(("w_qkv", "b_qkv", "w_o", "b_o"), fast[1:], dense[1:]):
        assert rel_err(d_fast, d_dense) < 1e-10, f"d{name}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group_size", [2, 64])
def test_mha_backward_fast(causal, group_size):
    """Against finite differences, with the batch in one attention grid or split in several."""
    rng = np.random.default_rng(7)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=bool)
    n, D = int(mask.sum()), 6
    groups = attention_groups(mask, causal, np.float64, group_size)
    assert len(groups) == -(-len(mask) // group_size)
    assert sorted(np.concatenate([g.rows for g in groups]).tolist()) == list(range(n))
    inputs = dict(x=rng.standard_normal((n, D)), **attention_weights(rng, D), groups=groups,
                  n_heads=2)
    check_layer(mha_forward_fast, mha_backward_fast, inputs, (n, D), rng)


def test_attention_groups_do_not_change_the_output():
    """Grids of 1, 2 or all captions give the same attention output: only padding differs."""
    rng = np.random.default_rng(9)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], bool)
    x = rng.standard_normal((int(mask.sum()), 8))
    w = attention_weights(rng, 8)
    for causal in (False, True):
        ys = [mha_forward_fast(x, **w, groups=attention_groups(mask, causal, np.float64, g),
                               n_heads=2)[0] for g in (1, 2, 4)]
        np.testing.assert_allclose(ys[0], ys[2], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ys[1], ys[2], rtol=1e-12, atol=1e-12)
    # the grid of the two shortest captions is trimmed to their longest: 2 tokens
    group = attention_groups(mask, False, np.float64, 2)[0]
    assert isinstance(group, AttentionGroup) and (group.Bg, group.Tg) == (2, 2)
    assert group.rows.tolist() == [10, 5, 6] and group.cells.tolist() == [0, 2, 3]
    assert group.bias.shape == (2, 1, 1, 2)


def test_pack_unpack_round_trip():
    mask = np.array([[1, 1, 0], [1, 0, 0]], dtype=bool)
    cells = np.flatnonzero(mask)
    x = np.arange(6.0).reshape(3, 2)
    grid = unpack(x, cells, 2, 3)
    np.testing.assert_array_equal(grid, [[[0, 1], [2, 3], [0, 0]], [[4, 5], [0, 0], [0, 0]]])
    np.testing.assert_array_equal(pack(grid, cells), x)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_attention_backward_with_an_empty_caption(causal):
    rng = np.random.default_rng(5)
    B, H, T, Dh = 3, 2, 5, 3
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=bool)
    q, k, v = (rng.standard_normal((B, H, T, Dh)) for _ in range(3))
    bias = attention_bias(mask, causal, np.float64)
    y, _ = softmax_attention_forward(q, k, v, bias)
    assert np.isfinite(y).all()
    np.testing.assert_array_equal(y[2], 0.0)               # fully padded row: zeros, never NaN
    check_layer(softmax_attention_forward, softmax_attention_backward,
                dict(q=q, k=k, v=v, bias=bias), (B, H, T, Dh), rng)


def test_fused_gelu_equals_readable():
    """The in-place chain == the formula: float64 to rounding, float32 to a few ulps."""
    rng = np.random.default_rng(10)
    x, dy = 3 * rng.standard_normal((64, 33)), rng.standard_normal((64, 33))
    for dtype, tol in ((np.float64, 1e-14), (np.float32, 5e-7)):
        xd, dyd = x.astype(dtype), dy.astype(dtype)
        y, cache = gelu_forward(xd)
        y_fast, cache_fast = gelu_forward_fast(xd)
        dx, dx_fast = gelu_backward(dyd, cache), gelu_backward_fast(dyd, cache_fast)
        assert y_fast.dtype == dx_fast.dtype == dtype
        assert rel_err(y_fast, y) < tol and rel_err(dx_fast, dx) < tol, dtype


def test_fast_layers_keep_float32():
    x = np.random.default_rng(8).standard_normal((6, 4)).astype(np.float32)
    groups = attention_groups(np.ones((2, 3), bool), True, np.float32)
    w = {k: v.astype(np.float32) for k, v in attention_weights(np.random.default_rng(1), 4).items()}
    y, cache = mha_forward_fast(x, **w, groups=groups, n_heads=2)
    assert y.dtype == np.float32
    assert all(d.dtype == np.float32 for d in mha_backward_fast(x, cache))
    assert gelu_forward_fast(x)[0].dtype == np.float32
