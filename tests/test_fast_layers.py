"""The fast path (minialign/machinery/fastpath/fast_layers.py, fast_rows.py) against the readable reference (minialign/layers.py):
the same outputs and gradients on ragged batches, plus its own gradient checks and edge cases."""
import warnings

import numpy as np
import pytest
from gradcheck import check_layer, numerical_grad, rel_err

from minialign.layers import (attention_bias, gelu_backward, gelu_forward, mean_pool_backward,
                              mean_pool_forward, mha_backward, mha_forward)
from minialign.losses import cross_entropy
from minialign.machinery.fastpath import fast, rows
from minialign.machinery.fastpath.fast_rows import gelu_backward_fast, gelu_forward_fast
from minialign.machinery.fastpath.fast_layers import (AttentionGroup, attention_scale,
                                                      cross_entropy_fast, group_heads,
                                                      mean_pool_backward_fast,
                                                      mean_pool_forward_fast, mha_backward_fast,
                                                      mha_forward_fast, packed_layout,
                                                      softmax_attention_backward,
                                                      softmax_attention_forward,
                                                      tied_head_cross_entropy_fast)
from minialign.machinery.run.machine import blas_library

# 10 captions in a T = 8 grid: ragged, one empty, one of length 1, lengths 2, 5 and 7 repeated
LENGTHS = np.array([5, 2, 7, 1, 0, 4, 7, 2, 5, 5])
RAGGED = np.arange(8)[None, :] < LENGTHS[:, None]                          # (B, T) bool
BITWISE = blas_library()["core"] is not None     # numpy's BLAS is OpenBLAS (it names its kernel)


def attention_weights(rng, D, dtype=np.float64):
    w = dict(w_qkv=rng.standard_normal((D, 3 * D)) / 2, b_qkv=rng.standard_normal(3 * D),
             w_o=rng.standard_normal((D, D)) / 2, b_o=rng.standard_normal(D))
    return {k: v.astype(dtype) for k, v in w.items()}


def dense_rows(mask, layout):
    """Rows of the dense reference run on the non-empty captions, b' * T + t, in layout order:
    the dense layers.mha_forward hides every key of an empty caption and gives it NaN."""
    new_b = np.cumsum(mask.any(axis=1)) - 1                               # (B,) index among kept
    return new_b[layout.seq] * mask.shape[1] + layout.pos                 # (n,)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group_size", [1, 2, 64])
def test_fast_attention_equals_dense(dtype, tol, causal, group_size):
    """Packed attention on equal-length groups == dense attention on the (B, T) grid, at real
    tokens: outputs and every gradient (float64 to 1e-12, float32 close); dense dx is 0 at
    padding, and the empty caption is in no group and needs no row."""
    rng = np.random.default_rng(0)
    B, T, D, H = *RAGGED.shape, 8, 2
    keep = RAGGED.any(axis=1)                                             # (B,) not empty
    mask = RAGGED[keep]                                                   # (B - 1, T)
    x_grid = (rng.standard_normal((B, T, D)) * RAGGED[..., None]).astype(dtype)  # 0 at padding
    w = attention_weights(rng, D, dtype)
    layout = packed_layout(RAGGED, causal, dtype, group_size)
    rows = dense_rows(RAGGED, layout)                                     # (n,)
    dy = rng.standard_normal((len(rows), D)).astype(dtype)                # (n, D) layout order
    dy_grid = np.zeros((mask.size, D), dtype)                             # (B-1 * T, D)
    dy_grid[rows] = dy
    bias = np.broadcast_to(attention_bias(mask, causal, dtype), (len(mask), 1, T, T))
    y, cache = mha_forward(x_grid[keep], **w, bias=bias, n_heads=H)       # (B-1, T, D)
    dense = mha_backward(dy_grid.reshape(len(mask), T, D), cache)
    y_fast, cache_fast = mha_forward_fast(x_grid.reshape(-1, D)[layout.flat], **w,
                                          groups=layout.groups, n_heads=H)
    fast = mha_backward_fast(dy, cache_fast)
    assert y_fast.dtype == dtype and all(d.dtype == dtype for d in fast)
    assert rel_err(y_fast, y.reshape(-1, D)[rows]) < tol
    assert rel_err(fast[0], dense[0].reshape(-1, D)[rows]) < tol, "dx"
    np.testing.assert_array_equal(dense[0][~mask], 0.0)                   # padding reads nothing
    for name, d_fast, d_dense in zip(("w_qkv", "b_qkv", "w_o", "b_o"), fast[1:], dense[1:]):
        assert rel_err(d_fast, d_dense) < tol, f"d{name}"


