"""The course kit's grader: each exercise's own tests, in the order of docs/course.md.

`pytest -m exercise4` (or `python -m minialign grade 4`) runs exercise 4's alone. A test of
exercise N calls exercise N's code and, at most, the earlier exercises pyproject.toml's marker
lists as its needs (`exercise5: attention backward (needs 1)`); the kit's own tests
(tests/test_course.py) check that every test here fails on its exercise's stub and passes
with only that exercise and its needs solved. Only finite differences in float64, values
worked out by hand or by an independent formula written here (float32 runs to float32
rounding), and tolerances: never digests,
so any correct solution passes, whatever order it rounds in. `graded` records each relative
error for grade's table.

A finite difference checks a backward against the student's OWN forward, so every exercise
also has a value check on inputs where the usual mistakes give another number (non-zero
means, D >= 3, N small enough that N and N - 1 differ, stds on both sides of VICReg's hinge,
k >= 2 with partial overlaps, rows of different norms, every special token), a float32 run
whose outputs must stay float32, and a check that no input is written to.
tests/test_course_mutations.py proves it: plausible wrong bodies of each exercise must fail.
"""
import math

import numpy as np
import pytest
from gradcheck import layer_errors, numerical_grad, rel_err

from minialign import layers, losses, metrics, objectives, optim
from minialign.tokenizer import BOS, EOS, MASK, PAD, UNK

GRAD_TOL = 1e-7    # central differences in float64 (eps 1e-6): a right backward is ~1e-9
VALUE_TOL = 1e-12  # a value worked out by hand, up to float64 rounding


@pytest.fixture
def graded(record_property):
    """graded(what, err, tol): record err (grade's "max rel err" column), then assert it is
    below tol, naming `what`."""
    def check(what, err, tol):
        record_property("rel_err", float(err))
        assert err < tol, f"{what}: relative error {err:.1e} (tolerance {tol:.0e})"
    return check


def check_all(graded, errors, tol=GRAD_TOL):
    for name, err in errors.items():
        graded(f"d{name}", err, tol)


class Untouched:
    """with Untouched(dy=dy, cache=cache, ...): assert, on leaving, that no array among the
    named inputs (or inside one, a tuple such as a cache) was written to."""

    def __init__(self, **inputs):
        self.arrays = [(name, a) for name, obj in inputs.items() for a in arrays_in(obj)]

    def __enter__(self):
        self.saved = [np.array(a, copy=True) for _, a in self.arrays]

    def __exit__(self, *exc):
        if exc[0] is None:
            for (name, a), saved in zip(self.arrays, self.saved):
                assert np.array_equal(a, saved), \
                    f"{name} was written to: never modify an input (compute into a new array)"


def arrays_in(obj):
    """Every ndarray in obj, an array or a (nested) tuple or list."""
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from arrays_in(item)


def check_float32(graded, got, expected, tol=1e-5):
    """got (a float32 run) keeps float32 and matches expected (float64) to tol, per name."""
    for name, value in got.items():
        assert value.dtype == np.float32, \
            f"{name}: dtype {value.dtype}, expected float32 (float32 in, float32 out)"
        assert value.shape == expected[name].shape, \
            f"{name}: shape {value.shape}, expected {expected[name].shape}"
        graded(f"{name} in float32", rel_err(value.astype(np.float64), expected[name]), tol)


# ---------------------------------------------------------------- 1. linear backward
@pytest.mark.exercise1
def test_linear_backward_finite_differences(graded):
    rng = np.random.default_rng(0)
    for shape in [(5, 4), (2, 3, 4)]:                 # rows, and a (B, T, D_in) batch
        inputs = dict(x=rng.standard_normal(shape), w=rng.standard_normal((4, 3)),
                      b=rng.standard_normal(3))
        check_all(graded, layer_errors(layers.linear_forward, layers.linear_backward, inputs,
                                       shape[:-1] + (3,), rng))


@pytest.mark.exercise1
def test_linear_backward_by_hand(graded):
    # y = x w + b with x = [[1, 2]], w = [[1, 0, 2], [0, 1, 3]]; dy = [[1, 10, 100]]
    x, w = np.array([[1.0, 2.0]]), np.array([[1.0, 0.0, 2.0], [0.0, 1.0, 3.0]])
    dx, dw, db = layers.linear_backward(np.array([[1.0, 10.0, 100.0]]), (x, w))
    graded("dx", rel_err(dx, np.array([[201.0, 310.0]])), VALUE_TOL)      # dy w^T
    graded("dw", rel_err(dw, np.array([[1.0, 10.0, 100.0], [2.0, 20.0, 200.0]])), VALUE_TOL)
    graded("db", rel_err(db, np.array([1.0, 10.0, 100.0])), VALUE_TOL)   # dy summed over rows


