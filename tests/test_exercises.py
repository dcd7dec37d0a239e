"""Each exercise's tests (docs/course.md): `pytest -m exercise4` runs exercise 4's alone. A test
of exercise N calls N's code and at most the earlier exercises its marker in pyproject.toml
names ("(needs 1)"). Gradients: central differences in float64; values: by hand or by an
independent formula written here; tolerances, never digests. A finite difference cannot
catch a forward that is consistently wrong (a biased variance, an uncentred covariance), so
each exercise also has a value check on inputs where the usual mistakes give another number
(non-zero means, N and N - 1 differing, D >= 3, both sides of a hinge, ties and duplicated
rows, every special token), a float32 run that must stay float32, and inputs left untouched.
"""
import contextlib
import importlib
import math

import numpy as np
import pytest
from gradcheck import numerical_grad, rel_err

from minialign.tokenizer import BOS, EOS, MASK, PAD, UNK

GRAD_TOL = 1e-7    # central differences in float64 (eps 1e-6): a right backward gives ~1e-9
VALUE_TOL = 1e-12  # a value worked out by hand, up to float64 rounding
F32_TOL = 1e-5     # a float32 run against the float64 formula


class Core:
    """minialign.<name>, imported at first use: a file that does not import fails its tests only."""

    def __init__(self, name):
        self.name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(f"minialign.{self.name}"), attr)


layers, losses, metrics, objectives, optim = (Core(name) for name in
                                              "layers losses metrics objectives optim".split())


def close(what, got, expected, tol):
    err = rel_err(np.asarray(got, np.float64), np.asarray(expected, np.float64))
    assert err < tol, f"{what}: relative error {err:.1e} (tolerance {tol:.0e})"


def attention_weights(rng, D, scale=1.0):
    """An attention block's w_qkv, b_qkv, w_o, b_o for width D, the matrices times scale."""
    return dict(w_qkv=rng.standard_normal((D, 3 * D)) * scale, b_qkv=rng.standard_normal(3 * D),
                w_o=rng.standard_normal((D, D)) * scale, b_o=rng.standard_normal(D))


def check_layer(forward, backward, inputs, rng):
    """backward(dy, cache) -> the gradients of forward's float inputs in argument order (one
    array or a tuple; constants such as a mask come after them). In float64 and float32: y and
    each gradient in the inputs' dtype; no input, dy or cache written to. In float64: each
    gradient against central differences of sum(y * dy), dy random; in float32: the float64
    run's to float32 rounding."""
    dy = rng.standard_normal(forward(**inputs)[0].shape)
    names = [k for k, v in inputs.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
    runs = {}
    for dtype in (np.float64, np.float32):
        cast = {k: v.astype(dtype) if k in names else v for k, v in inputs.items()}
        with untouched(**cast):
            y, cache = forward(**cast)
        assert y.dtype == dtype, f"y: dtype {y.dtype} for {dtype.__name__} inputs"
        d = dy.astype(dtype)
        with untouched(dy=d, cache=cache):
            grads = backward(d, cache)
        runs[dtype] = (grads,) if isinstance(grads, np.ndarray) else tuple(grads)
        assert len(runs[dtype]) <= len(names), f"{len(runs[dtype])} gradients for {names}"
    for name, g64, g32 in zip(names, runs[np.float64], runs[np.float32]):
        assert g64.dtype == np.float64, f"d{name}: dtype {g64.dtype} for float64 inputs"
        close(f"d{name}", g64, numerical_grad(lambda: np.sum(forward(**inputs)[0] * dy),
                                              inputs[name]), GRAD_TOL)
        assert g32.dtype == np.float32, f"d{name}: dtype {g32.dtype} (float32 in, float32 out)"
        close(f"d{name} in float32", g32, g64, 1e-4)


@contextlib.contextmanager
def untouched(**inputs):
    """with untouched(dy=dy, cache=cache): on leaving, assert that no array among the named
    inputs (or inside a tuple or list of them) was written to."""
    flat = lambda o: [o] if isinstance(o, np.ndarray) else [   # noqa: E731
        a for i in o for a in flat(i)] if isinstance(o, (tuple, list)) else []
    saved = [(name, a, a.copy()) for name, o in inputs.items() for a in flat(o)]
    yield
    for name, a, copy in saved:
        assert np.array_equal(a, copy), \
            f"{name} was written to: never modify an input (compute into a new array)"


@pytest.mark.exercise1
@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4)])        # rows, and a (B, T, D_in) batch
def test_linear_backward(shape):
    """Non-zero means, a non-square w: dw and db are sums over every row, never means."""
    rng = np.random.default_rng(0)
    check_layer(layers.linear_forward, layers.linear_backward,
                dict(x=rng.standard_normal(shape) + 1.0, w=rng.standard_normal((4, 3)),
                     b=rng.standard_normal(3)), rng)


