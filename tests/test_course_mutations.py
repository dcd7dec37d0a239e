"""The course kit's grading fails wrong answers (STYLE.md section 12): for every exercise,
plausible wrong bodies, the mistakes students make, each of which runs and returns the right
shapes, must fail that exercise's tests; the reference bodies must pass them.

MUTANTS[N] lists exercise N's mutants as (name, the mistake, edits): edits are (old, new)
replacements in the reference body (dedented; each old found exactly once), or one string, a
whole body. Each mutant is graded the way `python -m minialign grade` grades: the tests of
tests/test_exercises.py marked exerciseN, run by pytest in a subprocess whose `minialign` is a
temporary copy of the code with the mutant spliced in. To keep this to seconds, one copy holds
a mutant of several exercises at once, but never of an exercise together with one it needs
(pyproject.toml's "needs 1"), so a test of exercise N fails only because of N's mutant.

`python tests/test_course_mutations.py` prints each mutant and the first test that fails it.
"""
import os
import re
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

if __name__ == "__main__":       # run as a script: this tree's package and tests/ come first
    sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).parent)]
from minialign.machinery.course.exercises import find_exercises  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_exercises.py", "tests/gradcheck.py", "tests/conftest.py"]
MIN_MUTANTS = 4
CONCURRENT = 2            # pytest subprocesses at once (the suite's budget: 2 cores)
TIMEOUT = 600             # seconds for one batch (a few on an idle machine)
# exercise 9's decoupled weight decay, as the reference's loop body writes it
DECAY = ("    if weight_decay and decays(name, decay_embeddings):\n"
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
         [("sum(axis=0)", "sum(axis=0, dtype=np.float64)")])],
    2: [("no_product_rule", "x/2 (1 + th) differentiated as if x were a constant",
         [("0.5 * (1.0 + th) + 0.5 * x * dth_dx", "0.5 * x * dth_dx")]),
        ("tanh_slope_1_minus_th", "tanh' = 1 - th instead of 1 - th^2",
         [("(1.0 - th**2)", "(1.0 - th)")]),
        ("cubic_without_3", "d/dx (x + a x^3) = 1 + a x^2",
         [("3.0 * GELU_A", "GELU_A")]),
        ("writes_into_dy", "dy *= slope, returning dy (the caller's array)",
         [("dx = dy * (", "dy *= ("), ("return dx", "return dy")]),
        ("computes_in_float64", "casts the cache to float64 'for accuracy'",
         [("x, th = cache", "x, th = (np.asarray(a, dtype=np.float64) for a in cache)")])],
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
        ("forgets_gamma", "d/dxhat = dy, gamma forgotten",
         [("g = dy * gamma", "g = dy")]),
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
         [("for d in (dq, dk, dv)", "for d in (dk, dq, dv)")])],
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
        ("half_gradient", "dC's symmetry forgotten: 2 / (D (N - 1)), not 4",
         [("4.0 /", "2.0 /")])],
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
          ("np.log(total[:, 0])", "np.log(total[0, targets])")])],
    9: [("no_bias_correction", "m and v used without 1 / (1 - beta^t)",
         [("step = lr / (1.0 - beta1 ** t)", "step = lr"),
          ("v_scale = 1.0 / (1.0 - beta2 ** t)", "v_scale = 1.0")]),
        ("l2_not_decoupled", "weight decay added to the gradient (Adam + L2), not to the weights",
         [(DECAY, ""),
          ("    m *= beta1\n", "    if weight_decay and decays(name, decay_embeddings):\n"
                             "        g = g + weight_decay * p\n    m *= beta1\n")]),
        ("decays_every_parameter", "LayerNorm gains and biases decayed too",
         [("if weight_decay and decays(name, decay_embeddings):", "if weight_decay:")]),
        ("ignores_decay_embeddings", "decays(name): the decay_embeddings option dropped",
         [("decays(name, decay_embeddings)", "decays(name)")]),
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
            "from .tokenizer import UNK\nreturn targets, (targets != PAD) & (targets != UNK)")])],
    12: [("ties_count_against", "every tie ranks above the correct item",
          [("(sim > correct) | ((sim == correct) & (cols < rows[:, None]))",
            "(sim >= correct) & (cols != rows[:, None])")]),
         ("ties_ignored", "no tie ranks above the correct item",
          [("(sim > correct) | ((sim == correct) & (cols < rows[:, None]))", "sim > correct")]),
         ("rank_le_k", "rank <= k: off by one",
          [("np.mean(rank < k)", "np.mean(rank <= k)")]),
         ("divides_by_gallery", "the hits divided by N_gallery, not by N_query",
          [("float(np.mean(rank < k))", "float(np.sum(rank < k) / n_gallery)")]),
         ("ties_to_the_higher_index", "ties go to the higher index",
          [("cols < rows[:, None]", "cols > rows[:, None]")]),
         ("writes_into_sim", "the diagonal set to -inf in the caller's sim",
          [("correct = sim[rows, rows][:, None]",
            "correct = sim[rows, rows][:, None].copy()\nsim[rows, rows] = -np.inf")])],
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
          [("m = z_text.T @ img", "m = l2_normalize(z_text).T @ l2_normalize(img)")])],
}


