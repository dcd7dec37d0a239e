"""The finite-difference helper itself: exact in float64, refuses float32 (tests/gradcheck.py)."""
import numpy as np
import pytest

from gradcheck import numerical_grad, rel_err


def test_numerical_grad_matches_analytic_in_float64():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    saved = x.copy()
    grad = numerical_grad(lambda: np.sum(x * y), x)            # d/dx sum(x * y) = y
    assert grad.dtype == np.float64 and grad.shape == (3, 4)
    assert np.abs(grad - y).max() < 1e-9 and rel_err(grad, y) < 1e-9
    assert np.array_equal(x, saved)                            # every nudge was undone
    cube = numerical_grad(lambda: np.sum(x**3), x)             # d/dx sum(x^3) = 3 x^2
    assert rel_err(cube, 3 * x**2) < 1e-8


def test_numerical_grad_refuses_float32_and_lists():
    x32 = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    y32 = np.ones((3, 4), np.float32)
    saved = x32.copy()
    with pytest.raises(TypeError, match="float64.*float32"):
        numerical_grad(lambda: np.sum(x32 * y32), x32)
    assert x32.dtype == np.float32 and np.array_equal(x32, saved)   # the caller's array untouched
    with pytest.raises(TypeError, match="float64"):
        numerical_grad(lambda: 0.0, [1.0, 2.0])