@pytest.mark.exercise2
def test_gelu_backward():
    rng = np.random.default_rng(2)
    check_layer(layers.gelu_forward, layers.gelu_backward,
                dict(x=2 * rng.standard_normal((3, 7))), rng)
    # at x = 0: th = 0, so the slope is 1/2; far out it is the identity (1) or flat (0)
    x = np.array([0.0, 30.0, -30.0])
    close("slope at 0, +30, -30", layers.gelu_backward(np.ones(3), layers.gelu_forward(x)[1]),
          [0.5, 1.0, 0.0], VALUE_TOL)


@pytest.mark.exercise3
def test_mean_pool_float32_against_a_loop():
    """Rows of a sequence scattered, sequences of 2, 1 and 4 rows, empty ones in the middle
    and at the end, float32: z float32, row b the mean of sequence b's rows (0 if none); h not
    written to; the given backward reads the cache and gives each row 1 / n_b."""
    rng = np.random.default_rng(5)
    h = (rng.standard_normal((7, 3)) + 2.0).astype(np.float32)
    seq = np.array([3, 0, 3, 1, 3, 0, 3])                  # sequences 2 and 4 have no row
    with untouched(h=h, seq=seq):
        z, cache = layers.mean_pool_forward(h, seq, 5)
    h64 = h.astype(np.float64)
    expected = [h64[seq == b].mean(axis=0) if (seq == b).any() else np.zeros(3) for b in range(5)]
    dh = layers.mean_pool_backward(np.ones((5, 3), np.float32), cache)
    n_b = np.array([2, 1, 0, 4, 0])[seq]                   # (7,) rows of each row's sequence
    assert z.dtype == dh.dtype == np.float32, f"z {z.dtype}, dh {dh.dtype} (float32 in and out)"
    close("z", z, expected, F32_TOL)
    close("dh", dh, np.repeat(1.0 / n_b[:, None], 3, axis=1), F32_TOL)


@pytest.mark.exercise4
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5)])
def test_layernorm_backward(shape):
    """Rows with non-zero means and different spreads, gamma not 1."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * rng.uniform(0.5, 3.0, shape[:-1] + (1,)) + 2.0
    check_layer(layers.layernorm_forward, layers.layernorm_backward,
                dict(x=x, gamma=rng.standard_normal(5), beta=rng.standard_normal(5)), rng)


@pytest.mark.exercise5
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward(causal):
    """Padding (keys after a caption's end hidden) and, causal, the future hidden too."""
    rng = np.random.default_rng(7)
    B, T, D, H = 3, 4, 6, 2
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=bool)
    check_layer(layers.mha_forward, layers.mha_backward, dict(
        x=rng.standard_normal((B, T, D)), **attention_weights(rng, D, 0.5),
        bias=layers.attention_bias(mask, causal, np.float64), n_heads=H), rng)


