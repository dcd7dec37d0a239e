"""Every reference layer's backward against central finite differences, in float64, every element
(minialign/layers.py; the fast path is checked against these in tests/test_fast_layers.py)."""
import numpy as np
import pytest
from gradcheck import check_layer

from minialign.layers import (attention_backward, attention_bias, attention_forward,
                              embedding_backward, embedding_forward, gelu_backward, gelu_forward,
                              layernorm_backward, layernorm_forward, linear_backward,
                              linear_forward, lm_head_backward, lm_head_forward, mean_pool_backward,
                              mean_pool_forward, merge_heads, mha_backward, mha_forward,
                              pool_backward, pool_forward, split_heads, token_rows)


def test_linear_backward():
    rng = np.random.default_rng(0)
    inputs = dict(x=rng.standard_normal((2, 3, 4)), w=rng.standard_normal((4, 5)),
                  b=rng.standard_normal(5))
    check_layer(linear_forward, linear_backward, inputs, (2, 3, 5), rng)


def test_layernorm_backward():
    rng = np.random.default_rng(1)
    inputs = dict(x=rng.standard_normal((2, 3, 5)), gamma=rng.standard_normal(5),
                  beta=rng.standard_normal(5))
    check_layer(layernorm_forward, layernorm_backward, inputs, (2, 3, 5), rng)


def test_layernorm_forward_values():
    y, _ = layernorm_forward(np.array([[1.0, 2.0, 3.0]]), np.ones(3), np.zeros(3), eps=0.0)
    np.testing.assert_allclose(y, [[-np.sqrt(1.5), 0.0, np.sqrt(1.5)]], rtol=1e-12)


def test_gelu_backward_and_values():
    rng = np.random.default_rng(2)
    check_layer(gelu_forward, gelu_backward, dict(x=2 * rng.standard_normal((3, 7))), (3, 7), rng)
    # the tanh form at x = 1: 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.841192...
    np.testing.assert_allclose(gelu_forward(np.array([1.0, 0.0, -1.0]))[0],
                               [0.8411919906, 0.0, -0.1588080094], atol=1e-9)


def test_embedding_backward_repeated_ids():
    rng = np.random.default_rng(3)
    ids = np.array([1, 2, 1, 5, 1, 0])                    # id 1 read three times
    check_layer(embedding_forward, embedding_backward,
                dict(ids=ids, weight=rng.standard_normal((6, 4))), (6, 4), rng)


def test_mean_pool_values_and_backward():
    rng = np.random.default_rng(4)
    h = rng.standard_normal((6, 2))                       # rows of sequences 0, 0, 1, 1, 1, 1
    seq = np.array([0, 0, 1, 1, 1, 1])
    z, cache = mean_pool_forward(h, seq, 3)               # sequence 2 has no real token
    np.testing.assert_allclose(z[0], h[:2].mean(axis=0))
    np.testing.assert_allclose(z[1], h[2:].mean(axis=0))
    np.testing.assert_array_equal(z[2], 0.0)               # pools to 0, not NaN
    check_layer(mean_pool_forward, mean_pool_backward, dict(h=h, seq=seq, n_seqs=3), (3, 2), rng)


def test_split_and_merge_heads():
    x = np.arange(2 * 3 * 6).reshape(2, 3, 6)             # (B, T, D), H = 2, Dh = 3
    heads = split_heads(x, 2)
    assert heads.shape == (2, 2, 3, 3)
    np.testing.assert_array_equal(heads[1, 1, 2], x[1, 2, 3:6])   # head 1 reads features 3:6
    np.testing.assert_array_equal(merge_heads(heads), x)


@pytest.mark.parametrize("causal", [False, True])
def test_mha_backward(causal):
    """The dense reference, with padding and (causal) the future hidden."""
    rng = np.random.default_rng(7)
    B, T, D, H = 3, 4, 6, 2
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=bool)
    inputs = dict(x=rng.standard_normal((B, T, D)), w_qkv=rng.standard_normal((D, 3 * D)) / 2,
                  b_qkv=rng.standard_normal(3 * D), w_o=rng.standard_normal((D, D)) / 2,
                  b_o=rng.standard_normal(D), bias=attention_bias(mask, causal, np.float64),
                  n_heads=H)
    check_layer(mha_forward, mha_backward, inputs, (B, T, D), rng)


