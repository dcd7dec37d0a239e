"""VICReg (losses.py) by hand, means not 0, D >= 3, N = 3, both sides of the hinge; dtype kept.
VICReg against independent formulas, its gradients, and cross-entropy's values, gradient and
dtype: tests/test_exercises.py, exercises 6 to 8."""
import math

import numpy as np
import pytest
from test_exercises import untouched

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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vicreg_keeps_the_dtype_and_its_inputs(dtype):
    rng = np.random.default_rng(1)
    z_a = (rng.standard_normal((5, 4)) * [0.3, 2.0, 0.8, 1.5] + [1.0, -2, 0.5, 3]).astype(dtype)
    z_b = z_a + rng.standard_normal((5, 4)).astype(dtype) / 2
    with untouched(z_a=z_a, z_b=z_b):
        loss, (dz_a, dz_b), stats = vicreg_loss(z_a, z_b)
    assert dz_a.dtype == dz_b.dtype == dtype and isinstance(loss, float)
    assert set(stats) == {"loss", "inv", "var", "cov"}
    with pytest.raises(ValueError, match="at least 2"):
        vicreg_loss(z_a[:1], z_b[:1])


def test_cross_entropy_over_zero_targets_is_an_error():
    with pytest.raises(ValueError, match="zero targets"):
        cross_entropy(np.zeros((0, 3)), np.zeros(0, int))