@pytest.mark.exercise6
def test_variance_term_on_both_sides_of_the_hinge():
    # N = 3 rows, non-zero means. dim 0: 10, 11, 12: unbiased variance 1, std sqrt(1.0001) > 1:
    # no hinge (divided by N = 3 it would be 0.82, a hinge of 0.18); dim 1: 5, 5.5, 6: variance
    # 0.25, hinge 1 - sqrt(0.2501); dim 2: constant: std sqrt(1e-4) = 0.01, hinge 0.99
    z = np.array([[10.0, 5.0, 3.0], [11.0, 5.5, 3.0], [12.0, 6.0, 3.0]])
    with untouched(z=z):
        v, dz = losses._variance_term(z)
    close("v", v, (1 - math.sqrt(0.2501) + 0.99) / 3, VALUE_TOL)
    # only dim 1 pulls: dv/dz_i1 = -(1/D) (z_i1 - 5.5) / ((N - 1) std_1); dim 0 is above the
    # hinge, dim 2 has no spread to push
    expected = np.zeros((3, 3))
    expected[:, 1] = -np.array([-0.5, 0.0, 0.5]) / (3 * 2 * math.sqrt(0.2501))
    close("dz", dz, expected, VALUE_TOL)


@pytest.mark.exercise7
def test_covariance_term_by_hand_with_non_zero_means():
    # column means 2, 4, 5 -> zc = [[-1, -2, 2], [2, -2, -1], [-1, 4, -1]]; C = zc^T zc / 2:
    # C01 = (2 - 4 - 4) / 2 = -3, C02 = (-2 - 2 + 1) / 2 = -1.5, C12 = (-4 + 2 - 4) / 2 = -3;
    # each twice: 2 (9 + 2.25 + 9) / D = 13.5
    z = np.array([[1.0, 2.0, 7.0], [4.0, 2.0, 4.0], [1.0, 8.0, 4.0]])
    with untouched(z=z):
        c, _ = losses._covariance_term(z)
    close("c", c, 13.5, VALUE_TOL)


def variance_by_numpy(z):
    """VICReg eq. 1 with eps = 1e-4: the mean over dimensions of max(0, 1 - sqrt(var + eps)),
    var by numpy's var(ddof=1)."""
    return np.maximum(1 - np.sqrt(z.var(axis=0, ddof=1) + 1e-4), 0).mean()


def covariance_by_loop(z):
    """sum over pairs j != k of C_jk^2 / D, C_jk = sum_i (z_ij - m_j)(z_ik - m_k) / (N - 1)."""
    N, D = z.shape
    m = [sum(z[i, j] for i in range(N)) / N for j in range(D)]
    return sum((sum((z[i, j] - m[j]) * (z[i, k] - m[k]) for i in range(N)) / (N - 1)) ** 2
               for j in range(D) for k in range(D) if j != k) / D


@pytest.mark.parametrize("term, formula", [
    pytest.param("_variance_term", variance_by_numpy, marks=pytest.mark.exercise6),
    pytest.param("_covariance_term", covariance_by_loop, marks=pytest.mark.exercise7)])
@pytest.mark.parametrize("dtype, tol", [(np.float64, GRAD_TOL), (np.float32, F32_TOL)])
def test_vicreg_term_against_an_independent_formula(term, formula, dtype, tol):
    """The term against the formula above, dz against the formula's central differences;
    correlated columns, means not 0, the hinge on for some dimensions; dtype kept, z untouched."""
    rng = np.random.default_rng(9)
    z_in = rng.standard_normal((5, 4)) * [0.3, 2.0, 0.8, 1.5] + 0.5 * rng.standard_normal((5, 1))
    z_in = (z_in + 1.0).astype(dtype)
    with untouched(z=z_in):
        value, dz = getattr(losses, term)(z_in)
    z = z_in.astype(np.float64)
    assert dz.dtype == dtype, f"dz: dtype {dz.dtype}, expected {dtype.__name__} as z"
    close("dz", dz, numerical_grad(lambda: formula(z), z), tol)
    close(term, value, formula(z), tol)


