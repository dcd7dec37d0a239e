"""Plausible wrong bodies of the course kit's exercises (STYLE.md section 12), for the class
grader (course.grade_class on tests/exercise_cases.py): each must not be graded "passed", and
the reference must pass. MUTANTS[N] lists exercise N's mutants as (name, the mistake, edits):
edits are (old, new) replacements in the reference body (dedented; each old text in it exactly
once), or one string, a whole body. One copy holds a mutant of several exercises, never one of
an exercise together with one of an exercise whose code it calls (NEEDS).

tests/test_course.py runs them; `python tests/mutants.py [SEED]` prints each one's verdict."""
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":               # run as a script: this checkout's package comes first
    sys.path.insert(0, str(ROOT))
from minialign.machinery import course  # noqa: E402

SEED = 20240611          # the grader's inputs: fixed, so a verdict never changes between runs
NEEDS = {5: {1}}         # attention backward calls linear_backward
# exercise 9's decoupled weight decay, as the reference's loop body writes it
DECAY = ("    if weight_decay and name.endswith(DECAYED_SUFFIXES):\n"
         "        p *= 1.0 - lr * weight_decay\n")

MUTANTS = {
    1: [("db_mean", "db averaged over the rows instead of summed",
         [("db = dy.reshape(-1, d_out).sum(axis=0)", "db = dy.reshape(-1, d_out).mean(axis=0)")]),
        ("dw_mean", "dw divided by the number of rows (a mean gradient)",
         [("@ dy.reshape(-1, d_out)", "@ dy.reshape(-1, d_out) / x.reshape(-1, d_in).shape[0]")]),
        ("x_reshaped_not_transposed", "x.reshape(d_in, -1) where x^T is meant",
         [("x.reshape(-1, d_in).T", "x.reshape(d_in, -1)")]),
        ("w_reshaped_not_transposed", "w.reshape(d_out, d_in) where w^T is meant",
         [("@ w.T)", "@ w.reshape(d_out, d_in))")]),
        ("db_float64", "db summed in float64: a float32 model gets a float64 gradient",
         [("sum(axis=0)", "sum(axis=0, dtype=np.float64)")]),
        ("dw_float32", "dw cast to float32 'as the model is': a float64 model gets float32",
         [("dw = x.reshape(-1, d_in).T @ dy.reshape(-1, d_out)",
           "dw = (x.reshape(-1, d_in).T @ dy.reshape(-1, d_out)).astype(np.float32)")])],
    2: [("no_product_rule", "x/2 (1 + th) differentiated as if x were a constant",
         [("0.5 * (1.0 + th) + 0.5 * x * dth_dx", "0.5 * x * dth_dx")]),
        ("tanh_slope_1_minus_th", "tanh' = 1 - th instead of 1 - th^2",
         [("(1.0 - th**2)", "(1.0 - th)")]),
        ("cubic_without_3", "d/dx (x + a x^3) = 1 + a x^2", [("3.0 * GELU_A", "GELU_A")]),
        ("writes_into_dy", "dy *= slope, returning dy (the caller's array)",
         [("dx = dy * (", "dy *= ("), ("return dx", "return dy")]),
        ("computes_in_float64", "casts the cache to float64 'for accuracy'",
         [("x, th = cache", "x, th = (np.asarray(a, dtype=np.float64) for a in cache)")]),
        ("dx_float32", "dx returned as float32, whatever the model's dtype",
         [("return dx", "return dx.astype(np.float32)")])],
    3: [("divides_by_all_rows", "each row weighted 1 / n (all rows), not 1 / n_b",
         [("1.0 / counts[seq]", "1.0 / len(seq)")]),
        ("sum_not_mean", "sum pooling: weight 1",
         [("1.0 / counts[seq]", "1.0")]),
        ("P_in_float64", "P built in float64 (np.zeros' default): float32 h gives float64 z",
         [(", dtype=h.dtype)", ")")]),
        ("rows_assumed_adjacent", "each sequence's rows taken as one contiguous block",
         [("P[seq, np.arange(len(seq))] = 1.0 / counts[seq]",
           "start = np.cumsum(counts) - counts\n"
           "for b in range(n_seqs):\n"
           "    P[b, start[b]:start[b] + counts[b]] = 1.0 / max(counts[b], 1)")]),
        ("empty_sequence_nan", "one-hot / counts: a sequence with no row pools to NaN, not 0",
         [("P[seq, np.arange(len(seq))] = 1.0 / counts[seq]",
           "P[:] = (seq == np.arange(n_seqs)[:, None]) / counts[:, None]")])],
    4: [("no_mean_term", "dx without the part along the ones (the mean's gradient)",
         [("g - g.mean(axis=-1, keepdims=True)", "g")]),
        ("no_xhat_term", "dx without the part along xhat (the std's gradient)",
         [("- xhat * (g * xhat).mean(axis=-1, keepdims=True))", ")")]),
        ("forgets_gamma", "d/dxhat = dy, gamma forgotten", [("g = dy * gamma", "g = dy")]),
        ("dgamma_dbeta_swapped", "returns dx, dbeta, dgamma",
         [("return dx, dgamma, dbeta", "return dx, dbeta, dgamma")]),
        ("writes_into_dy", "g = dy; g *= gamma: scales the caller's dy",
         [("g = dy * gamma", "g = dy\ng *= gamma")])],
    5: [("softmax_elementwise", "softmax backward as probs (1 - probs) dprobs (the diagonal only)",
         [("probs * (dprobs - (probs * dprobs).sum(axis=-1, keepdims=True))",
           "probs * (1.0 - probs) * dprobs")]),
        ("softmax_sum_wrong_axis", "the softmax backward's sum over queries, not keys",
         [("(probs * dprobs).sum(axis=-1, keepdims=True)",
           "(probs * dprobs).sum(axis=-2, keepdims=True)")]),
        ("no_scale", "dq and dk without the 1 / sqrt(Dh) scale",
         [("dq = dscores @ k * scale", "dq = dscores @ k"),
          ("dk = dscores.swapaxes(-1, -2) @ q * scale", "dk = dscores.swapaxes(-1, -2) @ q")]),
        ("dk_not_transposed", "dk = dscores @ q (T x T, so the shape is right)",
         [("dk = dscores.swapaxes(-1, -2) @ q", "dk = dscores @ q")]),
        ("dv_not_transposed", "dv = probs @ da",
         [("dv = probs.swapaxes(-1, -2) @ da", "dv = probs @ da")]),
        ("dq_dk_swapped", "dqkv concatenated as dk | dq | dv",
         [("for d in (dq, dk, dv)", "for d in (dk, dq, dv)")]),
        ("grads_float32", "every gradient returned as float32, whatever the model's dtype",
         [("return dx, dw_qkv, db_qkv, dw_o, db_o",
           "return tuple(d.astype(np.float32) for d in (dx, dw_qkv, db_qkv, dw_o, db_o))")])],
    6: [("biased_variance", "Var with 1 / N, not 1 / (N - 1) (forward and backward)",
         [("/ (N - 1) + VICREG_VAR_EPS", "/ N + VICREG_VAR_EPS"),
          ("((N - 1) * std)", "(N * std)")]),
        ("no_centring", "the variance of z about 0, not about its mean",
         [("zc = z - z.mean(axis=0)", "zc = z")]),
        ("eps_outside_sqrt", "std = sqrt(var) + eps",
         [("np.sqrt((zc * zc).sum(axis=0) / (N - 1) + VICREG_VAR_EPS)",
           "np.sqrt((zc * zc).sum(axis=0) / (N - 1)) + VICREG_VAR_EPS")]),
        ("sum_over_dims", "the hinges summed over the D dimensions, not averaged",
         [("np.maximum(hinge, 0.0).mean()", "np.maximum(hinge, 0.0).sum()"),
          ("astype(z.dtype) / D", "astype(z.dtype)")]),
        ("hinge_on_variance", "relu(1 - (Var + eps)): the variance hinged, not the std",
         [("hinge = VICREG_STD_TARGET - std", "hinge = VICREG_STD_TARGET - std**2"),
          ("dz = zc * (dstd / ((N - 1) * std))", "dz = zc * (dstd * 2.0 / (N - 1))")]),
        ("backward_ignores_hinge", "every dimension pulled, also those above the hinge",
         [("-(hinge > 0).astype(z.dtype) / D", "-np.ones_like(hinge) / D")]),
        ("mask_in_float64", "np.where(hinge > 0, -1.0 / D, 0.0): float64, so dz turns float64",
         [("-(hinge > 0).astype(z.dtype) / D", "np.where(hinge > 0, -1.0 / D, 0.0)")])],
    7: [("no_centring", "C = z^T z / (N - 1), z not centred",
         [("zc = z - z.mean(axis=0)", "zc = z")]),
        ("biased_covariance", "C with 1 / N (forward and backward)",
         [("C = zc.T @ zc / (N - 1)", "C = zc.T @ zc / N"), ("(D * (N - 1))", "(D * N)")]),
        ("diagonal_included", "the variances on C's diagonal squared in too",
         [("c = (off * off).sum() / D", "c = (C * C).sum() / D"),
          ("dz = zc @ off", "dz = zc @ C")]),
        ("mean_over_pairs", "divided by the D (D - 1) pairs, not by D",
         [("c = (off * off).sum() / D", "c = (off * off).sum() / (D * (D - 1))"),
          ("(4.0 / (D * (N - 1)))", "(4.0 / (D * (D - 1) * (N - 1)))")]),
        ("half_gradient", "dC's symmetry forgotten: 2 / (D (N - 1)), not 4", [("4.0 /", "2.0 /")])],
    8: [("grad_not_divided_by_n", "dlogits = softmax - onehot, the 1 / n of the mean forgotten",
         [("dlogits /= n\n", "")]),
        ("sum_not_mean", "loss and gradient summed over the targets, not averaged",
         [(".mean())", ".sum())"), ("dlogits /= n\n", "")]),
        ("writes_into_logits", "the row max subtracted in place, from the caller's logits",
         [("shifted = logits - logits.max(axis=1, keepdims=True)",
           "logits -= logits.max(axis=1, keepdims=True)\nshifted = logits")]),
        ("onehot_in_float64", "dlogits = probs - np.eye(V)[targets]: float64 for float32 logits",
         [("dlogits[rows, targets] -= 1.0", "dlogits = dlogits - np.eye(V)[targets]")]),
        ("softmax_over_the_batch", "max, exp-sum and normaliser over axis 0 (the rows)",
         [("logits.max(axis=1, keepdims=True)", "logits.max(axis=0, keepdims=True)"),
          ("probs.sum(axis=1, keepdims=True)", "probs.sum(axis=0, keepdims=True)"),
          ("np.log(total[:, 0])", "np.log(total[0, targets])")]),
        ("global_max", "the whole array's maximum subtracted, not each row's",
         [("logits.max(axis=1, keepdims=True)", "logits.max()")]),
        ("log_of_probs", "-log of the normalised probability (0 when it underflows)",
         [("nll = np.log(total[:, 0]) - shifted[rows, targets]",
           "nll = -np.log(probs[rows, targets] / total[:, 0])")])],
    9: [("no_bias_correction", "m and v used without 1 / (1 - beta^t)",
         [("step = lr / (1.0 - beta1 ** t)", "step = lr"),
          ("v_scale = 1.0 / (1.0 - beta2 ** t)", "v_scale = 1.0")]),
        ("l2_not_decoupled", "weight decay added to the gradient (Adam + L2), not to the weights",
         [(DECAY, ""),
          ("    m *= beta1\n", "    if weight_decay and name.endswith(DECAYED_SUFFIXES):\n"
                             "        g = g + weight_decay * p\n    m *= beta1\n")]),
        ("decays_every_parameter", "LayerNorm gains and biases decayed too",
         [("if weight_decay and name.endswith(DECAYED_SUFFIXES):", "if weight_decay:")]),
        ("decays_embeddings", "the token embedding decayed too, as a weight matrix",
         [("name.endswith(DECAYED_SUFFIXES)", "name.endswith(DECAYED_SUFFIXES + ('tok_emb',))")]),
        ("eps_inside_sqrt", "sqrt(v_hat + eps), not sqrt(v_hat) + eps",
         [("np.sqrt(v * v_scale)", "np.sqrt(v * v_scale + eps)"), ("    denom += eps\n", "")]),
        ("decay_after_update", "the weights decayed after the Adam step, not before",
         [(DECAY, ""), ("    p -= step * m / denom\n", "    p -= step * m / denom\n" + DECAY)]),
        ("ignores_beta_arguments", "the module's ADAM_BETA1, ADAM_BETA2, not the arguments",
         [('state["t"] += 1', 'beta1, beta2 = ADAM_BETA1, ADAM_BETA2\nstate["t"] += 1')]),
        ("not_in_place", "params[name] = p - ...: a new array, the caller's is not updated",
         [("p -= step * m / denom", "params[name] = p - step * m / denom")])],
    10: [("unk_and_mask_are_words", "only PAD, BOS and EOS kept: UNK and MASK get masked",
          [("is_word = tokens >= len(SPECIALS)",
            "from .tokenizer import BOS, EOS\n"
            "is_word = (tokens != PAD) & (tokens != BOS) & (tokens != EOS)")]),
         ("draws_only_for_words", "one draw per word, not per position: other draws",
          [("u = rng.random(tokens.shape)",
            "u = np.ones(tokens.shape)\nu[is_word] = rng.random(int(is_word.sum()))")]),
         ("no_keep_one", "a caption may lose every word",
          [("masked[rows, keep[rows]] = False", "pass")]),
         ("keeps_the_first_word", "keeps the caption's first word, not the largest draw",
          [("keep = np.argmax(np.where(is_word, u, -1.0), axis=1)",
            "keep = np.argmax(is_word, axis=1)")]),
         ("writes_into_tokens", "tokens[masked] = MASK, returning the caller's array",
          [("return np.where(masked, MASK, tokens).astype(tokens.dtype)",
            "tokens[masked] = MASK\nreturn tokens")]),
         ("rate_reversed", "u > rate: masks with probability 1 - rate",
          [("(u < rate)", "(u > rate)")])],
    11: [("previous_token", "shifted the wrong way: each token 'predicts' the one before",
          [("targets[:, :-1] = tokens[:, 1:]", "targets[:, 1:] = tokens[:, :-1]")]),
         ("eos_not_a_target", "EOS masked as a target: the model never learns to stop",
          [("return targets, targets != PAD",
            "from .tokenizer import EOS\nreturn targets, (targets != PAD) & (targets != EOS)")]),
         ("every_token_has_a_target", "has_target all True: EOS 'predicts' PAD",
          [("return targets, targets != PAD",
            "return targets, np.ones(len(targets), dtype=bool)")]),
         ("bos_masked", "no target at BOS (the first word is never predicted)",
          [("return targets, targets != PAD",
            "from .tokenizer import BOS\n"
            "return targets, (targets != PAD) & (tokens[tokens != PAD] != BOS)")]),
         ("packed_column_by_column", "targets packed in column order, not caption by caption",
          [("targets = targets[tokens != PAD]", "targets = targets.T[tokens.T != PAD]")]),
         ("unk_not_a_target", "UNK masked as a target",
          [("return targets, targets != PAD",
            "from .tokenizer import UNK\nreturn targets, (targets != PAD) & (targets != UNK)")]),
         ("float_targets", "targets built in np.zeros' float64: token ids as floats",
          [("targets = np.full_like(tokens, PAD)", "targets = np.zeros(tokens.shape) + PAD")])],
    12: [("ties_count_against", "every tie ranks above the correct item",
          [("(sim > correct) | ((sim == correct) & (cols < rows[:, None]))",
            "(sim >= correct) & (cols != rows[:, None])")]),
         ("ties_ignored", "no tie ranks above the correct item",
          [("(sim > correct) | ((sim == correct) & (cols < rows[:, None]))", "sim > correct")]),
         ("rank_le_k", "rank <= k: off by one", [("np.mean(rank < k)", "np.mean(rank <= k)")]),
         ("divides_by_gallery", "the hits divided by N_gallery, not by N_query",
          [("float(np.mean(rank < k))", "float(np.sum(rank < k) / n_gallery)")]),
         ("ties_to_the_higher_index", "ties go to the higher index",
          [("cols < rows[:, None]", "cols > rows[:, None]")]),
         ("writes_into_sim", "the diagonal set to -inf in the caller's sim",
          [("correct = sim[rows, rows][:, None]",
            "correct = sim[rows, rows][:, None].copy()\nsim[rows, rows] = -np.inf")]),
         ("unstable_sort", "rank = the correct item's place in np.argsort(-sim) (not stable)",
          "order = np.argsort(-sim, axis=1)\n"
          "rank = np.argmax(order == np.arange(n_query)[:, None], axis=1)\n"
          "return {f\"R@{k}\": float(np.mean(rank < k)) for k in ks}\n"),
         ("isclose_ties", "ties found with np.isclose, not ==",
          [("(sim == correct)", "np.isclose(sim, correct)")])],
    13: [("self_among_neighbours", "neighbours from cosine_similarity sorted, self not excluded",
          [("knn_indices(A, k)", "np.argsort(-cosine_similarity(A, A), axis=1)[:, :k]"),
           ("knn_indices(B, k)", "np.argsort(-cosine_similarity(B, B), axis=1)[:, :k]")]),
         ("jaccard", "|A & B| / |A | B| (Jaccard), not |A & B| / k",
          [("np.mean(overlap / k)", "np.mean(overlap / (2 * k - overlap))")]),
         ("k_is_one", "only the nearest neighbour compared, whatever k",
          [("return float(np.mean(overlap / k))",
            "return float(np.mean(knn_indices(A, 1)[:, 0] == knn_indices(B, 1)[:, 0]))")]),
         ("positional_match", "the two lists compared position by position, not as sets",
          "overlap = np.sum(knn_indices(A, k) == knn_indices(B, k), axis=1)\n"
          "return float(np.mean(overlap / k))\n"),
         ("euclidean", "neighbours by Euclidean distance, not cosine similarity",
          "def knn(x):\n"
          "    d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1)\n"
          "    np.fill_diagonal(d, np.inf)\n"
          "    return np.argsort(d, axis=1, kind=\"stable\")[:, :k]\n"
          "overlap = [len(set(a) & set(b)) for a, b in zip(knn(A), knn(B))]\n"
          "return float(np.mean(np.array(overlap) / k))\n"),
         ("self_sorts_first", "argsort of -sim with column 0 dropped as 'itself' (no -inf)",
          [("knn_indices(A, k)",
            "np.argsort(-cosine_similarity(A, A), axis=1, kind='stable')[:, 1:k + 1]"),
           ("knn_indices(B, k)",
            "np.argsort(-cosine_similarity(B, B), axis=1, kind='stable')[:, 1:k + 1]")]),
         ("argpartition", "the k nearest picked by np.argpartition (ties broken anyhow)",
          "def knn(x):\n"
          "    sim = cosine_similarity(x, x)\n"
          "    np.fill_diagonal(sim, -np.inf)\n"
          "    return np.argpartition(-sim, k - 1, axis=1)[:, :k]\n"
          "overlap = [len(set(a) & set(b)) for a, b in zip(knn(A), knn(B))]\n"
          "return float(np.mean(np.array(overlap) / k))\n")],
    14: [("least_squares", "the unconstrained least-squares map, not an orthogonal one",
          "return np.linalg.lstsq(z_text, img, rcond=None)[0]\n"),
         ("keeps_singular_values", "U S V^T: M itself, not its orthogonal factor",
          [("u, _, vt =", "u, s, vt ="), ("return u @ vt", "return u @ np.diag(s) @ vt")]),
         ("made_a_proper_rotation", "a reflection flipped to det +1 (Kabsch's fix)",
          [("return u @ vt", "if m.shape[0] == m.shape[1] and np.linalg.det(u @ vt) < 0:\n"
                             "    u[:, -1] *= -1\nreturn u @ vt")]),
         ("recentres_inputs", "z and img centred again inside (prepare_for_rotation does it)",
          [("m = z_text.T @ img",
            "m = (z_text - z_text.mean(axis=0)).T @ (img - img.mean(axis=0))")]),
         ("renormalises_rows", "rows L2-normalised again inside",
          [("m = z_text.T @ img", "m = l2_normalize(z_text).T @ l2_normalize(img)")]),
         ("polar_by_eigh", "W = (M M^T)^(-1/2) M by np.linalg.eigh: NaN or inf at rank < D",
          "m = z_text.T @ img\n"
          "s, q = np.linalg.eigh(m @ m.T)\n"
          "return q @ np.diag(1.0 / np.sqrt(s)) @ q.T @ m\n")],
}