@pytest.mark.exercise1
def test_linear_backward_float32_against_einsum(graded):
    """A (B, T, D_in) batch with a non-zero mean, a non-square w, in float32: the gradients stay
    float32 and match the sums written out with einsum; neither dy nor the cache is written to."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 3, 4)) + 1.0).astype(np.float32)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    dy = rng.standard_normal((2, 3, 5)).astype(np.float32)
    with Untouched(dy=dy, cache=(x, w)):
        dx, dw, db = layers.linear_backward(dy, (x, w))
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    check_float32(graded, dict(dx=dx, dw=dw, db=db),
                  dict(dx=np.einsum("btj,ij->bti", dy64, w64),      # sum_j dy[b, t, j] w[i, j]
                       dw=np.einsum("bti,btj->ij", x64, dy64),      # summed over every row
                       db=dy64.sum(axis=(0, 1))))


# ---------------------------------------------------------------- 2. GELU backward
@pytest.mark.exercise2
def test_gelu_backward_finite_differences(graded):
    rng = np.random.default_rng(2)
    inputs = dict(x=2 * rng.standard_normal((3, 7)))
    check_all(graded, layer_errors(layers.gelu_forward, layers.gelu_backward, inputs, (3, 7), rng))


@pytest.mark.exercise2
def test_gelu_slope_by_hand(graded):
    # at x = 0: th = 0, so dy/dx = 1/2; far out it is the identity (1) or flat (0)
    x = np.array([0.0, 30.0, -30.0])
    dx = layers.gelu_backward(np.ones(3), layers.gelu_forward(x)[1])
    graded("dx at 0, +30, -30", rel_err(dx, np.array([0.5, 1.0, 0.0])), VALUE_TOL)


@pytest.mark.exercise2
def test_gelu_backward_float32_against_the_derivative(graded):
    """float32 in, float32 out, against the derivative written with sech^2 = 1 / cosh^2 in
    float64; dy and the cache are not written to."""
    rng = np.random.default_rng(4)
    x = np.concatenate([1.5 * rng.standard_normal(10), [-3.0, -1.0, 0.5, 2.5]])
    x = x.reshape(2, 7).astype(np.float32)
    dy = rng.standard_normal((2, 7)).astype(np.float32)
    _, cache = layers.gelu_forward(x)
    with Untouched(dy=dy, cache=cache):
        dx = layers.gelu_backward(dy, cache)
    x64, c, a = x.astype(np.float64), layers.GELU_C, layers.GELU_A
    u = c * (x64 + a * x64**3)
    slope = 0.5 * (1 + np.tanh(u)) + 0.5 * x64 * c * (1 + 3 * a * x64**2) / np.cosh(u) ** 2
    check_float32(graded, dict(dx=dx), dict(dx=dy.astype(np.float64) * slope))


# ---------------------------------------------------------------- 3. mean pooling
@pytest.mark.exercise3
def test_mean_pool_by_hand(graded):
    h = np.array([[1.0, 2.0], [3.0, 6.0], [1.0, 1.0], [2.0, 2.0], [6.0, 3.0]])   # (5, 2)
    seq = np.array([0, 0, 1, 1, 1])                        # sequence 2 has no real token
    z, _ = layers.mean_pool_forward(h, seq, 3)
    graded("z", rel_err(z, np.array([[2.0, 4.0], [3.0, 2.0], [0.0, 0.0]])), VALUE_TOL)


@pytest.mark.exercise3
def test_mean_pool_backward_reads_its_cache(graded):
    """mean_pool_backward (given) reads the cache your forward returns: (P,)."""
    rng = np.random.default_rng(4)
    seq = np.array([1, 0, 0, 1, 1, 1])                     # rows of a sequence need not be adjacent
    inputs = dict(h=rng.standard_normal((6, 2)), seq=seq, n_seqs=3)
    check_all(graded, layer_errors(layers.mean_pool_forward, layers.mean_pool_backward, inputs,
                                   (3, 2), rng))


@pytest.mark.exercise3
def test_mean_pool_float32_against_a_loop(graded):
    """Rows of a sequence scattered, sequences of 2, 1 and 4 rows, empty ones in the middle and
    at the end, in float32: z stays float32, row b the mean of sequence b's rows (a loop here);
    h is not written to; the given backward (P^T dz) gives each row 1 / n_b, in float32."""
    rng = np.random.default_rng(5)
    h = (rng.standard_normal((7, 3)) + 2.0).astype(np.float32)
    seq = np.array([3, 0, 3, 1, 3, 0, 3])                  # sequences 2 and 4 have no row
    with Untouched(h=h, seq=seq):
        z, cache = layers.mean_pool_forward(h, seq, 5)
    h64 = h.astype(np.float64)
    expected = np.array([h64[seq == b].mean(axis=0) if (seq == b).any() else np.zeros(3)
                         for b in range(5)])
    dh = layers.mean_pool_backward(np.ones((5, 3), np.float32), cache)
    n_b = np.array([2, 1, 0, 4, 0])[seq]                   # (7,) rows of each row's sequence
    check_float32(graded, dict(z=z, dh=dh),
                  dict(z=expected, dh=np.repeat(1.0 / n_b[:, None], 3, axis=1)))


# ---------------------------------------------------------------- 4. LayerNorm backward
@pytest.mark.exercise4
def test_layernorm_backward_finite_differences(graded):
    rng = np.random.default_rng(1)
    for shape in [(4, 5), (2, 3, 5)]:
        inputs = dict(x=rng.standard_normal(shape), gamma=rng.standard_normal(5),
                      beta=rng.standard_normal(5))
        check_all(graded, layer_errors(layers.layernorm_forward, layers.layernorm_backward,
                                       inputs, shape, rng))


@pytest.mark.exercise4
def test_layernorm_backward_ignores_shifts_and_scales_of_a_row(graded):
    # y does not change when a row is shifted, so dx sums to 0 over each row; with gamma = 1
    # and dy = xhat (a scaling direction) dx is 0 up to eps
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 6))
    y, cache = layers.layernorm_forward(x, np.ones(6), np.zeros(6), eps=0.0)
    dx, _, _ = layers.layernorm_backward(rng.standard_normal((3, 6)), cache)
    graded("sum over a row of dx", np.abs(dx.sum(axis=1)).max(), 1e-12)
    dx, _, _ = layers.layernorm_backward(y, cache)
    graded("dx along xhat", np.abs(dx).max(), 1e-12)


@pytest.mark.exercise4
def test_layernorm_backward_float32_against_the_jacobian(graded):
    """Rows with non-zero means and different spreads, gamma not 1, in float32: dx, dgamma,
    dbeta stay float32 and match dy contracted with LayerNorm's Jacobian written out in
    float64, dy_i/dx_j = gamma_i / sigma (delta_ij - 1/D - xhat_i xhat_j / D); dy and the
    cache are not written to."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 5)) * np.array([0.5, 3.0])[:, None, None] + 2.0
    x, gamma, beta, dy = (a.astype(np.float32) for a in
                          (x, rng.standard_normal(5), rng.standard_normal(5),
                           rng.standard_normal((2, 3, 5))))
    _, cache = layers.layernorm_forward(x, gamma, beta)
    with Untouched(dy=dy, cache=cache):
        dx, dgamma, dbeta = layers.layernorm_backward(dy, cache)
    x64, g64, dy64, D = x.astype(np.float64), gamma.astype(np.float64), dy.astype(np.float64), 5
    xc = x64 - x64.mean(axis=-1, keepdims=True)                           # (2, 3, D)
    sigma = np.sqrt((xc**2).mean(axis=-1, keepdims=True) + layers.LN_EPS)  # (2, 3, 1)
    xhat = xc / sigma
    jac = g64[:, None] / sigma[..., None] * (np.eye(D) - 1 / D
                                             - xhat[..., :, None] * xhat[..., None, :] / D)
    check_float32(graded, dict(dx=dx, dgamma=dgamma, dbeta=dbeta),
                  dict(dx=np.einsum("bti,btij->btj", dy64, jac),
                       dgamma=(dy64 * xhat).sum(axis=(0, 1)), dbeta=dy64.sum(axis=(0, 1))),
                  tol=1e-4)


