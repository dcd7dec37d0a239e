"""Central finite differences for the gradient checks (float64 only: in float32 the rounding
error of a difference quotient is ~1e-3 and a wrong backward can hide under it)."""
import numpy as np


def numerical_grad(f, x, eps=1e-6):
    """Central-difference d f() / d x, every element; f reads x, nudged in place and restored.
    TypeError unless x is a float64 ndarray (in float32, x + 1e-6 rounds to a neighbour)."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float64:
        raise TypeError(f"gradient checks need a float64 ndarray, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}: build the inputs in float64")
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        saved = x[i]
        x[i] = saved + eps
        f_plus = f()
        x[i] = saved - eps
        f_minus = f()
        x[i] = saved
        grad[i] = (f_plus - f_minus) / (2 * eps)
    return grad


def rel_err(a, b):
    """Largest absolute difference relative to the largest entry of either array; shapes must
    agree (AssertionError naming both: no broadcasting hides a transposed result)."""
    if np.shape(a) != np.shape(b):
        raise AssertionError(f"shape {np.shape(a)}, expected {np.shape(b)}")
    return np.abs(a - b).max() / max(np.abs(a).max(), np.abs(b).max(), 1e-12)
