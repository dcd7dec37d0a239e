"""VICReg, SIGReg and cross-entropy: values computed by hand or independently, gradients by
central differences."""
import math

import numpy as np
import pytest
from gradcheck import numerical_grad, rel_err

from minialign.losses import (SIGREG_POINTS, SIGREG_T_MAX, cross_entropy, sigreg, sigreg_directions,
                              sigreg_loss, vicreg_loss)


def test_vicreg_hand_computed():
    z_a = np.array([[1.0, 0.0], [-1.0, 0.0]])
    z_b = np.array([[1.0, 1.0], [-1.0, -1.0]])
    loss, _, stats = vicreg_loss(z_a, z_b)
    # inv: diff = [[0, -1], [0, 1]] -> 2 / (N D = 4) = 0.5
    assert stats["inv"] == pytest.approx(0.5, abs=1e-12)
    # var: z_a dim 1 is constant, std = sqrt(0 + 1e-4) = 0.01 -> hinge 0.99, mean over D -> 0.495;
    # every other dim has unbiased variance 2 > 1 -> 0. Averaged over branches: 0.2475
    assert stats["var"] == pytest.approx(0.2475, abs=1e-12)
    # cov: C_a = [[2, 0], [0, 0]] -> 0; C_b = [[2, 2], [2, 2]] -> (2^2 + 2^2) / D = 4
    assert stats["cov"] == pytest.approx(4.0, abs=1e-12)
    assert loss == pytest.approx(25 * 0.5 + 25 * 0.2475 + 4.0, abs=1e-12)


def test_vicreg_gradients():
    rng = np.random.default_rng(0)
    scale = np.array([0.3, 2.0, 0.8, 1.5])               # some dims below the std target, some above
    z_a = rng.standard_normal((6, 4)) * scale
    z_b = z_a + 0.5 * rng.standard_normal((6, 4))
    for weights in [(25.0, 25.0, 1.0), (0.0, 25.0, 1.0), (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)]:
        loss = lambda: vicreg_loss(z_a, z_b, *weights)[0]
        _, (dz_a, dz_b), _ = vicreg_loss(z_a, z_b, *weights)
        for name, analytic, wrt in [("z_a", dz_a, z_a), ("z_b", dz_b, z_b)]:
            err = rel_err(analytic, numerical_grad(loss, wrt))
            assert err < 1e-7, f"d{name} with weights {weights}: relative error {err:.1e}"


def test_vicreg_rejects_one_pair():
    with pytest.raises(ValueError, match="at least 2"):
        vicreg_loss(np.ones((1, 3)), np.ones((1, 3)))


def test_cross_entropy_hand_computed():
    logits = np.array([[0.0, 0.0, np.log(2.0)], [1.0, 1.0, 1.0]])
    targets = np.array([2, 0])
    loss, dlogits, stats = cross_entropy(logits, targets)
    # row 0: softmax [1/4, 1/4, 1/2], -log(1/2); row 1: uniform over 3, -log(1/3)
    assert loss == pytest.approx((np.log(2) + np.log(3)) / 2, abs=1e-12)
    assert stats["ce"] == loss
    np.testing.assert_allclose(dlogits, [[0.125, 0.125, -0.25], [-1 / 3, 1 / 6, 1 / 6]], atol=1e-12)


def test_cross_entropy_gradient_and_no_overflow():
    rng = np.random.default_rng(1)
    logits, targets = 3 * rng.standard_normal((5, 7)), rng.integers(0, 7, size=5)
    loss = lambda: cross_entropy(logits, targets)[0]
    err = rel_err(cross_entropy(logits, targets)[1], numerical_grad(loss, logits))
    assert err < 1e-7, f"dlogits: relative error {err:.1e}"
    big = np.array([[1000.0, 0.0]], dtype=np.float32)      # exp(1000) overflows without the shift
    assert cross_entropy(big, np.array([1]))[0] == pytest.approx(1000.0)


# ------------------------------------------------------------------ SIGReg (LeJEPA)