def mutant_body(reference, edits, name):
    """The reference with the edits made (each old text found exactly once), or edits itself
    when it is a whole body."""
    if isinstance(edits, str):
        return edits
    for old, new in edits:
        assert reference.count(old) == 1, f"mutant {name}: {old!r} is in the reference body " \
                                          f"{reference.count(old)} times, not once"
        reference = reference.replace(old, new)
    return reference


def schedule():
    """Copies as {N: index of its mutant}: one mutant per exercise, none with one it needs or
    one that needs it; the exercises with the most mutants left first (fewest copies)."""
    left = {n: list(range(len(m))) for n, m in MUTANTS.items()}
    copies = []
    while any(left.values()):
        copy = {}
        for n in sorted(left, key=lambda n: (-len(left[n]), n)):
            if left[n] and not any(m in NEEDS.get(n, ()) or n in NEEDS.get(m, ()) for m in copy):
                copy[n] = left[n].pop(0)
        copies.append(copy)
    return copies


def write_class(folder, root=ROOT):
    """A solved copy of root named "reference" in folder, and one per schedule() with its
    mutants spliced in. Returns {copy's name: {N: (mutant name, the mistake)}}."""
    exercises = {e.number: e for e in course.list_exercises(root)}
    bodies = {n: textwrap.dedent("".join((root / e.path).read_text(encoding="utf-8").splitlines(
        keepends=True)[e.start + 1:e.end])) for n, e in exercises.items()}     # dedented
    plan = {"reference": {}, **{f"mutants{i:02d}": {n: MUTANTS[n][k] for n, k in c.items()}
                                for i, c in enumerate(schedule())}}
    for name, mutants in plan.items():
        course.write_copy(Path(folder) / name, solved=list(exercises), student=name, root=root)
        for path in {exercises[n].path for n in mutants}:
            file = Path(folder) / name / path
            lines = file.read_text(encoding="utf-8").splitlines(keepends=True)
            for e in sorted((exercises[n] for n in mutants if exercises[n].path == path),
                            key=lambda e: -e.start):        # from the bottom: line numbers hold
                mutant, _, edits = mutants[e.number]
                body = mutant_body(bodies[e.number], edits, mutant)
                assert body != bodies[e.number], f"mutant {mutant} changes nothing"
                indent = course.START.match(lines[e.start].rstrip("\n"))[1]
                lines[e.start + 1:e.end] = [textwrap.indent(body, indent)]
            file.write_text("".join(lines), encoding="utf-8")
    return {name: {n: m[:2] for n, m in mutants.items()} for name, mutants in plan.items()}