# ---------------------------------------------------------------- 5. attention backward
@pytest.mark.exercise5
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_finite_differences(graded, causal):
    """With padding (keys after a caption's end hidden) and, causal, the future hidden."""
    rng = np.random.default_rng(7)
    B, T, D, H = 3, 4, 6, 2
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=bool)
    inputs = dict(x=rng.standard_normal((B, T, D)), w_qkv=rng.standard_normal((D, 3 * D)) / 2,
                  b_qkv=rng.standard_normal(3 * D), w_o=rng.standard_normal((D, D)) / 2,
                  b_o=rng.standard_normal(D), bias=layers.attention_bias(mask, causal, np.float64),
                  n_heads=H)
    check_all(graded, layer_errors(layers.mha_forward, layers.mha_backward, inputs, (B, T, D),
                                   rng))


@pytest.mark.exercise5
def test_attention_backward_float32_matches_float64(graded):
    """The padded, causal batch in float32: every gradient stays float32 and matches the
    float64 run (which the finite differences check) to float32 rounding; dy and the cache are
    not written to."""
    rng = np.random.default_rng(8)
    B, T, D, H = 2, 4, 6, 3
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=bool)
    x, w_qkv, b_qkv, w_o, b_o, dy = (rng.standard_normal(s) for s in
                                     [(B, T, D), (D, 3 * D), (3 * D,), (D, D), (D,), (B, T, D)])
    grads = {}
    for dtype in (np.float64, np.float32):
        args = [a.astype(dtype) for a in (x, w_qkv / 2, b_qkv, w_o / 2, b_o)]
        _, cache = layers.mha_forward(*args, layers.attention_bias(mask, True, dtype), H)
        dy_in = dy.astype(dtype)
        with Untouched(dy=dy_in, cache=cache):
            grads[dtype] = layers.mha_backward(dy_in, cache)
    names = ["dx", "dw_qkv", "db_qkv", "dw_o", "db_o"]
    check_float32(graded, dict(zip(names, grads[np.float32])), dict(zip(names, grads[np.float64])),
                  tol=1e-4)


# ---------------------------------------------------------------- 6. VICReg variance term
@pytest.mark.exercise6
def test_variance_term_by_hand(graded):
    # dim 0: values 0, 2 -> unbiased variance 2, std above 1: no hinge; dim 1: constant ->
    # std = sqrt(1e-4) = 0.01, hinge 0.99; mean over the 2 dims: 0.495
    v, _ = losses._variance_term(np.array([[0.0, 5.0], [2.0, 5.0]]))
    graded("v", rel_err(np.array(v), np.array(0.495)), VALUE_TOL)


