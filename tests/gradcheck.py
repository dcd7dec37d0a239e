"""Central finite differences for the gradient checks (float64 only: in float32 the rounding
error of a difference quotient is ~1e-3 and a wrong backward can hide under it)."""
import numpy as np


def numerical_grad(f, x, eps=1e-6):
    """Central-difference d f() / d x; f reads x, which is nudged in place and restored.
    x: float64 ndarray (any shape); f: () -> float. Returns grad, same shape, float64.
    Raises TypeError unless x is a float64 ndarray: in float32, x + 1e-6 rounds to a
    neighbouring float32 (spacing ~1e-7 near 1) and the quotient can be off by 100%. x is
    never upcast here, since f reads the caller's array in place: a copy would not be seen."""
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
    """Largest absolute difference relative to the largest entry of either array. Raises
    AssertionError naming both shapes when a (what was computed) and b (what it should be)
    differ in shape: no broadcasting hides a transposed or summed-away result."""
    if np.shape(a) != np.shape(b):
        raise AssertionError(f"shape {np.shape(a)}, expected {np.shape(b)}")
    return np.abs(a - b).max() / max(np.abs(a).max(), np.abs(b).max(), 1e-12)


def layer_errors(forward, backward, inputs, dy_shape, rng):
    """Relative error of each gradient of one forward/backward pair against numerical_grad,
    every element. forward(**inputs) -> (y, cache); backward(dy, cache) -> the gradients of
    forward's float arrays in argument order (one array, or a tuple); arguments after the last
    gradient (masks, attention biases, sizes) are constants. dy: random of dy_shape drawn from
    rng, so the loss sum(y * dy) has no accidental zero gradient. Returns {input name: error}.
    Raises AssertionError for a wrong number of gradients or a wrong shape."""
    dy = rng.standard_normal(dy_shape)
    loss = lambda: np.sum(forward(**inputs)[0] * dy)
    grads = backward(dy, forward(**inputs)[1])
    grads = (grads,) if isinstance(grads, np.ndarray) else tuple(grads)
    names = [k for k, v in inputs.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
    assert len(grads) <= len(names), f"{len(grads)} gradients for float inputs {names}"
    errors = {}
    for name, analytic in zip(names, grads):
        assert np.shape(analytic) == inputs[name].shape, \
            f"d{name}: shape {np.shape(analytic)}, expected {inputs[name].shape} (as {name}'s)"
        errors[name] = rel_err(analytic, numerical_grad(loss, inputs[name]))
    return errors


def check_layer(forward, backward, inputs, dy_shape, rng, tol=1e-7):
    """layer_errors, then AssertionError naming the first input whose relative error is >= tol."""
    for name, err in layer_errors(forward, backward, inputs, dy_shape, rng).items():
        assert err < tol, f"d{name}: relative error {err:.1e}"