def test_mha_reads_only_allowed_keys():
    """Changing a padded token, or (causal) a later token, leaves earlier outputs unchanged."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 4, 4))
    weights = (rng.standard_normal((4, 12)), rng.standard_normal(12),
               rng.standard_normal((4, 4)), rng.standard_normal(4))
    mask = np.array([[1, 1, 1, 0]], dtype=bool)
    for causal, unchanged in ((False, 3), (True, 2)):
        x2 = x.copy()
        x2[:, unchanged:] += 5.0
        bias = attention_bias(mask, causal, np.float64)
        y, _ = mha_forward(x, *weights, bias, 2)
        y2, _ = mha_forward(x2, *weights, bias, 2)
        np.testing.assert_allclose(y2[:, :unchanged], y[:, :unchanged], rtol=1e-12)
        assert not np.allclose(y2[:, unchanged:], y[:, unchanged:])


def test_layers_keep_float32():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    g, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    assert layernorm_forward(x, g, b)[0].dtype == np.float32
    y, cache = gelu_forward(x)
    assert y.dtype == np.float32 and gelu_backward(x, cache).dtype == np.float32
    w_qkv, w_o = np.ones((4, 12), np.float32), np.ones((4, 4), np.float32)
    bias = attention_bias(np.ones((2, 3), bool), True, np.float32)
    y, cache = mha_forward(x, w_qkv, np.zeros(12, np.float32), w_o, b, bias, 2)
    assert y.dtype == np.float32
    assert all(d.dtype == np.float32 for d in mha_backward(x, cache))


# ---------------------------------------------------------------- the rows encode runs on
RAGGED = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=bool)  # (B, T)


def test_token_rows_by_hand():
    rows = token_rows(RAGGED, causal=True, dtype=np.float64)
    assert rows.flat.tolist() == [0, 1, 2, 4, 12, 13, 14, 15]            # b * 4 + t, batch order
    assert rows.seq.tolist() == [0, 0, 0, 1, 3, 3, 3, 3]
    assert rows.pos.tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    assert rows.caption_rows.tolist() == list(range(8))
    assert rows.bias.shape == (4, 1, 4, 4)
    assert np.isfinite(rows.bias).any(axis=-1).all()             # every query reads a key, even
    assert np.isfinite(rows.bias[2, 0, -1]).all()                # the empty caption's padding


@pytest.mark.parametrize("causal", [False, True])
def test_attention_on_rows_backward(causal):
    """The padded dense attention (attention_forward: rows -> (B, T, D) grid -> rows), every
    element of every gradient, on ragged captions and one empty caption."""
    rng = np.random.default_rng(7)
    D, n = 4, int(RAGGED.sum())
    inputs = dict(x=rng.standard_normal((n, D)), w_qkv=rng.standard_normal((D, 3 * D)),
                  b_qkv=rng.standard_normal(3 * D), w_o=rng.standard_normal((D, D)),
                  b_o=rng.standard_normal(D), rows=token_rows(RAGGED, causal, np.float64),
                  n_heads=2)
    check_layer(attention_forward, attention_backward, inputs, (n, D), rng)


def test_attention_on_rows_equals_mha_on_the_grid():
    rng = np.random.default_rng(8)
    D, mask = 4, RAGGED[[0, 1, 3]]                                        # no empty caption
    x = rng.standard_normal((*mask.shape, D))
    w = [rng.standard_normal(s) for s in ((D, 3 * D), (3 * D,), (D, D), (D,))]
    for causal in (False, True):
        dense, _ = mha_forward(x, *w, attention_bias(mask, causal, np.float64), 2)
        rows, _ = attention_forward(x[mask], *w, token_rows(mask, causal, np.float64), 2)
        np.testing.assert_allclose(rows, dense[mask], rtol=1e-12, atol=1e-12)


def test_pool_on_rows_backward():
    rng = np.random.default_rng(9)
    rows = token_rows(RAGGED, causal=False, dtype=np.float64)
    h = rng.standard_normal((len(rows.seq), 3))
    check_layer(pool_forward, pool_backward, dict(h=h, rows=rows), (4, 3), rng)
    z, _ = pool_forward(h, rows)
    np.testing.assert_allclose(z[0], h[:3].mean(axis=0), rtol=1e-12)
    assert not z[2].any()                                                 # empty caption: 0


def test_lm_head_backward():
    rng = np.random.default_rng(10)
    inputs = dict(hf=rng.standard_normal((5, 4)), tok_emb=rng.standard_normal((7, 4)))
    check_layer(lm_head_forward, lm_head_backward, inputs, (5, 7), rng)
