"""What the class grader asks of each exercise (docs/course.md, "A class"): the function it calls
and the inputs, drawn from the run's Generator. The cases are the contract, not a list of known
mistakes: float32 and float64 (arrays keep their dtype, integers stay integers), non-square and
ragged shapes, and the extremes each formula invites: ties and duplicated rows, logits far apart,
saturated activations, constant rows, rank-deficient inputs, empty and one-word captions, every
special token."""
import numpy as np

from minialign import layers as L
from minialign.tokenizer import BOS, EOS, MASK, PAD, UNK


def both(cases):
    """Each case in float64, then again with every float array cast to float32."""
    def cast(x, t):
        return x.astype(t) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else x
    return [tuple(cast(x, t) for x in case) for t in (np.float64, np.float32) for case in cases]


def backward(forward, inputs, rng):
    """(dy, cache) for a layer's backward: forward run on inputs, dy random."""
    y, cache = forward(*inputs)
    return rng.standard_normal(y.shape).astype(y.dtype), cache


def linear(rng):
    shapes = [(1, 3, 5), (7, 6, 2), ((2, 5), 3, 4)]                # x rows (or B, T), D_in, D_out
    cases = both([(rng.standard_normal((*np.atleast_1d(n), a)), rng.standard_normal((a, b)),
                   rng.standard_normal(b)) for n, a, b in shapes])
    return "layers", "linear_backward", [backward(L.linear_forward, c, rng) for c in cases]


def gelu(rng):
    x = [rng.standard_normal((3, 4, 5)) * 3, np.array([-30.0, -10.0, -1e-3, 0.0, 1e-3, 10.0, 30.0])]
    cases = both([(v,) for v in x])
    return "layers", "gelu_backward", [backward(L.gelu_forward, c, rng) for c in cases]


def mean_pool(rng):
    seqs = [np.array([0, 0, 0, 1, 2, 2]), np.array([0, 2, 2, 2, 2, 3, 3]),    # 1: no rows
            np.array([0], np.int32), np.array([1, 0, 1, 2, 0])]               # rows unsorted
    cases = [(rng.standard_normal((len(s), 5)), s, n) for s, n in zip(seqs, (3, 5, 1, 3))]
    return "layers", "mean_pool_forward", both(cases)


def layernorm(rng):
    x = [rng.standard_normal((5, 8)) * 4 + 2, rng.standard_normal((2, 3, 6)),
         np.full((2, 4), 3.0)]                                        # constant rows: xhat = 0
    cases = both([(v, rng.standard_normal(v.shape[-1]), rng.standard_normal(v.shape[-1]))
                  for v in x])
    return "layers", "layernorm_backward", [backward(L.layernorm_forward, c, rng) for c in cases]


def attention(rng):
    calls = []
    for (B, T, D, H), causal in [((2, 5, 8, 2), False), ((3, 4, 6, 3), True), ((1, 1, 4, 1), True)]:
        mask = np.arange(T) < rng.integers(1, T + 1, B)[:, None]      # ragged: padding keys
        for t in (np.float64, np.float32):
            x, w_qkv, b_qkv, w_o, b_o = (rng.standard_normal(s).astype(t) for s in
                                         [(B, T, D), (D, 3 * D), (3 * D,), (D, D), (D,)])
            calls.append(backward(L.mha_forward, (x, w_qkv, b_qkv, w_o, b_o,
                                                  L.attention_bias(mask, causal, t), H), rng))
    return "layers", "mha_backward", calls


def vicreg_inputs(rng):
    z = rng.standard_normal((9, 4)) * np.array([0.3, 1.0, 2.0, 0.9]) + rng.standard_normal(4) * 3
    return both([(z,), (rng.standard_normal((2, 3)) + 5,), (rng.standard_normal((6, 1)),),
                 (np.column_stack([np.full(5, 2.0), rng.standard_normal(5)]),)])  # constant column


def variance(rng):
    return "losses", "_variance_term", vicreg_inputs(rng)


def covariance(rng):
    return "losses", "_covariance_term", vicreg_inputs(rng)


def cross_entropy(rng):
    far = rng.standard_normal((6, 5)) * 300 + rng.standard_normal((6, 1)) * 3000  # in, across rows
    cases = [(rng.standard_normal((7, 11)), rng.integers(0, 11, 7)), (far, np.argmin(far, axis=1)),
             (np.zeros((1, 4)), np.array([3], np.int32)), (far[:2] / 1e4, np.array([0, 4]))]
    return "losses", "cross_entropy", both(cases)


