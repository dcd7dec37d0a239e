"""Plausible wrong bodies of the course kit's exercises (STYLE.md section 12), which the class
grader (tests/test_course.py) must not grade "passed". MUTANTS[N] lists exercise N's mutants as
(the mistake, old, new, ...): (old, new) replacements in the reference body (dedented; each old
text in it exactly once), or one string, a whole body. A copy holds a mutant of several
exercises, never one of an exercise together with one of an exercise whose code it calls."""
import textwrap
from pathlib import Path

from minialign.machinery import course

SEED = 20240611          # the grader's inputs: fixed, so a verdict never changes between runs
NEEDS = {5: 1}           # attention backward calls linear_backward
# exercise 9's decoupled weight decay, as the reference's loop body writes it
DECAY = ("    if weight_decay and name.endswith(DECAYED_SUFFIXES):\n"
         "        p *= 1.0 - lr * weight_decay\n")

MUTANTS = {
    1: [("db averaged over the rows instead of summed", "db = dy.reshape(-1, d_out).sum(axis=0)",
         "db = dy.reshape(-1, d_out).mean(axis=0)"),
        ("dw divided by the number of rows (a mean gradient)", "@ dy.reshape(-1, d_out)",
         "@ dy.reshape(-1, d_out) / x.reshape(-1, d_in).shape[0]"),
        ("x.reshape(d_in, -1) where x^T is meant", "x.reshape(-1, d_in).T", "x.reshape(d_in, -1)"),
        ("w.reshape(d_out, d_in) where w^T is meant", "@ w.T)", "@ w.reshape(d_out, d_in))"),
        ("db summed in float64: a float32 model gets a float64 gradient", "sum(axis=0)",
         "sum(axis=0, dtype=np.float64)"),
        ("dw cast to float32 'as the model is': a float64 model gets float32",
         "dw = x.reshape(-1, d_in).T @ dy.reshape(-1, d_out)",
         "dw = (x.reshape(-1, d_in).T @ dy.reshape(-1, d_out)).astype(np.float32)")],
    2: [("x/2 (1 + th) differentiated as if x were a constant",
         "0.5 * (1.0 + th) + 0.5 * x * dth_dx", "0.5 * x * dth_dx"),
        ("tanh' = 1 - th instead of 1 - th^2", "(1.0 - th**2)", "(1.0 - th)"),
        ("d/dx (x + a x^3) = 1 + a x^2", "3.0 * GELU_A", "GELU_A"),
        ("dy *= slope, returning dy (the caller's array)", "dx = dy * (", "dy *= (", "return dx",
         "return dy"),
        ("casts the cache to float64 'for accuracy'", "x, th = cache",
         "x, th = (np.asarray(a, dtype=np.float64) for a in cache)"),
        ("dx returned as float32, whatever the model's dtype", "return dx",
         "return dx.astype(np.float32)")],
    3: [("each row weighted 1 / n (all rows), not 1 / n_b", "1.0 / counts[seq]", "1.0 / len(seq)"),
        ("sum pooling: weight 1", "1.0 / counts[seq]", "1.0"),
        ("P built in float64 (np.zeros' default): float32 h gives float64 z", ", dtype=h.dtype)",
         ")"),
        ("each sequence's rows taken as one contiguous block",
         "P[seq, np.arange(len(seq))] = 1.0 / counts[seq]",
         "start = np.cumsum(counts) - counts\n"
         "for b in range(n_seqs):\n"
         "    P[b, start[b]:start[b] + counts[b]] = 1.0 / max(counts[b], 1)"),
        ("one-hot / counts: a sequence with no row pools to NaN, not 0",
         "P[seq, np.arange(len(seq))] = 1.0 / counts[seq]",
         "P[:] = (seq == np.arange(n_seqs)[:, None]) / counts[:, None]")],
    4: [("dx without the part along the ones (the mean's gradient)",
         "g - g.mean(axis=-1, keepdims=True)", "g"),
        ("dx without the part along xhat (the std's gradient)",
         "- xhat * (g * xhat).mean(axis=-1, keepdims=True))", ")"),
        ("d/dxhat = dy, gamma forgotten", "g = dy * gamma", "g = dy"),
        ("returns dx, dbeta, dgamma", "return dx, dgamma, dbeta", "return dx, dbeta, dgamma"),
        ("g = dy; g *= gamma: scales the caller's dy", "g = dy * gamma", "g = dy\n" "g *= gamma")],
    5: [("softmax backward as probs (1 - probs) dprobs (the diagonal only)",
         "probs * (dprobs - (probs * dprobs).sum(axis=-1, keepdims=True))",
         "probs * (1.0 - probs) * dprobs"),
        ("the softmax backward's sum over queries, not keys",
         "(probs * dprobs).sum(axis=-1, keepdims=True)",
         "(probs * dprobs).sum(axis=-2, keepdims=True)"),
        ("dq and dk without the 1 / sqrt(Dh) scale", "dq = dscores @ k * scale", "dq = dscores @ k",
         "dk = dscores.swapaxes(-1, -2) @ q * scale", "dk = dscores.swapaxes(-1, -2) @ q"),
        ("dk = dscores @ q (T x T, so the shape is right)", "dk = dscores.swapaxes(-1, -2) @ q",
         "dk = dscores @ q"),
        ("dv = probs @ da", "dv = probs.swapaxes(-1, -2) @ da", "dv = probs @ da"),
        ("dqkv concatenated as dk | dq | dv", "for d in (dq, dk, dv)", "for d in (dk, dq, dv)"),
        ("every gradient returned as float32, whatever the model's dtype",
         "return dx, dw_qkv, db_qkv, dw_o, db_o",
         "return tuple(d.astype(np.float32) for d in (dx, dw_qkv, db_qkv, dw_o, db_o))")],
    6: [("Var with 1 / N, not 1 / (N - 1) (forward and backward)", "/ (N - 1) + VICREG_VAR_EPS",
         "/ N + VICREG_VAR_EPS", "((N - 1) * std)", "(N * std)"),
        ("the variance of z about 0, not about its mean", "zc = z - z.mean(axis=0)", "zc = z"),
        ("std = sqrt(var) + eps", "np.sqrt((zc * zc).sum(axis=0) / (N - 1) + VICREG_VAR_EPS)",
         "np.sqrt((zc * zc).sum(axis=0) / (N - 1)) + VICREG_VAR_EPS"),
        ("the hinges summed over the D dimensions, not averaged", "np.maximum(hinge, 0.0).mean()",
         "np.maximum(hinge, 0.0).sum()", "astype(z.dtype) / D", "astype(z.dtype)"),
        ("relu(1 - (Var + eps)): the variance hinged, not the std",
         "hinge = VICREG_STD_TARGET - std", "hinge = VICREG_STD_TARGET - std**2",
         "dz = zc * (dstd / ((N - 1) * std))", "dz = zc * (dstd * 2.0 / (N - 1))"),
        ("every dimension pulled, also those above the hinge", "-(hinge > 0).astype(z.dtype) / D",
         "-np.ones_like(hinge) / D"),
        ("np.where(hinge > 0, -1.0 / D, 0.0): float64, so dz turns float64",
         "-(hinge > 0).astype(z.dtype) / D", "np.where(hinge > 0, -1.0 / D, 0.0)")],
    7: [("C = z^T z / (N - 1), z not centred", "zc = z - z.mean(axis=0)", "zc = z"),
        ("C with 1 / N (forward and backward)", "C = zc.T @ zc / (N - 1)", "C = zc.T @ zc / N",
         "(D * (N - 1))", "(D * N)"),
        ("the variances on C's diagonal squared in too", "c = (off * off).sum() / D",
         "c = (C * C).sum() / D", "dz = zc @ off", "dz = zc @ C"),
        ("divided by the D (D - 1) pairs, not by D", "c = (off * off).sum() / D",
         "c = (off * off).sum() / (D * (D - 1))", "(4.0 / (D * (N - 1)))",
         "(4.0 / (D * (D - 1) * (N - 1)))"),
        ("dC's symmetry forgotten: 2 / (D (N - 1)), not 4", "4.0 /", "2.0 /")],
    8: [("dlogits = softmax - onehot, the 1 / n of the mean forgotten", "dlogits /= n\n", ""),
        ("loss and gradient summed over the targets, not averaged", ".mean())", ".sum())",
         "dlogits /= n\n", ""),
        ("the row max subtracted in place, from the caller's logits",
         "shifted = logits - logits.max(axis=1, keepdims=True)",
         "logits -= logits.max(axis=1, keepdims=True)\n"
         "shifted = logits"),
        ("dlogits = probs - np.eye(V)[targets]: float64 for float32 logits",
         "dlogits[rows, targets] -= 1.0", "dlogits = dlogits - np.eye(V)[targets]"),
        ("max, exp-sum and normaliser over axis 0 (the rows)", "logits.max(axis=1, keepdims=True)",
         "logits.max(axis=0, keepdims=True)", "probs.sum(axis=1, keepdims=True)",
         "probs.sum(axis=0, keepdims=True)", "np.log(total[:, 0])", "np.log(total[0, targets])"),
        ("the whole array's maximum subtracted, not each row's",
         "logits.max(axis=1, keepdims=True)", "logits.max()"),
        ("-log of the normalised probability (0 when it underflows)",
         "nll = np.log(total[:, 0]) - shifted[rows, targets]",
         "nll = -np.log(probs[rows, targets] / total[:, 0])")],
    9: [("m and v used without 1 / (1 - beta^t)", "step = lr / (1.0 - beta1 ** t)", "step = lr",
         "v_scale = 1.0 / (1.0 - beta2 ** t)", "v_scale = 1.0"),
        ("weight decay added to the gradient (Adam + L2), not to the weights", DECAY, "",
         "    m *= beta1\n",
         "    if weight_decay and name.endswith(DECAYED_SUFFIXES):\n"
         "        g = g + weight_decay * p\n"
         "    m *= beta1\n"),
        ("LayerNorm gains and biases decayed too",
         "if weight_decay and name.endswith(DECAYED_SUFFIXES):", "if weight_decay:"),
        ("the token embedding decayed too, as a weight matrix", "name.endswith(DECAYED_SUFFIXES)",
         "name.endswith(DECAYED_SUFFIXES + ('tok_emb',))"),
        ("sqrt(v_hat + eps), not sqrt(v_hat) + eps", "np.sqrt(v * v_scale)",
         "np.sqrt(v * v_scale + eps)", "    denom += eps\n", ""),
        ("the weights decayed after the Adam step, not before", DECAY, "",
         "    p -= step * m / denom\n", "    p -= step * m / denom\n" + DECAY),
        ("the module's ADAM_BETA1, ADAM_BETA2, not the arguments", 'state["t"] += 1',
         "beta1, beta2 = ADAM_BETA1, ADAM_BETA2\n"
         'state["t"] += 1'),
        ("params[name] = p - ...: a new array, the caller's is not updated",
         "p -= step * m / denom", "params[name] = p - step * m / denom")],
    10: [("only PAD, BOS and EOS kept: UNK and MASK get masked",
          "is_word = tokens >= len(SPECIALS)",
          "from .tokenizer import BOS, EOS\n"
          "is_word = (tokens != PAD) & (tokens != BOS) & (tokens != EOS)"),
         ("one draw per word, not per position: other draws", "u = rng.random(tokens.shape)",
          "u = np.ones(tokens.shape)\n"
          "u[is_word] = rng.random(int(is_word.sum()))"),
         ("a caption may lose every word", "masked[rows, keep[rows]] = False", "pass"),
         ("keeps the caption's first word, not the largest draw",
          "keep = np.argmax(np.where(is_word, u, -1.0), axis=1)",
          "keep = np.argmax(is_word, axis=1)"),
         ("tokens[masked] = MASK, returning the caller's array",
          "return np.where(masked, MASK, tokens).astype(tokens.dtype)",
          "tokens[masked] = MASK\n"
          "return tokens"),
         ("u > rate: masks with probability 1 - rate", "(u < rate)", "(u > rate)")],
    11: [("shifted the wrong way: each token 'predicts' the one before",
          "targets[:, :-1] = tokens[:, 1:]", "targets[:, 1:] = tokens[:, :-1]"),
         ("EOS masked as a target: the model never learns to stop",
          "return targets, targets != PAD",
          "from .tokenizer import EOS\n"
          "return targets, (targets != PAD) & (targets != EOS)"),
         ("has_target all True: EOS 'predicts' PAD", "return targets, targets != PAD",
          "return targets, np.ones(len(targets), dtype=bool)"),
         ("no target at BOS (the first word is never predicted)", "return targets, targets != PAD",
          "from .tokenizer import BOS\n"
          "return targets, (targets != PAD) & (tokens[tokens != PAD] != BOS)"),
         ("targets packed in column order, not caption by caption",
          "targets = targets[tokens != PAD]", "targets = targets.T[tokens.T != PAD]"),
         ("UNK masked as a target", "return targets, targets != PAD",
          "from .tokenizer import UNK\n"
          "return targets, (targets != PAD) & (targets != UNK)"),
         ("targets built in np.zeros' float64: token ids as floats",
          "targets = np.full_like(tokens, PAD)", "targets = np.zeros(tokens.shape) + PAD")],
    12: [("every tie ranks above the correct item",
          "(sim > correct) | ((sim == correct) & (cols < rows[:, None]))",
          "(sim >= correct) & (cols != rows[:, None])"),
         ("no tie ranks above the correct item",
          "(sim > correct) | ((sim == correct) & (cols < rows[:, None]))", "sim > correct"),
         ("rank <= k: off by one", "np.mean(rank < k)", "np.mean(rank <= k)"),
         ("the hits divided by N_gallery, not by N_query", "float(np.mean(rank < k))",
          "float(np.sum(rank < k) / n_gallery)"),
         ("ties go to the higher index", "cols < rows[:, None]", "cols > rows[:, None]"),
         ("the diagonal set to -inf in the caller's sim", "correct = sim[rows, rows][:, None]",
          "correct = sim[rows, rows][:, None].copy()\n"
          "sim[rows, rows] = -np.inf"),
         ("rank = the correct item's place in np.argsort(-sim) (not stable)",
          "order = np.argsort(-sim, axis=1)\n"
          "rank = np.argmax(order == np.arange(n_query)[:, None], axis=1)\n"
          'return {f"R@{k}": float(np.mean(rank < k)) for k in ks}\n'),
         ("ties found with np.isclose, not ==", "(sim == correct)", "np.isclose(sim, correct)")],
    13: [("neighbours from cosine_similarity sorted, self not excluded", "knn_indices(A, k)",
          "np.argsort(-cosine_similarity(A, A), axis=1)[:, :k]", "knn_indices(B, k)",
          "np.argsort(-cosine_similarity(B, B), axis=1)[:, :k]"),
         ("|A & B| / |A | B| (Jaccard), not |A & B| / k", "np.mean(overlap / k)",
          "np.mean(overlap / (2 * k - overlap))"),
         ("only the nearest neighbour compared, whatever k", "return float(np.mean(overlap / k))",
          "return float(np.mean(knn_indices(A, 1)[:, 0] == knn_indices(B, 1)[:, 0]))"),
         ("the two lists compared position by position, not as sets",
          "overlap = np.sum(knn_indices(A, k) == knn_indices(B, k), axis=1)\n"
          "return float(np.mean(overlap / k))\n"),
         ("neighbours by Euclidean distance, not cosine similarity",
          "def knn(x):\n"
          "    d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1)\n"
          "    np.fill_diagonal(d, np.inf)\n"
          '    return np.argsort(d, axis=1, kind="stable")[:, :k]\n'
          "overlap = [len(set(a) & set(b)) for a, b in zip(knn(A), knn(B))]\n"
          "return float(np.mean(np.array(overlap) / k))\n"),
         ("argsort of -sim with column 0 dropped as 'itself' (no -inf)", "knn_indices(A, k)",
          "np.argsort(-cosine_similarity(A, A), axis=1, kind='stable')[:, 1:k + 1]",
          "knn_indices(B, k)",
          "np.argsort(-cosine_similarity(B, B), axis=1, kind='stable')[:, 1:k + 1]"),
         ("the k nearest picked by np.argpartition (ties broken anyhow)",
          "def knn(x):\n"
          "    sim = cosine_similarity(x, x)\n"
          "    np.fill_diagonal(sim, -np.inf)\n"
          "    return np.argpartition(-sim, k - 1, axis=1)[:, :k]\n"
          "overlap = [len(set(a) & set(b)) for a, b in zip(knn(A), knn(B))]\n"
          "return float(np.mean(np.array(overlap) / k))\n")],
    14: [("the unconstrained least-squares map, not an orthogonal one",
          "return np.linalg.lstsq(z_text, img, rcond=None)[0]\n"),
         ("U S V^T: M itself, not its orthogonal factor", "u, _, vt =", "u, s, vt =",
          "return u @ vt", "return u @ np.diag(s) @ vt"),
         ("a reflection flipped to det +1 (Kabsch's fix)", "return u @ vt",
          "if m.shape[0] == m.shape[1] and np.linalg.det(u @ vt) < 0:\n"
          "    u[:, -1] *= -1\n"
          "return u @ vt"),
         ("z and img centred again inside (prepare_for_rotation does it)", "m = z_text.T @ img",
          "m = (z_text - z_text.mean(axis=0)).T @ (img - img.mean(axis=0))"),
         ("rows L2-normalised again inside", "m = z_text.T @ img",
          "m = l2_normalize(z_text).T @ l2_normalize(img)"),
         ("W = (M M^T)^(-1/2) M by np.linalg.eigh: NaN or inf at rank < D",
          "m = z_text.T @ img\n"
          "s, q = np.linalg.eigh(m @ m.T)\n"
          "return q @ np.diag(1.0 / np.sqrt(s)) @ q.T @ m\n")],
}