@pytest.mark.exercise6
def test_variance_term_finite_differences(graded):
    rng = np.random.default_rng(0)
    z = rng.standard_normal((6, 4)) * np.array([0.3, 2.0, 0.8, 1.5])  # hinge on for some dims
    _, dz = losses._variance_term(z)
    graded("dz", rel_err(dz, numerical_grad(lambda: losses._variance_term(z)[0], z)), GRAD_TOL)


@pytest.mark.exercise6
def test_variance_term_on_both_sides_of_the_hinge(graded):
    # N = 3 rows with non-zero means. dim 0: 10, 11, 12: unbiased variance 1, std
    # sqrt(1.0001) > 1, no hinge (divided by N = 3 it would be 0.82, a hinge of 0.18);
    # dim 1: 5, 5.5, 6: variance 0.25, hinge 1 - sqrt(0.2501); dim 2: constant 3: 0.99
    z = np.array([[10.0, 5.0, 3.0], [11.0, 5.5, 3.0], [12.0, 6.0, 3.0]])
    with Untouched(z=z):
        v, dz = losses._variance_term(z)
    graded("v", rel_err(np.array(v), np.array((1 - math.sqrt(0.2501) + 0.99) / 3)), VALUE_TOL)
    # only dim 1 pulls: dv/dz_i1 = -(1/D) (z_i1 - 5.5) / ((N - 1) std_1); dim 0 is above the
    # hinge, dim 2 has no spread to push
    expected = np.zeros((3, 3))
    expected[:, 1] = -np.array([-0.5, 0.0, 0.5]) / (3 * 2 * math.sqrt(0.2501))
    graded("dz", rel_err(dz, expected), VALUE_TOL)


@pytest.mark.exercise6
def test_variance_term_float32(graded):
    """float32 in, float32 dz out, against np.std(ddof=1) in float64; z is not written to."""
    rng = np.random.default_rng(9)
    z = rng.standard_normal((5, 4)) * np.array([0.3, 2.0, 0.8, 1.5]) + 1.0
    z32 = z.astype(np.float32)
    with Untouched(z=z32):
        v, dz = losses._variance_term(z32)
    z = z32.astype(np.float64)
    std = np.sqrt(z.var(axis=0, ddof=1) + losses.VICREG_VAR_EPS)              # (D,)
    pulls = (std < 1.0) / 4                                                   # (D,)
    check_float32(graded, dict(dz=dz), dict(dz=-pulls * (z - z.mean(axis=0)) / (4 * std)))
    graded("v in float32", rel_err(np.array(v, np.float64),
                                   np.array(np.maximum(1.0 - std, 0.0).mean())), 1e-5)


# ---------------------------------------------------------------- 7. VICReg covariance term
@pytest.mark.exercise7
def test_covariance_term_by_hand(graded):
    # zc = z (mean 0): C = zc^T zc / (N - 1) = [[1, 1], [1, 1]]: off-diagonal 1 and 1 -> 2 / D = 1
    c, _ = losses._covariance_term(np.array([[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]]))
    graded("c", rel_err(np.array(c), np.array(1.0)), VALUE_TOL)


@pytest.mark.exercise7
def test_covariance_term_finite_differences(graded):
    rng = np.random.default_rng(1)
    z = rng.standard_normal((5, 4)) + 0.5 * rng.standard_normal((5, 1))   # correlated dims
    _, dz = losses._covariance_term(z)
    graded("dz", rel_err(dz, numerical_grad(lambda: losses._covariance_term(z)[0], z)), GRAD_TOL)


@pytest.mark.exercise7
def test_whole_vicreg_loss_finite_differences(graded):
    """The three terms together (losses.vicreg_loss, given): the paper's eq. 6."""
    rng = np.random.default_rng(2)
    z_a = rng.standard_normal((6, 4)) * np.array([0.3, 2.0, 0.8, 1.5])
    z_b = z_a + 0.5 * rng.standard_normal((6, 4))
    _, (dz_a, dz_b), _ = losses.vicreg_loss(z_a, z_b)
    loss = lambda: losses.vicreg_loss(z_a, z_b)[0]
    graded("dz_a", rel_err(dz_a, numerical_grad(loss, z_a)), GRAD_TOL)
    graded("dz_b", rel_err(dz_b, numerical_grad(loss, z_b)), GRAD_TOL)


@pytest.mark.exercise7
def test_covariance_term_by_hand_with_non_zero_means(graded):
    # column means 2, 4, 5 -> zc = [[-1, -2, 2], [2, -2, -1], [-1, 4, -1]]; C = zc^T zc / 2:
    # C01 = (2 - 4 - 4) / 2 = -3, C02 = (-2 - 2 + 1) / 2 = -1.5, C12 = (-4 + 2 - 4) / 2 = -3;
    # each twice: 2 (9 + 2.25 + 9) / D = 13.5
    z = np.array([[1.0, 2.0, 7.0], [4.0, 2.0, 4.0], [1.0, 8.0, 4.0]])
    with Untouched(z=z):
        c, _ = losses._covariance_term(z)
    graded("c", rel_err(np.array(c), np.array(13.5)), VALUE_TOL)