def test_packed_layout_by_hand():
    """Captions of lengths 3, 0, 1, 3, 2 (T = 4): rows sorted by length, ties in batch order."""
    mask = np.arange(4)[None, :] < np.array([3, 0, 1, 3, 2])[:, None]     # (5, 4)
    layout = packed_layout(mask, causal=False, dtype=np.float64)
    assert layout.order.tolist() == [1, 2, 4, 0, 3]
    assert layout.lengths.tolist() == [0, 1, 2, 3, 3]
    assert layout.flat.tolist() == [8, 16, 17, 0, 1, 2, 12, 13, 14]       # b * 4 + t
    assert layout.seq.tolist() == [2, 4, 4, 0, 0, 0, 3, 3, 3]
    assert layout.pos.tolist() == [0, 0, 1, 0, 1, 2, 0, 1, 2]
    assert layout.caption_rows.tolist() == [3, 4, 5, 0, 6, 7, 8, 1, 2]
    np.testing.assert_array_equal(layout.flat[layout.caption_rows], np.flatnonzero(mask))
    assert [g[:5] for g in layout.groups] == [(0, 1, 1, 1, 1), (1, 3, 2, 1, 2), (3, 9, 3, 2, 3)]
    assert all(isinstance(g, AttentionGroup) and g.bias is None for g in layout.groups)
    # at most 1 caption per group: the two of length 3 split; causal groups carry (1, 1, Tg, Tg)
    groups = packed_layout(mask, causal=True, dtype=np.float32, group_size=1).groups
    assert [g[:5] for g in groups] == [(0, 1, 1, 1, 1), (1, 3, 2, 1, 2), (3, 6, 3, 1, 3),
                                       (6, 9, 4, 1, 3)]
    np.testing.assert_array_equal(groups[2].bias[0, 0], [[0, -np.inf, -np.inf],
                                                         [0, 0, -np.inf], [0, 0, 0]])
    assert groups[2].bias.dtype == np.float32
    # 5 captions of one length, at most 2 per group: near-equal groups of 2, 2, 1
    five = packed_layout(np.ones((5, 3), bool), False, np.float64, group_size=2).groups
    assert [(g.start, g.stop, g.first, g.Bg) for g in five] == [(0, 6, 0, 2), (6, 12, 2, 2),
                                                                (12, 15, 4, 1)]


def test_group_heads_is_a_view_of_the_rows():
    """q, k, v and the merged output are views of packed rows: no gather, no scatter."""
    qkv = np.arange(6 * 12.0).reshape(6, 12)                              # (n, 3D): D = 4, H = 2
    g = AttentionGroup(start=2, stop=6, first=1, Bg=2, Tg=2, bias=None)
    heads = group_heads(qkv[g.start:g.stop], g.Bg, 3 * 2)                 # (Bg, 3H, Tg, Dh)
    assert heads.shape == (2, 6, 2, 2) and np.shares_memory(heads, qkv)
    # caption 1 of the group (rows 4, 5), head 1 of k (columns D + Dh : D + 2 Dh = 6:8)
    np.testing.assert_array_equal(heads[1, 3], qkv[4:6, 6:8])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group_size", [1, 64])
def test_mha_backward_fast(causal, group_size):
    """Against finite differences, with an empty and a length-1 caption, one group per caption
    or per length."""
    rng = np.random.default_rng(7)
    mask = np.arange(4)[None, :] < np.array([3, 4, 1, 0, 3])[:, None]     # (5, 4)
    n, D = int(mask.sum()), 6
    layout = packed_layout(mask, causal, np.float64, group_size)
    covered = np.concatenate([np.arange(g.start, g.stop) for g in layout.groups])
    assert covered.tolist() == list(range(n))                             # each row once
    inputs = dict(x=rng.standard_normal((n, D)), **attention_weights(rng, D),
                  groups=layout.groups, n_heads=2)
    check_layer(mha_forward_fast, mha_backward_fast, inputs, (n, D), rng)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_attention_backward(causal):
    rng = np.random.default_rng(5)
    B, H, T, Dh = 2, 2, 5, 3
    q, k, v = (rng.standard_normal((B, H, T, Dh)) for _ in range(3))
    bias = attention_bias(np.ones((1, T), bool), True, np.float64) if causal else None
    check_layer(softmax_attention_forward, softmax_attention_backward,
                dict(q=q, k=k, v=v, bias=bias), (B, H, T, Dh), rng)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-14), (np.float32, 1e-6)])
