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


def check_layer(forward, backward, inputs, dy_shape, rng, tol=1e-7):
    """backward(dy, cache) -> the gradients of forward(**inputs)'s float arrays in argument
    order (one array or a tuple; masks and sizes after them), each against central differences
    of sum(y * dy), dy random: AssertionError naming the first with a relative error >= tol."""
    dy = rng.standard_normal(dy_shape)
    loss = lambda: np.sum(forward(**inputs)[0] * dy)
    grads = backward(dy, forward(**inputs)[1])
    grads = (grads,) if isinstance(grads, np.ndarray) else tuple(grads)
    names = [k for k, v in inputs.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
    assert len(grads) <= len(names), f"{len(grads)} gradients for float inputs {names}"
    for name, analytic in zip(names, grads):
        err = rel_err(analytic, numerical_grad(loss, inputs[name]))
        assert err < tol, f"d{name}: relative error {err:.1e}"