# ---------------------------------------------------------------- mutants into code
def reference_bodies(root=ROOT):
    """{N: exercise N's body, dedented} from the code at root."""
    bodies = {}
    for ex in find_exercises(root):
        lines = (root / ex.path).read_text(encoding="utf-8").splitlines(keepends=True)
        bodies[ex.number] = textwrap.dedent("".join(lines[ex.start + 1:ex.end]))
    return bodies


def mutant_body(reference, edits, name):
    """The reference body with edits applied ((old, new) pairs, each old exactly once), or
    edits itself when it is a whole body."""
    if isinstance(edits, str):
        return edits
    body = reference
    for old, new in edits:
        assert body.count(old) == 1, f"mutant {name}: {old!r} is in the reference body " \
                                     f"{body.count(old)} times, not once"
        body = body.replace(old, new)
    return body


def registered_needs(root=ROOT):
    """{N: set of exercises N's tests also run, transitively} from pyproject.toml's markers."""
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    direct = {int(n): {int(m) for m in re.findall(r"\d+", needs or "")} for n, needs in
              re.findall(r'"exercise(\d+): [^"(]+(?:\(needs ([\d, ]+)\))?"', text)}
    closed = {}
    for n in sorted(direct):
        closed[n] = set(direct[n]).union(*(closed.get(m, set()) for m in direct[n]))
    return closed


def schedule(counts, needs):
    """Batches of (exercise, index of its mutant): one mutant per exercise per batch, never
    an exercise with one it needs. counts: {N: number of mutants}. The exercises with the most
    mutants left go first, so the batches are as few as the conflicts allow."""
    left = {n: list(range(c)) for n, c in counts.items()}
    batches = []
    while any(left.values()):
        batch = {}
        for n in sorted(left, key=lambda n: (-len(left[n]), n)):
            if left[n] and not any(m in needs[n] or n in needs[m] for m in batch):
                batch[n] = left[n].pop(0)
        batches.append(batch)
    return batches


def write_copy(dest, bodies, root=ROOT):
    """The package, the exercise tests and pyproject.toml of root copied to dest, the body of
    each exercise in `bodies` ({N: dedented body}) put in place of its reference."""
    shutil.copytree(root / "minialign", dest / "minialign",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / "tests").mkdir()
    for rel in TESTS + ["pyproject.toml"]:
        shutil.copy2(root / rel, dest / rel)
    exercises = {e.number: e for e in find_exercises(root)}
    for path in {exercises[n].path for n in bodies}:
        lines = (dest / path).read_text(encoding="utf-8").splitlines(keepends=True)
        mine = sorted((exercises[n] for n in bodies if exercises[n].path == path),
                      key=lambda e: -e.start)
        for ex in mine:                                  # from the bottom: line numbers hold
            indent = re.match(r" *", lines[ex.start])[0]
            lines[ex.start + 1:ex.end] = [textwrap.indent(bodies[ex.number], indent)]
        (dest / path).write_text("".join(lines), encoding="utf-8")


def start_grading(dest, numbers):
    """pytest on dest's tests marked exercise<N> for N in numbers, importing dest's minialign:
    (the process, the path of its JUnit XML report)."""
    report = dest / "report.xml"
    # no third-party plugin (hypothesis' alone takes ~1 s to import): only pytest's own
    env = {**os.environ, "PYTHONPATH": str(dest), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml",
            str(report), "-m", " or ".join(f"exercise{n}" for n in numbers), TESTS[0]]
    return subprocess.Popen(argv, cwd=dest, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True), report


class Failure(str):
    """A failed test's message (its first line), with .kind, the exception's class (the last
    line of the traceback, "path:line: AssertionError"), and .full, the whole message."""


def read_report(report):
    """[(test name without parameters, full name, None if passed else its Failure)] from a
    JUnit XML report."""
    outcomes = []
    for case in ET.parse(report).iter("testcase"):
        bad = [c for c in case if c.tag in ("failure", "error")]
        failure = None
        if bad:
            full = (bad[0].get("message") or "").strip()
            failure = Failure((full.splitlines() or [bad[0].tag])[0])
            failure.full = full
            failure.kind = ((bad[0].text or "").strip().splitlines() or [""])[-1].split(": ")[-1]
        outcomes.append((case.get("name").split("[")[0], case.get("name"), failure))
    return outcomes


def exercise_of_each_test():
    """{test function name: exercise N} from tests/test_exercises.py's exerciseN marks."""
    import test_exercises
    found = {}
    for name, fn in vars(test_exercises).items():
        marks = [int(m.name[len("exercise"):]) for m in getattr(fn, "pytestmark", [])
                 if re.fullmatch(r"exercise\d+", m.name)]
        if name.startswith("test_") and marks:
            found[name] = marks[0]
    return found


