"""VICReg and cross-entropy (losses.py) by hand and against numpy's var and cov, on inputs that
separate the formula from its neighbours (means not 0, D >= 3, N = 3, both sides of the hinge);
gradients by central differences; dtype kept. Cross-entropy's values, gradient and dtype:
tests/test_exercises.py, exercise 8."""
import math

import numpy as np
import pytest
from gradcheck import numerical_grad, rel_err

from minialign.losses import cross_entropy, vicreg_loss

EPS = 1e-4


def test_vicreg_by_hand():
    """z_a's columns: deviations from the means (1, 0.5, 1.5) are (-1, 1, 0) / 2 and twice
    (-1, -1, 2) / 2: unbiased variances 0.25, 0.75, 0.75; covariances C_01 = C_02 = 0,
    C_12 = 0.75. z_b = z_a + (1, 0, 0) on the first row only."""
    z_a = np.array([[0.5, 0.0, 1.0], [1.5, 0.0, 1.0], [1.0, 1.5, 2.5]])
    z_b = z_a + np.array([[1.0, 0, 0], [0, 0, 0], [0, 0, 0]])
    loss, _, stats = vicreg_loss(z_a, z_b)
    assert stats["inv"] == pytest.approx(1 / 9, rel=1e-13)            # one 1^2 over N D = 9
    var_a = np.mean([1 - math.sqrt(0.25 + EPS), 1 - math.sqrt(0.75 + EPS),
                     1 - math.sqrt(0.75 + EPS)])
    # z_b's first column: 1.5, 1.5, 1.0 -> unbiased variance 1/12; the others as z_a's
    var_b = np.mean([1 - math.sqrt(1 / 12 + EPS), 1 - math.sqrt(0.75 + EPS),
                     1 - math.sqrt(0.75 + EPS)])
    assert stats["var"] == pytest.approx((var_a + var_b) / 2, rel=1e-13)
    # z_b's first column deviates by (1, 1, -2) / 6: C_01 = C_02 = -0.25; C_12 = 0.75 again
    assert stats["cov"] == pytest.approx(2 * 0.75**2 / 3 + 2 * (2 * 0.25**2 + 0.75**2) / 3,
                                         rel=1e-13)
    assert loss == pytest.approx(25 / 9 + 25 * stats["var"] + stats["cov"], rel=1e-13)


def independent_vicreg(z_a, z_b, sim, var, cov):
    """VICReg written with numpy's var (ddof=1) and cov: what losses.py must agree with."""
    def v(z):
        return np.mean(np.maximum(0, 1 - np.sqrt(z.var(axis=0, ddof=1) + EPS)))

    def c(z):
        C = np.cov(z, rowvar=False)
        return (np.sum(C**2) - np.sum(np.diag(C) ** 2)) / z.shape[1]
    return sim * np.mean((z_a - z_b) ** 2) + var * (v(z_a) + v(z_b)) / 2 + cov * (c(z_a) + c(z_b))


def unequal_pair(rng, N=5, D=4):    # dimensions below and above the std target, means not 0
    scale, mean = np.array([0.3, 2.0, 0.8, 1.5, 0.5])[:D], np.array([1.0, -2, 0.5, 3, 0])[:D]
    z_a = rng.standard_normal((N, D)) * scale + mean
    return z_a, z_a + 0.5 * rng.standard_normal((N, D))


@pytest.mark.parametrize("weights", [(25.0, 25.0, 1.0), (0.0, 25.0, 1.0), (1.0, 0.0, 0.0),
                                     (0.0, 0.0, 1.0), (0.0, 1.0, 0.0)])
def test_vicreg_values_and_gradients(weights):
    rng = np.random.default_rng(0)
    for N, D in ((3, 3), (5, 4), (2, 5)):
        z_a, z_b = unequal_pair(rng, N, D)
        loss, (dz_a, dz_b), _ = vicreg_loss(z_a, z_b, *weights)
        assert loss == pytest.approx(independent_vicreg(z_a, z_b, *weights), rel=1e-12, abs=1e-14)
        f = lambda: vicreg_loss(z_a, z_b, *weights)[0]
        for name, analytic, wrt in [("z_a", dz_a, z_a), ("z_b", dz_b, z_b)]:
            err = rel_err(analytic, numerical_grad(f, wrt))
            assert err < 1e-7, f"d{name}, N={N}, weights {weights}: relative error {err:.1e}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vicreg_keeps_the_dtype_and_its_inputs(dtype):
    z_a, z_b = (z.astype(dtype) for z in unequal_pair(np.random.default_rng(1)))
    saved = z_a.copy(), z_b.copy()
    loss, (dz_a, dz_b), stats = vicreg_loss(z_a, z_b)
    assert dz_a.dtype == dz_b.dtype == dtype and isinstance(loss, float)
    assert np.array_equal(z_a, saved[0]) and np.array_equal(z_b, saved[1])
    assert set(stats) == {"loss", "inv", "var", "cov"}
    with pytest.raises(ValueError, match="at least 2"):
        vicreg_loss(z_a[:1], z_b[:1])


def test_cross_entropy_over_zero_targets_is_an_error():
    """Its values by hand, on logits far apart, its gradient and dtype: exercise 8's tests."""
    with pytest.raises(ValueError, match="zero targets"):
        cross_entropy(np.zeros((0, 3)), np.zeros(0, int))