def schedule():
    """Copies as {N: index of its mutant}: copy k holds the k-th mutant of each exercise, but those
    of an exercise that calls another's code (NEEDS) go in the copies after all of the other's."""
    shift = {n: len(MUTANTS[m]) for n, m in NEEDS.items()}
    return [{n: k - shift.get(n, 0) for n in MUTANTS if 0 <= k - shift.get(n, 0) < len(MUTANTS[n])}
            for k in range(max(len(m) + shift.get(n, 0) for n, m in MUTANTS.items()))]


def mutant_body(text, e, mutant):
    """Exercise e's body in text, indented, with the mutant's edits made (or its whole body)."""
    what, *edits = mutant
    reference = textwrap.dedent("".join(text.splitlines(keepends=True)[e.start + 1:e.end]))
    body = edits[0] if len(edits) == 1 else reference
    for old, new in zip(edits[::2], edits[1::2]):
        assert body.count(old) == 1, f"{what}: {old!r} is in the reference body " \
                                     f"{body.count(old)} times, not once"
        body = body.replace(old, new)
    assert body != reference, f"{what}: changes nothing"
    return textwrap.indent(body, e.indent)


def write_class(folder):
    """A solved copy named "reference" in folder, and one per schedule() with its mutants
    spliced in. Returns {copy's name: {N: the mistake}}."""
    exercises = {e.number: e for e in course.list_exercises()}
    plan = {"reference": {}, **{f"mutants{i:02d}": {n: MUTANTS[n][k] for n, k in c.items()}
                                for i, c in enumerate(schedule())}}
    for name, mutants in plan.items():
        out = Path(folder) / name
        course.write_copy(out, solved=list(exercises))
        for path in {exercises[n].path for n in mutants}:
            text = (out / path).read_text(encoding="utf-8")
            bodies = {n: [mutant_body(text, exercises[n], m)] for n, m in mutants.items()
                      if exercises[n].path == path}
            (out / path).write_text(course.splice(text, path, bodies), encoding="utf-8")
    return {name: {n: m[0] for n, m in mutants.items()} for name, mutants in plan.items()}