def covariance_by_loop(z):
    """sum over pairs j != k of C_jk^2 / D, C_jk = sum_i (z_ij - m_j)(z_ik - m_k) / (N - 1)."""
    N, D = z.shape
    m = [sum(z[i, j] for i in range(N)) / N for j in range(D)]
    return sum((sum((z[i, j] - m[j]) * (z[i, k] - m[k]) for i in range(N)) / (N - 1)) ** 2
               for j in range(D) for k in range(D) if j != k) / D


@pytest.mark.exercise7
def test_covariance_term_float32_against_a_loop(graded):
    """float32 in, float32 dz out: c against the loop above, dz against its finite
    differences in float64; z is not written to."""
    rng = np.random.default_rng(10)
    z = rng.standard_normal((5, 4)) + 0.5 * rng.standard_normal((5, 1)) + 2.0
    z32 = z.astype(np.float32)
    with Untouched(z=z32):
        c, dz = losses._covariance_term(z32)
    z = z32.astype(np.float64)
    check_float32(graded, dict(dz=dz), dict(dz=numerical_grad(lambda: covariance_by_loop(z), z)))
    graded("c in float32", rel_err(np.array(c, np.float64), np.array(covariance_by_loop(z))), 1e-5)


# ---------------------------------------------------------------- 8. cross-entropy
@pytest.mark.exercise8
def test_cross_entropy_by_hand(graded):
    logits = np.array([[0.0, 0.0, np.log(2.0)], [1.0, 1.0, 1.0]])
    loss, dlogits, stats = losses.cross_entropy(logits, np.array([2, 0]))
    # row 0: softmax [1/4, 1/4, 1/2], -log(1/2); row 1: uniform over 3, -log(1/3); mean of two
    graded("loss", rel_err(np.array(loss), np.array((math.log(2) + math.log(3)) / 2)), VALUE_TOL)
    graded("dlogits", rel_err(dlogits, np.array([[0.125, 0.125, -0.25],
                                                 [-1 / 3, 1 / 6, 1 / 6]])), VALUE_TOL)
    assert stats == {"ce": loss, "targets": 2}


@pytest.mark.exercise8
def test_cross_entropy_finite_differences_and_no_overflow(graded):
    rng = np.random.default_rng(1)
    logits, targets = 3 * rng.standard_normal((5, 7)), rng.integers(0, 7, size=5)
    dlogits = losses.cross_entropy(logits, targets)[1]
    err = rel_err(dlogits, numerical_grad(lambda: losses.cross_entropy(logits, targets)[0], logits))
    graded("dlogits", err, GRAD_TOL)
    loss, dlogits, _ = losses.cross_entropy(np.array([[1000.0, 0.0]]), np.array([0]))
    assert np.isfinite(loss) and np.isfinite(dlogits).all(), "exp(1000) overflowed"


@pytest.mark.exercise8
def test_cross_entropy_float32_against_the_formula(graded):
    """4 targets over 6 classes (some repeated), logits far from 0, in float32: dlogits stays
    float32; both outputs against softmax written out in float64; logits not written to."""
    rng = np.random.default_rng(11)
    logits = (3 * rng.standard_normal((4, 6)) + 5.0).astype(np.float32)
    targets = np.array([5, 0, 0, 3])
    with Untouched(logits=logits, targets=targets):
        loss, dlogits, stats = losses.cross_entropy(logits, targets)
    e = np.exp(logits.astype(np.float64))
    p = e / e.sum(axis=1, keepdims=True)                                      # (4, 6)
    check_float32(graded, dict(dlogits=dlogits), dict(dlogits=(p - np.eye(6)[targets]) / 4))
    graded("loss", rel_err(np.array(loss), np.array(-np.log(p[np.arange(4), targets]).mean())),
           1e-6)
    assert stats == {"ce": loss, "targets": 4}


# ---------------------------------------------------------------- 9. AdamW step
@pytest.mark.exercise9
def test_adamw_two_steps_by_hand(graded):
    params = {"blocks.0.attn.w_o": np.array([1.0, -2.0]), "ln_f.beta": np.array([0.5])}
    arrays = dict(params)
    state = optim.adam_init(params)
    lr, wd, b1, b2, eps = 0.1, 0.5, 0.9, 0.999, 1e-8
    g1 = {"blocks.0.attn.w_o": np.array([0.5, -1.0]), "ln_f.beta": np.array([2.0])}
    g2 = {"blocks.0.attn.w_o": np.array([-0.5, 2.0]), "ln_f.beta": np.array([0.0])}
    optim.adam_step(params, g1, state, lr, weight_decay=wd)
    optim.adam_step(params, g2, state, lr, weight_decay=wd)

    def by_hand(p, ga, gb, decay):    # Loshchilov & Hutter 2019, Algorithm 2, twice
        m, v = (1 - b1) * ga, (1 - b2) * ga ** 2
        p = p * (1 - lr * wd if decay else 1.0)
        p = p - lr * (m / (1 - b1)) / (math.sqrt(v / (1 - b2)) + eps)
        m, v = b1 * m + (1 - b1) * gb, b2 * v + (1 - b2) * gb ** 2
        p = p * (1 - lr * wd if decay else 1.0)
        return p - lr * (m / (1 - b1 ** 2)) / (math.sqrt(v / (1 - b2 ** 2)) + eps)
    expected = np.array([by_hand(1.0, 0.5, -0.5, True), by_hand(-2.0, -1.0, 2.0, True)])
    graded("decayed weights", rel_err(params["blocks.0.attn.w_o"], expected), VALUE_TOL)
    graded("no decay", rel_err(params["ln_f.beta"], np.array([by_hand(0.5, 2.0, 0.0, False)])),
           VALUE_TOL)
    assert state["t"] == 2
    assert all(params[k] is arrays[k] for k in params), "update the arrays in place"