def test_sigreg_directions_are_unit_columns_from_the_given_rng():
    A = sigreg_directions(5, 7, np.random.default_rng(0), np.float32)
    assert A.shape == (5, 7) and A.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(A.astype(np.float64), axis=0), 1.0, atol=1e-6)
    raw = np.random.default_rng(0).standard_normal((5, 7))              # the one draw it makes
    np.testing.assert_allclose(A, raw / np.linalg.norm(raw, axis=0), rtol=1e-6)


TRAPEZOID = getattr(np, "trapezoid", None) or np.trapz   # numpy 2.0 renamed trapz (1.x has no
#                                                          trapezoid; 2.x deprecates trapz)


def epps_pulley_direct(x, t_max, n_points):
    """N * integral over [-t_max, t_max] of |ECF - exp(-t^2/2)|^2 exp(-t^2/2), written apart
    from losses.sigreg: complex exponentials, the full symmetric grid (2 n_points - 1 knots,
    the same spacing) and numpy's own trapezoid rule. x: (N,) one projection."""
    t = np.linspace(-t_max, t_max, 2 * n_points - 1)
    ecf = np.exp(1j * np.outer(x, t)).mean(axis=0)                      # (knots,) complex
    integrand = np.abs(ecf - np.exp(-t**2 / 2)) ** 2 * np.exp(-t**2 / 2)
    return len(x) * TRAPEZOID(integrand, t)


def test_sigreg_value_against_a_direct_complex_sum():
    z = np.array([[0.5, -1.0, 2.0], [1.5, 0.0, -0.5], [-2.0, 1.0, 0.3], [0.1, 0.2, 0.7],
                  [3.0, -0.4, 0.0]])
    A = np.array([[1.0, 0.6], [0.0, 0.8], [0.0, 0.0]])                  # two unit columns
    for t_max, n_points in [(SIGREG_T_MAX, SIGREG_POINTS), (5.0, 9), (1.0, 2)]:
        value, _, ep = sigreg(z, A, t_max, n_points)
        direct = [epps_pulley_direct(z @ A[:, m], t_max, n_points) for m in range(2)]
        np.testing.assert_allclose(ep, direct, rtol=1e-12)
        assert value == pytest.approx(np.mean(direct), rel=1e-12)


def test_sigreg_of_a_single_point_at_zero_by_hand():
    # x = 0: ECF = 1, so EP = N * sum_k w_k (1 - phi_k)^2; with 2 knots on [0, 1]: t = 0 adds 0,
    # t = 1 has weight dt = 1 (an end) times phi(1) = e^-1/2: EP = e^-1/2 (1 - e^-1/2)^2
    value, dz, _ = sigreg(np.zeros((1, 2)), np.array([[1.0], [0.0]]), 1.0, 2)
    assert value == pytest.approx(math.exp(-0.5) * (1 - math.exp(-0.5)) ** 2, rel=1e-14)
    np.testing.assert_array_equal(dz, 0.0)                              # symmetric: a minimum


def test_sigreg_gradients():
    rng = np.random.default_rng(3)
    z = rng.standard_normal((6, 4)) * np.array([0.3, 2.0, 0.8, 1.5]) + 0.4
    A = sigreg_directions(4, 5, rng)
    for t_max, n_points in [(SIGREG_T_MAX, SIGREG_POINTS), (5.0, 9), (1.0, 2)]:
        loss = lambda: sigreg(z, A, t_max, n_points)[0]
        err = rel_err(sigreg(z, A, t_max, n_points)[1], numerical_grad(loss, z))
        assert err < 1e-7, f"dz with t_max {t_max}, {n_points} knots: relative error {err:.1e}"