def test_segment_mean_pool_equals_matrix_pool(dtype, tol):
    """Segment mean == layers.mean_pool_forward's P @ h (rows in layout order, seq given);
    the empty caption pools to 0; backward == P^T dz; and its own gradient check."""
    rng = np.random.default_rng(11)
    layout = packed_layout(RAGGED, False, dtype)
    n, B, D = len(layout.seq), len(RAGGED), 5
    h, dz = (rng.standard_normal(shape).astype(dtype) for shape in ((n, D), (B, D)))
    z, cache = mean_pool_forward(h, layout.seq, B)
    z_fast, cache_fast = mean_pool_forward_fast(h, layout)
    assert z_fast.dtype == dtype and rel_err(z_fast, z) < tol
    np.testing.assert_array_equal(z_fast[4], 0.0)                         # the empty caption
    np.testing.assert_allclose(z_fast[3], h[layout.seq == 3][0])          # length 1: its row
    dh_fast = mean_pool_backward_fast(dz, cache_fast)
    assert dh_fast.dtype == dtype and rel_err(dh_fast, mean_pool_backward(dz, cache)) < tol
    if dtype == np.float64:
        check_layer(mean_pool_forward_fast, mean_pool_backward_fast, dict(h=h, layout=layout),
                    (B, D), rng)


@pytest.mark.parametrize("block_rows", [1, 3, 64])
def test_fused_cross_entropy_equals_reference(block_rows):
    """cross_entropy_fast == losses.cross_entropy: float64 to 1e-12, float32 close and its loss
    within 1e-6 of float64's; dlogits written into the logits buffer."""
    rng = np.random.default_rng(12)
    logits, targets = 4 * rng.standard_normal((10, 7)), rng.integers(0, 7, 10)
    loss, dlogits, stats = cross_entropy(logits.copy(), targets)
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-6)):
        buffer = logits.astype(dtype)
        loss_fast, dlogits_fast, stats_fast = cross_entropy_fast(buffer, targets, block_rows)
        assert dlogits_fast is buffer and dlogits_fast.dtype == dtype
        assert abs(loss_fast - loss) < tol * loss and rel_err(dlogits_fast, dlogits) < tol
        assert stats_fast == {"ce": loss_fast, "targets": 10}
    # and against finite differences of its own loss (float64)
    f = lambda: cross_entropy_fast(logits.copy(), targets, block_rows)[0]
    dlogits_fast = cross_entropy_fast(logits.copy(), targets, block_rows)[1]
    assert rel_err(dlogits_fast, numerical_grad(f, logits)) < 1e-7


def test_fused_cross_entropy_edge_cases():
    # huge logits do not overflow: -log softmax([1000, 0])[1] = 1000
    loss, dlogits, _ = cross_entropy_fast(np.array([[1000.0, 0.0]], np.float32), np.array([1]))
    assert loss == pytest.approx(1000.0) and np.isfinite(dlogits).all()
    # uniform logits over V = 4: loss log 4, dlogits = (1/4 - onehot) / n by hand
    loss, dlogits, _ = cross_entropy_fast(np.zeros((2, 4)), np.array([0, 3]))
    assert loss == pytest.approx(np.log(4), abs=1e-15)
    np.testing.assert_allclose(dlogits, [[-0.375, 0.125, 0.125, 0.125],
                                         [0.125, 0.125, 0.125, -0.375]], atol=1e-16)
    with pytest.raises(ValueError, match="zero targets"):
        cross_entropy_fast(np.zeros((0, 4), np.float32), np.zeros(0, int))


def test_fused_gelu_equals_readable():
    """The in-place sigmoid chain == the tanh formula: float64 to rounding; float32 to ~10
    ulps of the largest dx (where |x| is large, the chain's s (1 - s) and the formula's
    1 - th^2 both lose digits to cancellation: each is ~1e-6 from float64's dx)."""
    rng = np.random.default_rng(10)
    x, dy = 3 * rng.standard_normal((64, 33)), rng.standard_normal((64, 33))
    for dtype, tol in ((np.float64, 1e-14), (np.float32, 2e-6)):
        xd, dyd = x.astype(dtype), dy.astype(dtype)
        y, cache = gelu_forward(xd)
        y_fast, cache_fast = gelu_forward_fast(xd)
        dx, dx_fast = gelu_backward(dyd, cache), gelu_backward_fast(dyd, cache_fast)
        assert y_fast.dtype == dx_fast.dtype == dtype
        assert rel_err(y_fast, y) < tol and rel_err(dx_fast, dx) < tol, dtype