def adamw_by_hand(p, gs, decay, lr, wd, b1, b2, eps):
    """Loshchilov & Hutter 2019, Algorithm 2, over the gradients gs, in float64."""
    p, m, v = np.array(p, np.float64), 0.0, 0.0
    for t, g in enumerate(gs, start=1):
        g = np.array(g, np.float64)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        if decay:
            p = p - lr * wd * p
        p = p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return p


@pytest.mark.exercise9
@pytest.mark.parametrize("decay_embeddings", [False, True])
def test_adamw_every_option_in_float32(graded, decay_embeddings):
    """Three steps on float32 arrays with beta1, beta2 and eps not the defaults (eps large
    enough that where it goes matters) and decay_embeddings off and on: the update stays
    float32 and in place, and the gradients are not written to."""
    start = {"tok_emb": [1.0, -0.5], "blocks.0.mlp.w_in": [2.0, 0.25], "ln_f.gamma": [1.5, -1.0]}
    steps = [{"tok_emb": [0.5, -1.0], "blocks.0.mlp.w_in": [-0.3, 2.0], "ln_f.gamma": [1.0, 0.05]},
             {"tok_emb": [-0.2, 0.4], "blocks.0.mlp.w_in": [0.6, -1.5], "ln_f.gamma": [0.0, 0.3]},
             {"tok_emb": [0.1, 0.1], "blocks.0.mlp.w_in": [0.0, 0.5], "ln_f.gamma": [-0.7, 0.2]}]
    options = dict(lr=0.05, wd=0.3, b1=0.8, b2=0.95, eps=1e-2)
    params = {k: np.array(v, np.float32) for k, v in start.items()}
    arrays = dict(params)
    state = optim.adam_init(params)
    for step in steps:
        grads = {k: np.array(g, np.float32) for k, g in step.items()}
        with Untouched(grads=list(grads.values())):
            optim.adam_step(params, grads, state, options["lr"], weight_decay=options["wd"],
                            decay_embeddings=decay_embeddings, beta1=options["b1"],
                            beta2=options["b2"], eps=options["eps"])
    for name in start:
        decayed = name == "blocks.0.mlp.w_in" or (decay_embeddings and name == "tok_emb")
        expected = adamw_by_hand(start[name], [s[name] for s in steps], decayed, **options)
        assert params[name] is arrays[name], "update the arrays in place"
        check_float32(graded, {name: params[name], f"m of {name}": state["m"][name]},
                      {name: expected, f"m of {name}": state["m"][name].astype(np.float64)})


# ---------------------------------------------------------------- 10. masking words
@pytest.mark.exercise10
def test_mask_words_follows_the_draws():
    """Position (b, t) is masked when it holds a word and u[b, t] < rate, u = rng.random of
    tokens' shape (one draw per position, the docstring's order)."""
    tokens = np.array([[BOS, 5, 6, 7, 8, EOS, PAD, PAD]] * 40, np.int32)
    u = np.random.default_rng(0).random(tokens.shape)
    expected = np.where((tokens >= 5) & (u < 0.25), MASK, tokens)
    masked = objectives.mask_words(tokens, 0.25, np.random.default_rng(0))
    np.testing.assert_array_equal(masked, expected)
    assert masked.dtype == tokens.dtype and tokens[0, 1] == 5   # same dtype, input untouched


@pytest.mark.exercise10
def test_mask_words_keeps_one_word():
    # at a rate near 1 every caption keeps exactly one word: the one with the largest draw
    two = np.array([[BOS, 9, 10, EOS, PAD]] * 50, np.int32)
    u = np.random.default_rng(2).random(two.shape)
    masked = objectives.mask_words(two, 0.999, np.random.default_rng(2))
    kept = np.where(u[:, 1] > u[:, 2], 1, 2)                            # (50,) column kept
    np.testing.assert_array_equal(masked[np.arange(50), kept], two[np.arange(50), kept])
    assert ((masked[:, 1:3] == MASK).sum(axis=1) == 1).all()
    one = np.array([[BOS, 9, EOS, PAD]] * 10, np.int32)
    np.testing.assert_array_equal(objectives.mask_words(one, 0.999, np.random.default_rng(1)), one)


