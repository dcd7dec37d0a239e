"""The named variants (machinery/variants.py): SIGReg against a direct complex sum and by hand,
drop_words, each variant's gradient end to end in float64, and a variant that varies nothing
giving the three objectives' own numbers."""
import math

import numpy as np
import pytest
from gradcheck import numerical_grad, rel_err
from test_objectives import CFG, TINY, check_gradients, tiny_batch, tiny_params

from minialign.machinery import variants
from minialign.machinery.variants import (SIGREG_POINTS, SIGREG_T_MAX, SIGREG_WEIGHT, VARIANTS,
                                          drop_words, sigreg, sigreg_loss)
from minialign.model import encode
from minialign.objectives import CAUSAL, OBJECTIVES, mask_words
from minialign.tokenizer import BOS, EOS, MASK, PAD, UNK

TRAPEZOID = getattr(np, "trapezoid", None) or np.trapz      # numpy 2 renamed trapz


def epps_pulley_direct(x, t_max, n_points):
    """N int_{-t_max}^{t_max} |ECF(t) - e^{-t^2/2}|^2 e^{-t^2/2} dt, complex, on the whole grid."""
    t = np.linspace(-t_max, t_max, 2 * n_points - 1)
    ecf = np.exp(1j * np.outer(x, t)).mean(axis=0)
    return len(x) * TRAPEZOID(np.abs(ecf - np.exp(-t**2 / 2)) ** 2 * np.exp(-t**2 / 2), t)


def unit_columns(rng, D, M):
    A = rng.standard_normal((D, M))
    return A / np.linalg.norm(A, axis=0)


def test_sigreg_value_against_a_direct_complex_sum_and_its_gradient():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((5, 3)) * [0.3, 2.0, 0.8] + [0.4, -1, 0]     # not centred, not unit
    A = unit_columns(rng, 3, 4)
    for t_max, n_points in [(SIGREG_T_MAX, SIGREG_POINTS), (5.0, 9), (1.0, 2)]:
        value, dz = sigreg(z, A, t_max, n_points)
        direct = [epps_pulley_direct(z @ A[:, m], t_max, n_points) for m in range(4)]
        assert value == pytest.approx(np.mean(direct), rel=1e-12)
        err = rel_err(dz, numerical_grad(lambda: sigreg(z, A, t_max, n_points)[0], z))
        assert err < 1e-7, f"t_max {t_max}, {n_points} knots: relative error {err:.1e}"


def test_sigreg_of_one_point_at_zero_by_hand_and_float32():
    # x = 0: ECF = 1, EP = N sum_k w_k (1 - phi_k)^2; 2 knots on [0, 1]: t = 0 adds 0, t = 1
    # has weight dt = 1 (an end) times phi(1) = e^-1/2
    value, dz = sigreg(np.zeros((1, 2)), np.array([[1.0], [0.0]]), 1.0, 2)
    assert value == pytest.approx(math.exp(-0.5) * (1 - math.exp(-0.5)) ** 2, rel=1e-14)
    np.testing.assert_array_equal(dz, 0.0)                          # symmetric: a minimum
    z = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    A = unit_columns(np.random.default_rng(2), 4, 3).astype(np.float32)
    assert sigreg(z, A)[1].dtype == np.float32
    assert sigreg(z.astype(np.float64), A.astype(np.float64))[1].dtype == np.float64