@pytest.mark.exercise7
@pytest.mark.parametrize("weights", [(25.0, 25.0, 1.0), (0.0, 25.0, 1.0), (1.0, 0.0, 0.0),
                                     (0.0, 0.0, 1.0), (0.0, 1.0, 0.0)])
@pytest.mark.parametrize("n, d", [(3, 3), (5, 4), (2, 5)])
def test_whole_vicreg_loss(weights, n, d):
    """The three terms together (losses.vicreg_loss, given: the paper's eq. 6), each weighted
    alone and as the paper weights them, against the formulas above and by central
    differences; dimensions below and above the std target, means not 0, N down to 2."""
    rng = np.random.default_rng(2)
    z_a = rng.standard_normal((n, d)) * [0.3, 2.0, 0.8, 1.5, 0.5][:d] + [1.0, -2, 0.5, 3, 0][:d]
    z_b = z_a + 0.5 * rng.standard_normal((n, d))
    loss, (dz_a, dz_b), _ = losses.vicreg_loss(z_a, z_b, *weights)
    (sim, var, cov), v, c = weights, variance_by_numpy, covariance_by_loop
    close("loss", loss, sim * np.mean((z_a - z_b) ** 2) + var * (v(z_a) + v(z_b)) / 2
          + cov * (c(z_a) + c(z_b)), VALUE_TOL)
    f = lambda: losses.vicreg_loss(z_a, z_b, *weights)[0]
    close("dz_a", dz_a, numerical_grad(f, z_a), GRAD_TOL)
    close("dz_b", dz_b, numerical_grad(f, z_b), GRAD_TOL)


@pytest.mark.exercise8
def test_cross_entropy_by_hand_and_by_finite_differences():
    logits = np.array([[0.0, 0.0, np.log(2.0)], [1.0, 1.0, 1.0]])
    loss, dlogits, stats = losses.cross_entropy(logits, np.array([2, 0]))
    # row 0: softmax [1/4, 1/4, 1/2], -log(1/2); row 1: uniform over 3, -log(1/3); mean of two
    close("loss", loss, (math.log(2) + math.log(3)) / 2, VALUE_TOL)
    close("dlogits", dlogits, [[0.125, 0.125, -0.25], [-1 / 3, 1 / 6, 1 / 6]], VALUE_TOL)
    assert stats == {"ce": loss, "targets": 2}
    rng = np.random.default_rng(1)
    logits, targets = 3 * rng.standard_normal((5, 7)), rng.integers(0, 7, size=5)
    close("dlogits", losses.cross_entropy(logits, targets)[1],
          numerical_grad(lambda: losses.cross_entropy(logits, targets)[0], logits), GRAD_TOL)


@pytest.mark.exercise8
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cross_entropy_on_logits_far_apart(dtype):
    """Rows 1000 apart (a max over the whole array underflows row 1 to exp(-1000) = 0), a
    target 1000 below its row's best (its probability underflows: log(p) would be -inf), a
    repeated target: dlogits keeps the logits' dtype; logits and targets untouched."""
    logits = np.array([[1000.0, 999.0], [0.0, -1000.0], [0.0, -1000.0]], dtype)
    targets = np.array([0, 1, 1])
    with untouched(logits=logits, targets=targets):
        loss, dlogits, stats = losses.cross_entropy(logits, targets)
    assert dlogits.dtype == dtype, f"dlogits: dtype {dlogits.dtype}, expected {dtype.__name__}"
    close("loss", loss, (math.log1p(math.exp(-1.0)) + 2000.0) / 3, 1e-6)
    p = 1 / (1 + math.exp(-1.0))                  # row 0's softmax: [p, 1 - p]
    close("dlogits", dlogits, np.array([[p - 1, 1 - p], [1, -1], [1, -1]]) / 3, 1e-6)
    assert stats == {"ce": loss, "targets": 3}