def grade_mutants(folder, seed=SEED):
    """write_class(folder), then one grade_class of it. Returns (the reference copy's
    {N: (status, detail)}, [(N, mutant name, the mistake, status, detail)] in MUTANTS' order)."""
    plan = write_class(folder)
    rows = {(Path(r["copy"]).name, r["exercise"]): (r["status"], r["detail"])
            for r in course.grade_class(folder, seed=seed)}
    reference = {n: verdict for (name, n), verdict in rows.items() if name == "reference"}
    verdicts = {(n, mutant[0]): rows[name, n] for name, mutants in plan.items()
                for n, mutant in mutants.items()}
    return reference, [(n, name, what, *verdicts[n, name]) for n in MUTANTS
                       for name, what, _ in MUTANTS[n]]


if __name__ == "__main__":                 # the table: each mutant and the grader's verdict
    import tempfile
    import time
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else SEED       # python tests/mutants.py [SEED]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        reference, results = grade_mutants(tmp, seed)
    print(f"\nreference: {sum(s == 'passed' for s, _ in reference.values())} of "
          f"{len(reference)} passed; {sum(r[3] != 'passed' for r in results)} of {len(results)} "
          f"mutants caught in {time.perf_counter() - t0:.1f} s (--seed {seed})")
    for n, name, what, status, detail in results:
        print(f"{n:>2} {name:<26} {status:<7} {what}\n{'':29}{detail.splitlines()[0][:100]}"
              if detail else f"{n:>2} {name:<26} {status:<7} {what}")