def test_sigreg_loss_parts_and_gradients():
    rng = np.random.default_rng(3)
    z_a = rng.standard_normal((6, 4)) * 0.7 + 0.2
    z_b = z_a + 0.5 * rng.standard_normal((6, 4))
    for sim, weight in [(25.0, 1.0), (0.0, 0.5)]:
        f = lambda: sigreg_loss(z_a, z_b, np.random.default_rng(4), sim, weight)[0]
        value, (dz_a, dz_b), stats = sigreg_loss(z_a, z_b, np.random.default_rng(4), sim, weight)
        A = unit_columns(np.random.default_rng(4), 4, variants.SIGREG_DIRECTIONS)  # its one draw
        s = (sigreg(z_a, A)[0] + sigreg(z_b, A)[0]) / 2
        assert stats["sigreg"] == pytest.approx(s, rel=1e-12)
        assert value == pytest.approx(sim * np.mean((z_a - z_b) ** 2) + weight * SIGREG_WEIGHT * s,
                                      rel=1e-12)
        for name, analytic, wrt in [("z_a", dz_a, z_a), ("z_b", dz_b, z_b)]:
            assert rel_err(analytic, numerical_grad(f, wrt)) < 1e-7, name


def test_drop_words_removes_what_mask_words_masks():
    tokens = np.array([[BOS, 5, 6, 7, 8, EOS, PAD], [BOS, 9, UNK, 10, 11, 12, EOS],
                       [BOS, 13, EOS, PAD, PAD, PAD, PAD]] * 10, np.int64)
    saved = tokens.copy()
    masked = mask_words(tokens, 0.5, np.random.default_rng(5))
    dropped = drop_words(tokens, 0.5, np.random.default_rng(5))
    assert np.array_equal(tokens, saved) and dropped.dtype == np.int64
    for row_m, row_d in zip(masked, dropped):
        kept = [t for t in row_m if t not in (MASK, PAD)]          # the same draws
        assert row_d.tolist() == kept + [PAD] * (len(row_d) - len(kept))
    assert (dropped != PAD).sum() < (tokens != PAD).sum()


def test_every_variant_is_registered_with_its_attention():
    assert all(OBJECTIVES[name] is fn for name, fn in VARIANTS.items())
    assert {n for n in VARIANTS if CAUSAL[n]} == {"next_token_sigreg", "next_token_projector",
                                                  "next_token_last"}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_gradients_end_to_end(name, monkeypatch):
    """What a variant changes enters the encoder at z, hf and the tied head: every element of
    the projector, the final LayerNorm, both embeddings (the blocks' backward, the same for
    all, is checked under the three objectives)."""
    monkeypatch.setattr(variants, "SIGREG_DIRECTIONS", 8)          # sizes only: the maths
    monkeypatch.setattr(variants, "PROJECTOR_RATIO", 2)            # is the same, faster
    params = tiny_params(TINY, 0)
    params.update(getattr(VARIANTS[name], "init", lambda m, r: {})(TINY, np.random.default_rng(1)))
    check_gradients(VARIANTS[name], CFG, params, tiny_batch(),
                    only=("projector.", "ln_f.", "tok_emb", "pos_emb"))


@pytest.mark.parametrize("pair, name", [("views", "good_views"), ("masked", "bad_views"),
                                        ("next", "next_token")])
def test_a_variant_that_varies_nothing_is_the_objective(pair, name):
    params, batch = tiny_params(TINY, 2), tiny_batch()
    loss, grads, _ = variants.variant(pair)(params, batch, CFG, np.random.default_rng(6))
    loss3, grads3, _ = OBJECTIVES[name](params, batch, CFG, np.random.default_rng(6))
    assert loss == pytest.approx(loss3, rel=1e-13)
    assert all(rel_err(grads[k], grads3[k]) < 1e-12 for k in params)


def test_next_token_last_reads_the_last_real_tokens_state():
    params, batch = tiny_params(TINY, 3), tiny_batch()
    z, hf, _ = VARIANTS["next_token_last"].encode(params, batch.tokens_a, TINY, True)
    lengths = (batch.tokens_a != PAD).sum(axis=1)
    np.testing.assert_array_equal(z, hf[np.cumsum(lengths) - 1])
    for b, n in enumerate(lengths):                    # caption b alone: its state at EOS
        _, hf_b, _ = encode(params, batch.tokens_a[b:b + 1, :n], TINY, True)
        np.testing.assert_allclose(z[b], hf_b[-1], rtol=1e-12)