def adamw_by_hand(p, gs, decay, lr, wd, beta1=0.9, beta2=0.999, eps=1e-8):
    """Loshchilov & Hutter 2019, Algorithm 2 (its defaults), over the gradients gs, in float64."""
    p, m, v = np.array(p, np.float64), 0.0, 0.0
    for t, g in enumerate(gs, start=1):
        g = np.array(g, np.float64)
        m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
        if decay:
            p = p - lr * wd * p                       # decoupled: before, not through m and v
        p = p - lr * (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps)
    return p


BETAS = dict(beta1=0.8, beta2=0.95, eps=1e-2)    # eps large enough that where it goes matters


@pytest.mark.exercise9
@pytest.mark.parametrize("dtype, tol, options", [
    (np.float64, VALUE_TOL, BETAS), (np.float32, F32_TOL, BETAS), (np.float64, VALUE_TOL, {})])
def test_adamw_three_steps_against_the_algorithm(dtype, tol, options):
    """beta1, beta2 and eps given, or the defaults (the paper's); weight matrices (".w_") decayed,
    an embedding, a bias and a gain not; zero gradients mid-way: each updated in place in its
    dtype, m and v in it too, the gradients untouched, state["t"] counting the steps."""
    rng = np.random.default_rng(9)
    names = ["tok_emb", "blocks.0.mlp.w_in", "ln_f.gamma", "blocks.1.attn.w_o", "blocks.1.mlp.b_in"]
    start = {k: rng.standard_normal(3) for k in names}
    steps = [{k: rng.standard_normal(3) * s for k in names} for s in (1.0, 3.0, 0.1)]
    steps[1]["ln_f.gamma"][0] = steps[2]["blocks.0.mlp.w_in"][1] = 0.0
    params = {k: np.array(v, dtype) for k, v in start.items()}
    arrays = dict(params)
    state = optim.adam_init(params)
    for step in steps:
        grads = {k: np.array(g, dtype) for k, g in step.items()}
        with untouched(grads=list(grads.values())):
            optim.adam_step(params, grads, state, 0.05, weight_decay=0.3, **options)
    assert state["t"] == 3
    for name in start:
        assert params[name] is arrays[name], f"{name}: update the arrays in place"
        assert params[name].dtype == state["m"][name].dtype == state["v"][name].dtype == dtype, \
            f"{name}: dtype {params[name].dtype}, m {state['m'][name].dtype}"
        close(name, params[name], adamw_by_hand(start[name], [s[name] for s in steps],
                                                ".w_" in name, 0.05, 0.3, **options), tol)


@pytest.mark.exercise10
@pytest.mark.parametrize("rate, dtype", [(0.0, np.int64), (0.25, np.int32), (0.7, np.int64),
                                         (0.999, np.int32)])
def test_mask_words_against_a_loop(rate, dtype):
    """Every special token (never masked), captions of 0 to 5 words: (b, t) is masked when it
    holds a word and u[b, t] < rate, u = rng.random(tokens.shape); a caption whose every word
    drew "mask" keeps the one with the largest draw. The integer dtype kept; tokens untouched."""
    tokens = np.array([[BOS, 5, UNK, 6, 7, MASK, 8, EOS, PAD],
                       [BOS, UNK, EOS, PAD, PAD, PAD, PAD, PAD, PAD],     # no word at all
                       [BOS, 9, EOS, PAD, PAD, PAD, PAD, PAD, PAD],       # one word
                       [BOS, 9, 10, EOS, PAD, PAD, PAD, PAD, PAD],        # two
                       [BOS, 10, 11, UNK, 12, 13, 14, EOS, PAD]] * 10, dtype)
    u = np.random.default_rng(3).random(tokens.shape)
    expected = tokens.copy()
    for b, row in enumerate(tokens):
        words = [t for t, token in enumerate(row) if token >= 5]
        masked = [t for t in words if u[b, t] < rate]
        if words and len(masked) == len(words):
            masked.remove(max(words, key=lambda t: u[b, t]))
        expected[b, masked] = MASK
    with untouched(tokens=tokens):
        got = objectives.mask_words(tokens, rate, np.random.default_rng(3))
    assert got.dtype == dtype, f"dtype {got.dtype}, expected {dtype.__name__} as tokens"
    np.testing.assert_array_equal(got, expected)