def adamw(rng):
    names = ["tok_emb", "blocks.0.attn.w_qkv", "blocks.1.mlp.w_out", "ln_f.gamma"]
    cases = []
    for t, wd in ((0, 0.1), (7, 0.0), (3, 0.3)):                     # fresh, and moments of t steps
        parts = {"p": rng.standard_normal, "g": lambda s: rng.standard_normal(s) * 10.0 ** -6,
                 "m": lambda s: rng.standard_normal(s) * t, "v": lambda s: rng.random(s) * t}
        drawn = {part: {k: draw((3, 4)) for k in names} for part, draw in parts.items()}
        drawn["g"]["ln_f.gamma"] *= 1e6                              # eps matters elsewhere
        for d in (np.float64, np.float32):
            a = {part: {k: v.astype(d) for k, v in x.items()} for part, x in drawn.items()}
            cases.append((a["p"], a["g"], {"m": a["m"], "v": a["v"], "t": t}, 1e-2, wd, 0.8,
                          0.95, 1e-8))
    return "optim", "adam_step", cases


def captions(rng, dtype):
    """Captions with every special token, no word, one word, a full row, random lengths."""
    rows = [[BOS, 9, UNK, 6, 7, MASK, 8, EOS, PAD], [BOS, EOS] + [PAD] * 7,
            [BOS, UNK, EOS] + [PAD] * 6, [BOS, 11, EOS] + [PAD] * 6, [BOS, *range(5, 12), EOS]]
    for n in rng.integers(0, 8, 6):                                   # words, UNK and MASK
        rows.append([BOS, *rng.choice([UNK, MASK, *range(5, 40)], n), EOS] + [PAD] * (7 - n))
    return np.array(rows, dtype)


def masking(rng):
    return "objectives", "mask_words", [
        (captions(rng, d), rate, np.random.default_rng(rng.integers(1 << 32)))
        for d in (np.int64, np.int32) for rate in (0.0, 0.3, 0.999)]


def next_token(rng):
    return "objectives", "next_token_targets", [
        (captions(rng, np.int64),), (captions(rng, np.int32),), (np.array([[BOS, 7, EOS]]),)]


def recall(rng):
    ties = rng.integers(0, 3, (40, 60)).astype(float)  # exact ties, in rows quicksort reorders
    near = ties + rng.choice([-1e-9, 0.0, 1e-9], ties.shape)          # ties in float32 only
    dup = rng.standard_normal((6, 6))
    dup[3] = dup[1]                                                   # a duplicated row
    dup[:, 4] = dup[:, 2]                                             # and column
    return "metrics", "recall_at_k", [(ties, (1, 2, 5)), (near, (1, 2, 5, 20, 40)), (dup, (1, 3)),
                                      (rng.standard_normal((5, 9)), (1, 5, 10))]


def neighbours(rng):
    a = (rng.standard_normal((12, 3)) + 0.5) * rng.uniform(0.1, 10.0, (12, 1))
    b = a @ rng.standard_normal((3, 5)) + 2.0 * rng.standard_normal((12, 5))
    e = np.eye(3)
    ties = e[rng.integers(0, 3, 12)] * rng.integers(1, 4, (12, 1))    # duplicated directions
    dup = a.copy()
    dup[[4, 7]] = dup[2]                                              # a point repeated
    many = [np.eye(5)[rng.integers(0, 5, 60)] * rng.integers(1, 4, (60, 1)) for _ in "AB"]
    return "metrics", "mutual_knn", [(a, b, k) for k in (1, 3, 11)] + [
        (ties, b, 3), (a, ties, 2), (dup, ties, 3), (dup, a, 1), (*many, 5)]  # 12 ties per k-th


def rotation(rng):
    z = rng.standard_normal((20, 3)) * rng.uniform(0.2, 3.0, (20, 1)) + 1.0
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    q[:, 0] *= -np.sign(np.linalg.det(q))                             # a reflection
    low = rng.standard_normal((25, 2)) @ rng.standard_normal((2, 3))  # rank 2 in D = 3
    w = rng.standard_normal((4, 4))
    return "metrics", "fit_rotation", [
        (z, z @ rng.standard_normal((3, 5)) + rng.standard_normal((20, 5))), (w, w @ q),
        (low, low @ np.linalg.qr(rng.standard_normal((5, 5)))[0][:3]), (low, np.zeros((25, 3)))]


def check_rotation(got, want, args):
    """Procrustes' optimum is unique only at full rank: W semi-orthogonal and as good as the
    repository's, trace(W^T z^T img) = the sum of its singular values."""
    z, img = args
    m = z.T @ img
    if not np.isfinite(got).all():
        return "W is not finite"
    if np.abs(got @ got.T - np.eye(len(got))).max() > 1e-8:
        return "W W^T is not the identity"
    if np.trace(got.T @ m) < np.trace(want.T @ m) - 1e-8 * max(1.0, np.abs(m).sum()):
        return "W does not minimise ||z W - img||"


CASES = {1: linear, 2: gelu, 3: mean_pool, 4: layernorm, 5: attention, 6: variance,
         7: covariance, 8: cross_entropy, 9: adamw, 10: masking, 11: next_token, 12: recall,
         13: neighbours, 14: rotation}
CHECKS = {14: check_rotation}         # compare the output this way, not value by value
