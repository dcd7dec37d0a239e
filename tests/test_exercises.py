"""The course kit's grader: each exercise's own tests, in the order of docs/course.md.

`pytest -m exercise4` (or `python -m minialign grade 4`) runs exercise 4's alone. A test of
exercise N calls exercise N's code and, at most, the earlier exercises pyproject.toml's marker
lists as its needs (`exercise5: attention backward (needs 1)`); the kit's own tests
(tests/test_course.py) check that every test here fails on its exercise's stub and passes
with only that exercise and its needs solved. Only finite differences in float64, values
worked out by hand, and tolerances: never digests, so any correct solution passes, whatever
order it rounds in. `graded` records each relative error for grade's table.
"""
import math

import numpy as np
import pytest
from gradcheck import layer_errors, numerical_grad, rel_err

from minialign import layers, losses, metrics, objectives, optim
from minialign.tokenizer import BOS, EOS, MASK, PAD

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