@pytest.mark.exercise10
@pytest.mark.parametrize("rate", [0.25, 0.7])
def test_mask_words_against_a_loop(rate):
    """Every special token in the input (UNK, MASK, BOS, EOS, PAD are never masked), captions
    of 0 to 5 words: the same masks as a loop over the draws u = rng.random(tokens.shape),
    the keep-one rule included; int32 stays int32; tokens is not written to."""
    tokens = np.array([[BOS, 5, UNK, 6, 7, MASK, 8, EOS, PAD],
                       [BOS, UNK, EOS, PAD, PAD, PAD, PAD, PAD, PAD],     # no word at all
                       [BOS, 9, EOS, PAD, PAD, PAD, PAD, PAD, PAD],       # one word
                       [BOS, 10, 11, UNK, 12, 13, 14, EOS, PAD]] * 10, np.int32)
    u = np.random.default_rng(3).random(tokens.shape)
    expected = tokens.copy()
    for b, row in enumerate(tokens):
        words = [t for t, token in enumerate(row) if token >= 5]
        masked = [t for t in words if u[b, t] < rate]
        if words and len(masked) == len(words):                           # keep the largest draw
            masked.remove(max(words, key=lambda t: u[b, t]))
        expected[b, masked] = MASK
    with Untouched(tokens=tokens):
        got = objectives.mask_words(tokens, rate, np.random.default_rng(3))
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.int32


# ---------------------------------------------------------------- 11. next-token targets
@pytest.mark.exercise11
def test_next_token_targets_by_hand():
    tokens = np.array([[BOS, 7, 8, EOS, PAD], [BOS, 9, EOS, PAD, PAD]])
    targets, has_target = objectives.next_token_targets(tokens)
    # the packed rows are BOS 7 8 EOS | BOS 9 EOS; each predicts the next one, EOS nothing
    np.testing.assert_array_equal(targets, [7, 8, EOS, PAD, 9, EOS, PAD])
    np.testing.assert_array_equal(has_target, [1, 1, 1, 0, 1, 1, 0])


@pytest.mark.exercise11
def test_next_token_targets_of_a_full_row():
    tokens = np.array([[BOS, 5, 6, EOS]])                  # no padding: the last one is EOS
    targets, has_target = objectives.next_token_targets(tokens)
    np.testing.assert_array_equal(targets[has_target], [5, 6, EOS])
    assert targets.shape == has_target.shape == (4,)


@pytest.mark.exercise11
def test_next_token_targets_with_unk_and_an_empty_caption():
    """UNK is a word to predict like any other; a caption with no word (BOS EOS) has one
    target, EOS; tokens is not written to."""
    tokens = np.array([[BOS, 7, UNK, 8, EOS, PAD],
                       [BOS, EOS, PAD, PAD, PAD, PAD],
                       [BOS, UNK, 9, 9, 10, EOS]], np.int32)
    with Untouched(tokens=tokens):
        targets, has_target = objectives.next_token_targets(tokens)
    # packed: BOS 7 UNK 8 EOS | BOS EOS | BOS UNK 9 9 10 EOS
    np.testing.assert_array_equal(targets[has_target], [7, UNK, 8, EOS, EOS, UNK, 9, 9, 10, EOS])
    np.testing.assert_array_equal(has_target, [1, 1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 0])


# ---------------------------------------------------------------- 12. recall at k
@pytest.mark.exercise12
def test_recall_at_k_by_hand_with_ties():
    sim = np.array([[0.9, 0.9, 0.1, 0.0],    # tie with j=1, but 1 > 0: rank 0
                    [0.5, 0.5, 0.2, 0.7],    # j=3 higher, j=0 tied with a lower index: rank 2
                    [0.3, 0.1, 0.3, 0.3],    # j=0 tied lower (counts), j=3 tied higher: rank 1
                    [0.8, 0.9, 0.95, 0.1]])  # all three higher: rank 3
    assert metrics.recall_at_k(sim, ks=(1, 2, 3, 4)) == {"R@1": 0.25, "R@2": 0.5, "R@3": 0.75,
                                                         "R@4": 1.0}


@pytest.mark.exercise12
def test_recall_at_k_more_gallery_than_queries():
    sim = np.array([[0.2, 0.1, 0.3],
                    [0.0, 0.5, 0.4]])        # 2 queries, 3 gallery items: ranks 1, 0
    assert metrics.recall_at_k(sim, ks=(1, 2)) == {"R@1": 0.5, "R@2": 1.0}


@pytest.mark.exercise12
def test_recall_at_k_default_ks_against_a_loop():
    """12 queries, 15 gallery items, many exact ties (values rounded to 0.1), the default ks
    (1, 5, 10): ranks counted by a loop here; sim is not written to."""
    rng = np.random.default_rng(12)
    sim = np.round(rng.standard_normal((12, 15)) + np.eye(12, 15) * rng.uniform(0, 2, (12, 1)), 1)
    rank = np.array([sum(sim[i, j] > sim[i, i] or (sim[i, j] == sim[i, i] and j < i)
                         for j in range(15)) for i in range(12)])
    with Untouched(sim=sim):
        got = metrics.recall_at_k(sim)
    assert got == {f"R@{k}": float(np.mean(rank < k)) for k in (1, 5, 10)}


# ---------------------------------------------------------------- 13. mutual k-NN
def on_circle(degrees):
    t = np.deg2rad(np.asarray(degrees, dtype=np.float64))                    # (N,)
    return np.stack([np.cos(t), np.sin(t)], axis=1)                          # (N, 2)