@pytest.mark.exercise11
def test_next_token_targets_with_unk_an_empty_caption_and_a_full_row():
    """UNK is a word to predict; a caption without words has one target, EOS; a full row (no
    PAD) ends with EOS, which predicts nothing. Integers stay integers; tokens untouched."""
    tokens = np.array([[BOS, 7, UNK, 8, EOS, PAD],
                       [BOS, EOS, PAD, PAD, PAD, PAD],
                       [BOS, UNK, 9, 9, 10, EOS]], np.int32)
    with untouched(tokens=tokens):
        targets, has_target = objectives.next_token_targets(tokens)
    assert targets.dtype == np.int32 and has_target.dtype == bool, (targets.dtype, has_target.dtype)
    # packed: BOS 7 UNK 8 EOS | BOS EOS | BOS UNK 9 9 10 EOS; each predicts the next, EOS nothing
    np.testing.assert_array_equal(has_target, [1, 1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(targets[has_target], [7, UNK, 8, EOS, EOS, UNK, 9, 9, 10, EOS])


@pytest.mark.exercise12
def test_recall_at_k_by_hand_with_ties():
    sim = np.array([[0.9, 0.9, 0.1, 0.0, 0.2],    # tie with j=1, but 1 > 0: rank 0
                    [0.5, 0.5, 0.2, 0.7, 0.0],    # j=3 higher, j=0 tied with a lower index: 2
                    [0.3, 0.1, 0.3, 0.3, 0.3],    # j=0 tied lower (counts), j=3 tied higher
                    [0.8, 0.9, 0.95, 0.1, 0.1],   # all three before it higher: rank 3
                    [0.0, 0.0, 0.0, 0.5, 0.5]])   # j=3 tied lower: rank 1
    sim[2, 4] += 1e-7                             # higher, if close to a tie: row 2's rank 2
    sim[4, 0] = 0.5 - 1e-7                        # lower, if close to a tie: row 4's rank 1
    with untouched(sim=sim):
        got = metrics.recall_at_k(sim, ks=(1, 2, 3, 4))
    assert got == {"R@1": 0.2, "R@2": 0.4, "R@3": 0.8, "R@4": 1.0}, got


@pytest.mark.exercise12
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_recall_at_k_default_ks_against_a_loop(dtype):
    """20 queries, 40 gallery items (more than a sort sorts stably by chance), many exact ties
    (values rounded to 0.1), the default ks (1, 5, 10): the fraction of QUERIES whose rank,
    counted by a loop here, is below k. Refused: more queries than items, k < 1 or not whole,
    NaN."""
    rng = np.random.default_rng(12)
    sim = np.round(rng.standard_normal((20, 40)) + np.eye(20, 40) * rng.uniform(0, 2, (20, 1)), 1)
    sim = sim.astype(dtype)
    rank = np.array([sum(sim[i, j] > sim[i, i] or (sim[i, j] == sim[i, i] and j < i)
                         for j in range(40)) for i in range(20)])
    assert metrics.recall_at_k(sim) == {f"R@{k}": float(np.mean(rank < k)) for k in (1, 5, 10)}
    for bad, ks in [(sim.T, (1,)), (sim, (0,)), (sim, (1.5,)), (np.full((2, 2), np.nan), (1,))]:
        with pytest.raises(ValueError):
            metrics.recall_at_k(bad, ks)


def knn_by_loop(x, k):
    """Each row's k nearest other rows by cosine similarity (ties to the lower index), as sets."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    return [set(sorted((j for j in range(len(x)) if j != i),
                       key=lambda j: (-float(unit[i] @ unit[j]), j))[:k]) for i in range(len(x))]


def spaces(kind):
    """(A, B) of 9 paired rows: random with very different norms and non-zero means (Euclidean
    neighbours are not cosine neighbours), D = 3 and 5; or axis-aligned rows with exact ties
    and duplicated rows (a duplicate ties with the point itself)."""
    rng = np.random.default_rng(13)
    if kind == "random":
        a = (rng.standard_normal((9, 3)) + 0.5) * rng.uniform(0.1, 10.0, (9, 1))
        return a, a @ rng.standard_normal((3, 5)) + 3.0 * rng.standard_normal((9, 5))
    e = np.eye(4)
    a = np.array([e[0], e[0], e[1], 2 * e[2], e[1], e[3], 3 * e[0], e[2], e[3]])
    return a, e[[3, 2, 2, 1, 1, 0, 0, 0, 0]] * np.array([3, 2, 3, 2, 2, 3, 3, 2, 2])[:, None]


@pytest.mark.exercise13
@pytest.mark.parametrize("kind", ["random", "ties"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_mutual_knn_against_a_loop(kind, k):
    """mean_i |knn_A(i) & knn_B(i)| / k, the neighbours found by a loop here; A, B untouched."""
    a, b = spaces(kind)
    expected = np.mean([len(sa & sb) / k for sa, sb in zip(knn_by_loop(a, k), knn_by_loop(b, k))])
    assert 0 < expected < 1
    with untouched(A=a, B=b):
        got = metrics.mutual_knn(a, b, k=k)
    close("mutual k-NN", got, expected, VALUE_TOL)


@pytest.mark.exercise14
def test_fit_rotation_against_the_polar_factor():
    """Noisy pairs, non-zero means, rows of different norms (taken as given: no centring or
    normalising inside), D = 3 < D_img = 5: W is M = z^T img's polar factor (M M^T)^(-1/2) M."""
    rng = np.random.default_rng(14)
    z = rng.standard_normal((20, 3)) * rng.uniform(0.2, 3.0, (20, 1)) + 1.0
    img = z @ rng.standard_normal((3, 5)) + rng.standard_normal((20, 5)) + 0.5
    with untouched(z=z, img=img):
        w = metrics.fit_rotation(z, img)
    m = z.T @ img                                                         # (3, 5)
    lam, q = np.linalg.eigh(m @ m.T)                                      # (3,), (3, 3)
    close("W", w, q @ np.diag(lam ** -0.5) @ q.T @ m, 1e-10)


@pytest.mark.exercise14
def test_fit_rotation_recovers_a_reflection_and_survives_rank_deficiency():
    """A reflection (det -1) comes back as it is (Procrustes ranges over every orthogonal
    map); z of rank 2 in D = 3 (M M^T singular): W finite, semi-orthogonal, exact on z's span.
    D > D_img refused."""
    rng = np.random.default_rng(15)
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    q[:, 0] *= -np.sign(np.linalg.det(q))                                 # det(q) = -1
    z = rng.standard_normal((25, 4))
    close("W", metrics.fit_rotation(z, z @ q), q, 1e-10)
    z = rng.standard_normal((25, 2)) @ rng.standard_normal((2, 3))        # (25, 3), rank 2
    q, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    w = metrics.fit_rotation(z, z @ q[:3])
    assert np.isfinite(w).all(), "W is not finite on rank-deficient input"
    close("W W^T - I", w @ w.T, np.eye(3), 1e-10)
    close("z W", z @ w, z @ q[:3], 1e-10)
    with pytest.raises(ValueError):
        metrics.fit_rotation(z, z[:, :2])