def test_fused_gelu_at_large_inputs_without_overflow_warning():
    """exp(-2u) overflows to inf for x << 0: s = 0, y = -0, dx = 0, and no RuntimeWarning."""
    x = np.array([[-100.0, -20.0, 0.0, 20.0, 100.0]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, cache = gelu_forward_fast(x)
        dx = gelu_backward_fast(np.ones_like(x), cache)
    assert y.tolist() == [[0.0, 0.0, 0.0, 20.0, 100.0]]
    assert dx.tolist() == [[0.0, 0.0, 0.5, 1.0, 1.0]]


def test_fast_layers_keep_float32():
    """float32 in, float32 out, gradients too (layers never cast)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    layout = packed_layout(np.ones((2, 3), bool), True, np.float32)
    w = attention_weights(np.random.default_rng(1), 4, np.float32)
    y, cache = mha_forward_fast(x, **w, groups=layout.groups, n_heads=2)
    assert y.dtype == np.float32
    assert all(d.dtype == np.float32 for d in mha_backward_fast(x, cache))
    z, cache = mean_pool_forward_fast(x, layout)
    assert z.dtype == mean_pool_backward_fast(z, cache).dtype == np.float32
    assert attention_scale(x[None, None]) == np.float32(0.5)              # 1/sqrt(Dh = 4)
    assert attention_scale(x[None, None]).dtype == np.float32             # not a float64 scalar
    loss, dlogits, _ = cross_entropy_fast(x.copy(), np.array([0, 1, 2, 3, 0, 1]))
    assert isinstance(loss, float) and dlogits.dtype == np.float32
    assert gelu_forward_fast(x)[0].dtype == np.float32


@pytest.mark.parametrize("n", (5, 3 * rows.GEMM_BLOCK + 7))
def test_fused_tied_head_gives_the_three_calls_bit_for_bit(n):
    """tied_head_cross_entropy_fast (what the fast set's lm_head_forward -> cross_entropy ->
    lm_head_backward run) == the head's products over row blocks around cross_entropy_fast on
    real (n, V) logits: loss, dhf and the head's dtok_emb, the same bits (float32; one block,
    and blocks of 512, 512, 256, 128, 64, 64, 7 rows), on 1 and 2 threads. Two paths that make
    the same GEMMs on the same row blocks: the same bits on OpenBLAS (deterministic for a kernel
    and a shape); another BLAS promises that for no two calls (MKL's results may depend on
    memory alignment), so there the same numbers to float32 rounding (BITWISE)."""
    rng = np.random.default_rng(n)
    V, D = 37, 8
    hf = rng.standard_normal((n, D)).astype(np.float32)
    tok_emb = rng.standard_normal((V, D)).astype(np.float32)
    targets = rng.integers(0, V, n)
    logits = rows.matmul_rows(hf, tok_emb.T)                              # (n, V) real logits
    loss, dlogits, stats = fast.cross_entropy(logits, targets)            # cross_entropy_fast
    dhf, dtok = fast.lm_head_backward(dlogits, fast.TiedLogits(hf, tok_emb))  # the two products
    before = rows._THREADS
    try:
        for k in (1, 2):
            rows.set_threads(k)
            loss_f, dhf_f, dtok_f, stats_f = tied_head_cross_entropy_fast(hf, tok_emb, targets)
            logits_f, cache = fast.lm_head_forward(hf, tok_emb)          # the three calls
            loss_3, dlogits_f, stats_3 = fast.cross_entropy(logits_f, targets)
            dhf_3, dtok_3 = fast.lm_head_backward(dlogits_f, cache)
            for loss_x, dhf_x, dtok_x, stats_x in ((loss_f, dhf_f, dtok_f, stats_f),
                                                   (loss_3, dhf_3, dtok_3, stats_3)):
                if BITWISE:
                    assert loss_x == loss and stats_x == stats
                    assert dhf_x.tobytes() == dhf.tobytes() and dtok_x.tobytes() == dtok.tobytes()
                else:
                    assert loss_x == pytest.approx(loss, rel=1e-6)
                    np.testing.assert_allclose(dhf_x, dhf, rtol=1e-5, atol=1e-7)
                    np.testing.assert_allclose(dtok_x, dtok, rtol=1e-5, atol=1e-7)
    finally:
        rows._THREADS = before