def test_sigreg_loss_gradients_and_parts():
    rng = np.random.default_rng(4)
    z_a = rng.standard_normal((6, 4)) * 0.7
    z_b = z_a + 0.5 * rng.standard_normal((6, 4))
    A = sigreg_directions(4, 3, rng)
    for weights in [(25.0, 5.0), (0.0, 2.0), (1.0, 0.0)]:
        loss = lambda: sigreg_loss(z_a, z_b, A, *weights)[0]
        value, (dz_a, dz_b), stats = sigreg_loss(z_a, z_b, A, *weights)
        assert stats["inv"] == pytest.approx(((z_a - z_b) ** 2).mean(), rel=1e-14)
        assert stats["sigreg"] == pytest.approx((sigreg(z_a, A)[0] + sigreg(z_b, A)[0]) / 2)
        assert value == pytest.approx(weights[0] * stats["inv"] + weights[1] * stats["sigreg"])
        for name, analytic, wrt in [("z_a", dz_a, z_a), ("z_b", dz_b, z_b)]:
            err = rel_err(analytic, numerical_grad(loss, wrt))
            assert err < 1e-7, f"d{name} with weights {weights}: relative error {err:.1e}"


def test_sigreg_keeps_float32():
    z = np.random.default_rng(5).standard_normal((8, 4)).astype(np.float32)
    A = sigreg_directions(4, 3, np.random.default_rng(6), np.float32)
    _, dz, ep = sigreg(z, A)
    assert dz.dtype == np.float32 and ep.dtype == np.float32


def test_sigreg_scores_gaussian_batches_at_its_expectation_and_collapse_far_above():
    # For x_1..x_N i.i.d. N(0, 1): E ECF(t) = phi(t) and Var ECF(t) = (1 - phi(t)^2) / N, so
    # E |ECF - phi|^2 = (1 - e^{-t^2}) / N and E EP = sum_k w_k (1 - e^{-t_k^2}), whatever N
    # (the quadrature is linear). A unit direction of N(0, I_D) rows is N(0, 1): the same.
    t = np.linspace(0, SIGREG_T_MAX, SIGREG_POINTS)
    dt = t[1]
    quad = np.where((t == 0) | (t == t[-1]), dt, 2 * dt)
    expected = np.sum(quad * np.exp(-t**2 / 2) * (1 - np.exp(-t**2)))
    # the exact integral over [-3, 3]: sqrt(2 pi) erf(3 / sqrt 2) - sqrt(2 pi / 3) erf(3 sqrt 1.5)
    exact = (math.sqrt(2 * math.pi) * math.erf(3 / math.sqrt(2))
             - math.sqrt(2 * math.pi / 3) * math.erf(3 * math.sqrt(1.5)))
    assert expected == pytest.approx(exact, abs=1e-3) and expected == pytest.approx(1.0525, abs=1e-4)
    rng = np.random.default_rng(7)
    N, D, M, batches = 64, 8, 16, 400
    values = [sigreg(rng.standard_normal((N, D)), sigreg_directions(D, M, rng))[0]
              for _ in range(batches)]
    mean, stderr = np.mean(values), np.std(values) / math.sqrt(batches)
    assert stderr < 0.03 and abs(mean - expected) < 4 * stderr, (mean, stderr, expected)
    # collapsed: every row the same point -> ECF = e^{itc}, EP grows like N
    point = np.tile(rng.standard_normal(D), (N, 1))                     # (N, D)
    assert sigreg(point, sigreg_directions(D, M, rng))[0] > 20 * expected
    # dimensional collapse: rows of N(0, I) squeezed to std 0.1 (VICReg's variance would fire)
    squeezed = 0.1 * rng.standard_normal((N, D))
    assert sigreg(squeezed, sigreg_directions(D, M, rng))[0] > 10 * expected


def test_sigreg_refuses_bad_shapes_and_quadrature():
    z, A = np.ones((3, 2)), np.array([[1.0], [0.0]])
    with pytest.raises(ValueError, match="directions"):
        sigreg(z, np.ones((3, 1)))
    with pytest.raises(ValueError, match="directions are float32, z is float64"):
        sigreg(z, A.astype(np.float32))
    with pytest.raises(ValueError, match="N >= 1"):
        sigreg(np.ones((0, 2)), A)
    with pytest.raises(ValueError, match="n_points >= 2 and t_max > 0, got 1 and 3.0"):
        sigreg(z, A, 3.0, 1)
    with pytest.raises(ValueError, match="got 17 and 0.0"):
        sigreg(z, A, 0.0, 17)