def run_all(runs):
    """Run start_grading(dest, numbers) for each (dest, numbers) in runs, CONCURRENT at once.
    Returns the reports read, in the order of runs."""
    outcomes, pending, active = {}, list(range(len(runs))), []
    try:
        while pending or active:
            while pending and len(active) < CONCURRENT:
                i = pending.pop(0)
                active.append((i, *start_grading(*runs[i])))
            i, proc, report = active.pop(0)
            try:
                output = proc.communicate(timeout=TIMEOUT)[0]
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{runs[i][0]}: still grading after {TIMEOUT} s") from None
            assert report.is_file(), f"{runs[i][0]}: pytest wrote no report:\n{output[-2000:]}"
            outcomes[i] = read_report(report)
    finally:
        for _, proc, _ in active:                    # only after a failure: stop the others
            proc.kill()
            proc.communicate()
    return [outcomes[i] for i in range(len(runs))]


def grade_mutants(workdir, root=ROOT):
    """Grade the reference copy (every exercise) and every batch of mutants (only the mutated
    exercises' tests), copies of the code at root. Returns (the reference's outcomes
    [(exercise, test, None or Failure)], {(N, mutant name): [(test, None or Failure)] of N's
    tests}, the number of pytest runs)."""
    bodies, needs, markers = reference_bodies(root), registered_needs(root), exercise_of_each_test()
    batches = [{}] + schedule({n: len(m) for n, m in MUTANTS.items()}, needs)
    runs = []
    for i, batch in enumerate(batches):
        dest = Path(workdir) / f"batch{i}"
        write_copy(dest, {n: mutant_body(bodies[n], MUTANTS[n][k][2], MUTANTS[n][k][0])
                          for n, k in batch.items()}, root)
        runs.append((dest, sorted(batch) or sorted(bodies)))
    outcomes = run_all(runs)
    reference = [(markers[t], full, msg) for t, full, msg in outcomes[0]]
    mutants = {(n, MUTANTS[n][k][0]): [(full, msg) for t, full, msg in outcomes[i]
                                       if markers[t] == n]
               for i, batch in enumerate(batches) for n, k in batch.items()}
    return reference, mutants, len(runs)


# ---------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return grade_mutants(tmp_path_factory.mktemp("mutants"))


def test_every_exercise_has_four_mutants_that_apply_to_its_reference():
    bodies = reference_bodies()
    assert sorted(MUTANTS) == sorted(bodies)
    for n, mutants in MUTANTS.items():
        assert len(mutants) >= MIN_MUTANTS, f"exercise {n}: {len(mutants)} mutants"
        assert len({name for name, _, _ in mutants}) == len(mutants)
        for name, _, edits in mutants:
            assert mutant_body(bodies[n], edits, name) != bodies[n], name


def test_a_batch_never_holds_an_exercise_with_one_it_needs():
    needs = registered_needs()
    assert needs[5] == {1} and needs[7] == {6}
    batches = schedule({n: len(m) for n, m in MUTANTS.items()}, needs)
    for batch in batches:
        assert not any(m in needs[n] for n in batch for m in batch)
    assert sorted((n, k) for b in batches for n, k in b.items()) == sorted(
        (n, k) for n, m in MUTANTS.items() for k in range(len(m)))


def test_the_reference_bodies_pass(results):
    reference, _, _ = results
    assert sorted({n for n, _, _ in reference}) == sorted(MUTANTS)
    failed = [(n, t, msg) for n, t, msg in reference if msg is not None]
    assert not failed, failed


@pytest.mark.parametrize("number", sorted(MUTANTS))
def test_every_mutant_fails_its_exercise(results, number):
    """Each mutant fails some test of its exercise, by an assertion of the test (the mutant
    ran and returned the right shapes), not by crashing."""
    for name, what, _ in MUTANTS[number]:
        tests = results[1][(number, name)]
        assert tests, f"exercise {number}, mutant {name}: no test ran"
        failed = [(t, msg) for t, msg in tests if msg is not None]
        assert failed, f"exercise {number}, mutant {name} ({what}) passes every test: " \
                       f"a wrong answer would be graded 'passed'"
        for t, msg in failed:
            # a crash is no AssertionError; a wrong shape reads "dx: shape (3, 4)"
            assert msg.kind == "AssertionError" and not re.search(r": shape \(", msg.full), \
                f"exercise {number}, mutant {name}, {t}: {msg.kind}: {msg} (a mutant must " \
                f"run and return the right shapes; fix the mutant)"


if __name__ == "__main__":           # the table: each mutant and the first test failing it
    import tempfile
    import time
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        reference, results, n_runs = grade_mutants(Path(tmp))
    print(f"reference: {sum(m is None for _, _, m in reference)} of {len(reference)} tests "
          f"passed; {len(results)} mutants in {n_runs} pytest runs, "
          f"{time.perf_counter() - t0:.1f} s")
    for n, mutants in MUTANTS.items():
        for name, what, _ in mutants:
            failed = [(t, m) for t, m in results[(n, name)] if m is not None]
            caught = f"{failed[0][0]}: {failed[0][1][:90]}" if failed else "PASSED (not caught)"
            print(f"{n:>2} {name:<26} {what}\n   caught by {caught}")