@pytest.mark.exercise13
def test_mutual_knn_by_hand(graded):
    # k = 1. A: 0, 10, 90, 100 degrees -> nearest 1, 0, 3, 2; B: 0, 10, 90, 45 -> 1, 0, 3, 1
    a, b = on_circle([0, 10, 90, 100]), on_circle([0, 10, 90, 45])
    graded("k = 1", rel_err(np.array(metrics.mutual_knn(a, b, k=1)), np.array(0.75)), VALUE_TOL)
    # k = 3 of N = 4: everyone else, whatever the space
    graded("k = N - 1", rel_err(np.array(metrics.mutual_knn(a, b, k=3)), np.array(1.0)), VALUE_TOL)


@pytest.mark.exercise13
def test_mutual_knn_same_and_shuffled_spaces():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((60, 8))
    q, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    assert metrics.mutual_knn(a, 3.0 * a @ q, k=5) == 1.0            # a rotation keeps neighbours
    shuffled = metrics.mutual_knn(a, rng.standard_normal((60, 8)), k=5)
    assert shuffled < 0.3                                            # chance: 5 / 59 = 0.085


def knn_by_loop(x, k):
    """Each row's k nearest other rows by cosine similarity (ties to the lower index), as sets."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    return [set(sorted((j for j in range(len(x)) if j != i),
                       key=lambda j: (-float(unit[i] @ unit[j]), j))[:k]) for i in range(len(x))]


@pytest.mark.exercise13
@pytest.mark.parametrize("k", [2, 3])
def test_mutual_knn_against_a_loop(graded, k):
    """Rows of very different norms and non-zero means (Euclidean neighbours are not cosine
    neighbours), D = 3 and 5, k >= 2, partial overlaps: mean_i |knn_A(i) & knn_B(i)| / k with
    the neighbours found by a loop here; A and B are not written to."""
    rng = np.random.default_rng(13)
    a = (rng.standard_normal((9, 3)) + 0.5) * rng.uniform(0.1, 10.0, (9, 1))
    b = a @ rng.standard_normal((3, 5)) + 3.0 * rng.standard_normal((9, 5))
    expected = np.mean([len(sa & sb) / k for sa, sb in zip(knn_by_loop(a, k), knn_by_loop(b, k))])
    assert 0 < expected < 1
    with Untouched(A=a, B=b):
        got = metrics.mutual_knn(a, b, k=k)
    graded("mutual k-NN", rel_err(np.array(got), np.array(expected)), VALUE_TOL)


# ---------------------------------------------------------------- 14. Procrustes rotation
@pytest.mark.exercise14
def test_fit_rotation_recovers_a_rotation(graded):
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((7, 7)))
    w_true = q[:3]                                                   # (3, 7), rows orthonormal
    z = rng.standard_normal((40, 3))
    w = metrics.fit_rotation(z, z @ w_true)
    graded("W", rel_err(w, w_true), 1e-10)
    graded("W W^T - I", np.abs(w @ w.T - np.eye(3)).max(), 1e-12)


@pytest.mark.exercise14
def test_fit_rotation_beats_nearby_rotations(graded):
    """On noisy pairs no other orthogonal map fits better: perturb W by small rotations."""
    rng = np.random.default_rng(1)
    z, img = rng.standard_normal((30, 4)), rng.standard_normal((30, 4))
    w = metrics.fit_rotation(z, img)
    graded("W W^T - I", np.abs(w @ w.T - np.eye(4)).max(), 1e-12)
    best = np.linalg.norm(z @ w - img)
    for _ in range(20):
        a = 0.05 * rng.standard_normal((4, 4))
        turn, _ = np.linalg.qr(np.eye(4) + a - a.T)                   # a rotation near I
        assert np.linalg.norm(z @ (w @ turn) - img) >= best - 1e-12


@pytest.mark.exercise14
def test_fit_rotation_against_the_polar_factor(graded):
    """Noisy pairs, non-zero means, rows of different norms, D = 3 < D_img = 5: W is the
    orthogonal polar factor of M = z^T img, (M M^T)^(-1/2) M, computed here with eigh; the
    inputs are taken as given (prepare_for_rotation centres and normalises, not this)."""
    rng = np.random.default_rng(14)
    z = rng.standard_normal((20, 3)) * rng.uniform(0.2, 3.0, (20, 1)) + 1.0
    img = z @ rng.standard_normal((3, 5)) + rng.standard_normal((20, 5)) + 0.5
    with Untouched(z=z, img=img):
        w = metrics.fit_rotation(z, img)
    m = z.T @ img                                                         # (3, 5)
    lam, q = np.linalg.eigh(m @ m.T)                                      # (3,), (3, 3)
    graded("W", rel_err(w, q @ np.diag(lam ** -0.5) @ q.T @ m), 1e-10)


@pytest.mark.exercise14
def test_fit_rotation_recovers_a_reflection(graded):
    """Procrustes ranges over every orthogonal map: a reflection (det -1) comes back as it
    is, not turned into a proper rotation."""
    rng = np.random.default_rng(15)
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    q[:, 0] *= -np.sign(np.linalg.det(q))                                 # det(q) = -1
    z = rng.standard_normal((25, 4))
    graded("W", rel_err(metrics.fit_rotation(z, z @ q), q), 1e-10)
