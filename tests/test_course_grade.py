"""The grader on what students' files really hold (grade.py, child.py), the teacher's tools
(classes.py, points.csv) and the course kit's make targets.

A copy with a syntax error in one file, a loop that never ends in one exercise, a transposed
gradient and a crash inside a student's function gets one row per exercise, each saying what
went wrong where, and the other exercises are graded; a class of copies is graded into one CSV
against the teacher's tests, so tests a student edited change nothing.
"""
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minialign.machinery.course import classes
from minialign.machinery.course.exercises import find_exercises, write_student_copy

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = find_exercises(ROOT)
HANG_SECONDS = 4         # --timeout of the hanging exercise's test


def run(argv, cwd, code=None):
    """python -m minialign argv in cwd, importing the minialign of `code` (default: cwd's)."""
    env = {**os.environ, "PYTHONPATH": str(code or cwd)}
    return subprocess.run([sys.executable, "-m", "minialign", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True)


def edit(path, old, new):
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A finished copy, then: metrics.py does not parse (exercises 12-14), the AdamW step
    (9) never ends, linear backward (1) returns dw transposed, LayerNorm backward (4) adds
    arrays of different lengths."""
    copy = tmp_path_factory.mktemp("broken") / "course"
    write_student_copy(copy, ROOT, solved=range(1, len(EXERCISES) + 1))
    code = copy / "minialign"
    edit(code / "metrics.py", "    return u @ vt ", "    return u @ vt (")
    edit(code / "optim.py", "    # --- exercise 9: AdamW step ---\n",
         "    # --- exercise 9: AdamW step ---\n    while state['t'] >= 0:\n        pass\n")
    edit(code / "layers.py", "dw = x.reshape(-1, d_in).T @ dy.reshape(-1, d_out)",
         "dw = dy.reshape(-1, d_out).T @ x.reshape(-1, d_in)")
    edit(code / "layers.py", "dbeta = dy.reshape(-1, D).sum(axis=0)",
         "dbeta = dy.reshape(-1, D).sum(axis=0) + np.ones(D + 1)")
    return copy


def line_number(path, text):
    return next(i + 1 for i, l in enumerate(path.read_text().splitlines()) if text in l)


def test_each_broken_exercise_gets_its_own_row_and_the_others_are_graded(broken):
    t0 = time.perf_counter()
    result = run(["grade", "1", "2", "4", "5", "9", "12", "14", "--timeout", str(HANG_SECONDS)],
                 broken)                  # the copy's own grader, though metrics.py breaks cli
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"grading {broken.resolve()}"
    rows = {int(l[:2]): l for l in lines[2:9]}
    for n, state in [(1, "failed"), (2, "passed"), (4, "failed"), (5, "failed"), (9, "timed out"),
                     (12, "error"), (14, "error")]:
        assert re.match(rf"{n:>2}  {EXERCISES[n - 1].title} +{state} ", rows[n]), rows[n]
    assert re.match(r" 1  .* failed +- ", rows[1])          # no relative error: a shape failed
    syntax = line_number(broken / "minialign/metrics.py", "return u @ vt (")
    hang = line_number(broken / "minialign/optim.py", "while state['t'] >= 0:")
    crash = line_number(broken / "minialign/layers.py", "np.ones(D + 1)")
    test_line = line_number(ROOT / "tests/test_exercises.py", "check_all(graded, layer_errors("
                                                            "layers.linear_forward")
    for expected in [
        f"exercise 1, test_linear_backward_finite_differences: AssertionError: dw: shape (3, 4), "
        f"expected (4, 3) (as w's) (at tests/test_exercises.py:{test_line}, in "
        f"test_linear_backward_finite_differences)",
        f"exercise 4, test_layernorm_backward_finite_differences: ValueError: operands could "
        f"not be broadcast together with shapes (5,) (6,) (at minialign/layers.py:{crash}, in "
        f"layernorm_backward)",
        "exercise 5: its tests also run exercise(s) 1, not passed yet: fix those first",
        f"exercise 9: timed out after {HANG_SECONDS} s in minialign/optim.py:{hang}, adam_step "
        f"(a loop that never ends?)",
        f"exercise 12: error: SyntaxError at minialign/metrics.py:{syntax}: '(' was never closed",
        f"exercise 14: error: SyntaxError at minialign/metrics.py:{syntax}: '(' was never closed",
    ]:
        assert expected in lines, "\n".join(lines)
    assert any(l.startswith("exercise 1, test_linear_backward_by_hand: AssertionError: shape "
                            "(3, 2), expected (2, 3) (at tests/test_exercises.py:") for l in lines)
    assert lines[-1].startswith("7 exercise(s): 1 passed, 3 failed, 0 not started, 2 error, "
                                "1 timed out, in ")
    assert f"at most {HANG_SECONDS} s (--timeout)" in lines[-1]
    assert time.perf_counter() - t0 < 60


def test_a_name_error_at_import_names_its_line_and_spares_the_other_modules(tmp_path):
    copy = tmp_path / "course"
    write_student_copy(copy, ROOT, solved=range(1, len(EXERCISES) + 1))
    edit(copy / "minialign/optim.py", "\ndef ", "\nDEFAULT = undefined_name\n\n\ndef ")
    result = run(["grade", "--json", "3", "9"], copy)
    rows = {r["number"]: r for r in __import__("json").loads(result.stdout)["rows"]}
    line = line_number(copy / "minialign/optim.py", "undefined_name")
    assert (rows[3]["status"], rows[9]["status"]) == ("passed", "error")
    assert rows[9]["detail"] == (f"error: NameError at minialign/optim.py:{line}: name "
                                 f"'undefined_name' is not defined")


# ---------------------------------------------------------------- a teacher's tools
def test_the_points_table_parses_and_gives_every_exercise_points(tmp_path):
    points = classes.read_points()
    assert sorted(points) == [e.number for e in EXERCISES]
    assert all(p > 0 for p in points.values())
    for text, message in [("exercise,points\n1,2\n", "no points for exercise(s) 2, 3"),
                          ("1,2\n1,3\n", ":2: exercise 1 is listed twice"),
                          ("1,-1\n", ":1: exercise 1 has points -1; they must be >= 0"),
                          ("# c\n99,1\n", ":2: exercise 99 is no exercise"),
                          ("1;2\n", ":1: '1;2' is not 'exercise,points'")]:
        bad = tmp_path / "points.csv"
        bad.write_text(text)
        with pytest.raises(ValueError, match=re.escape(message)):
            classes.read_points(bad)


def test_a_class_of_three_copies_is_graded_into_one_csv_against_the_teachers_tests(tmp_path):
    """blank (whose student edited the tests to pass everything), half done, finished: graded
    on exercises 1, 3 and 12 against the repository's tests; rows in the folders' order."""
    group = tmp_path / "class"
    write_student_copy(group / "blank", ROOT, student="ada")
    write_student_copy(group / "half", ROOT, solved=[1, 3], student="bo")
    write_student_copy(group / "done", ROOT, solved=range(1, len(EXERCISES) + 1))
    (group / "notes").mkdir()                                 # not a copy: not a student
    (group / "blank" / "tests" / "test_exercises.py").write_text(
        "import pytest\n\n" + "".join(f"@pytest.mark.exercise{e.number}\ndef test_{e.number}():"
                                      f"\n    pass\n\n\n" for e in EXERCISES))
    points = classes.read_points()
    t0 = time.perf_counter()
    result = run(["grade", "--class", str(group), "1", "3", "12"], ROOT)
    seconds = time.perf_counter() - t0
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(io.StringIO((group / "grades.csv").read_text())))
    full = f"{points[1] + points[3] + points[12]:g}"
    assert rows == [
        ["student", "copy", "1", "3", "12", "total"],
        ["ada", str(group / "blank"), "0", "0", "0", "0"],
        ["done", str(group / "done"), f"{points[1]:g}", f"{points[3]:g}", f"{points[12]:g}",
         full],
        ["bo", str(group / "half"), f"{points[1]:g}", f"{points[3]:g}", "0",
         f"{points[1] + points[3]:g}"]]
    statuses = list(csv.reader(io.StringIO((group / "grades-status.csv").read_text())))
    assert statuses == [["student", "copy", "1", "3", "12"],
                        ["ada", str(group / "blank"), "not started", "not started", "not started"],
                        ["done", str(group / "done"), "passed", "passed", "passed"],
                        ["bo", str(group / "half"), "passed", "passed", "not started"]]
    assert result.stdout.splitlines()[:3] == [
        f"ada: 0 / {full} points (not started 1 3 12) in {group / 'blank'}",
        f"done: {full} / {full} points (passed 1 3 12) in {group / 'done'}",
        f"bo: {points[1] + points[3]:g} / {full} points (passed 1 3; not started 12) in "
        f"{group / 'half'}"]
    assert result.stdout.splitlines()[-1].startswith(
        f"wrote {group / 'grades.csv'} and grades-status.csv: 3 copies against the tests in "
        f"{ROOT / 'tests'}, in ")
    assert seconds < 60


def test_a_students_statuses_read_as_one_phrase_with_runs_as_spans():
    rows = [{"number": n, "status": s} for n, s in [
        (1, "passed"), (2, "not started"), (3, "not started"), (4, "passed"), (5, "not started"),
        (6, "passed"), (7, "not started"), (8, "not started"), (9, "error"), (10, "timed out"),
        (11, "needs 10"), (12, "not started"), (13, "not started"), (14, "not started")]]
    assert classes.summary(rows) == ("passed 1 4 6; not started 2 3 5 7 8 12-14; error 9; "
                                     "timed out 10; 11 needs 10")
    assert classes.spans([]) == "" and classes.spans([3, 1, 2, 5]) == "1-3 5"
    assert classes.status_path(Path("a/grades.csv")) == Path("a/grades-status.csv")


def test_class_and_tests_refusals_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    for argv, message in [
            (["--class", str(tmp_path / "empty")], f"--class {tmp_path / 'empty'}: no copy in "
             f"its subfolders (each student's copy is one subfolder holding pyproject.toml and "
             f"minialign/)"),
            (["--out", "x.csv"], "--out, --points: only with --class DIR"),
            (["--tests", str(tmp_path), "1"], f"{tmp_path / 'test_exercises.py'}: no exercise "
             f"tests there")]:
        result = run(["grade", *argv], ROOT)
        assert (result.returncode, result.stderr) == (2, f"minialign grade: error: {message}\n")


# ---------------------------------------------------------------- make, quiet
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_grade_ends_quietly_and_strict_passes_the_exit_code_on(tmp_path):
    copy = tmp_path / "course"
    write_student_copy(copy, ROOT)
    make = ["make", f"PY={sys.executable}", "grade", "EXERCISES=3"]
    quiet = subprocess.run(make, cwd=copy, capture_output=True, text=True)
    assert quiet.returncode == 0, quiet.stderr
    assert "Error" not in quiet.stderr and re.search(r" 3  mean pooling +not started", quiet.stdout)
    strict = subprocess.run([*make, "STRICT=1"], cwd=copy, capture_output=True, text=True)
    assert strict.returncode == 2 and "Error 1" in strict.stderr      # make's own code for 1
    refused = subprocess.run(["make", f"PY={sys.executable}", "exercises", f"OUT={copy}"],
                             cwd=ROOT, capture_output=True, text=True)
    assert (refused.returncode, refused.stderr) == (0, f"minialign exercises: error: {copy}: not "
                                                       f"empty; the student copy needs a new or "
                                                       f"empty directory\n")
    dry = subprocess.run(["make", "-n", "demo"], cwd=copy, capture_output=True, text=True)
    assert "--layers reference" in dry.stdout and "results/synthetic-reference" in dry.stdout


def test_the_copy_is_found_from_a_subfolder_and_another_tree_is_named(tmp_path):
    from minialign.machinery.course.copy import find_copy, mismatch
    copy = tmp_path / "course"
    (copy / "minialign").mkdir(parents=True)
    (copy / "docs" / "deep").mkdir(parents=True)
    (copy / "pyproject.toml").write_text("")
    (copy / "minialign" / "__init__.py").write_text("")
    assert find_copy(copy / "docs" / "deep") == copy.resolve()
    assert find_copy(tmp_path) is None
    assert mismatch(copy, copy / "minialign" / "__init__.py") is None
    assert mismatch(copy, ROOT / "minialign" / "__init__.py") == (
        f"this student copy is {copy}, but Python imports minialign from {ROOT / 'minialign'}; run "
        f"it from {copy} itself (cd {copy}), or `pip install -e {copy}`")
    fast = copy / "minialign" / "machinery" / "fastpath" / "fast.py"   # a plain checkout has it
    fast.parent.mkdir(parents=True)
    fast.write_text("")
    assert mismatch(copy, ROOT / "minialign" / "__init__.py").startswith(
        f"this checkout is {copy}, but Python imports minialign from {ROOT / 'minialign'}; ")


def test_a_dict_comparison_shows_what_differs_not_a_truncated_repr(tmp_path):
    """--tests: a teacher's own tests folder (here one test of exercise 3 comparing dicts)."""
    copy = tmp_path / "course"
    write_student_copy(copy, ROOT, solved=[3])
    (tmp_path / "teacher" / "tests").mkdir(parents=True)
    (tmp_path / "teacher" / "tests" / "test_exercises.py").write_text(
        "import pytest\n\n\n@pytest.mark.exercise3\ndef test_dict():\n"
        "    got = {f'key{i}': i for i in range(30)}\n"
        "    assert got == dict(got, key7=8, key21=0)\n")
    result = run(["grade", "3", "--tests", str(tmp_path / "teacher" / "tests")], copy)
    line = next(l for l in result.stdout.splitlines() if l.startswith("exercise 3, test_dict"))
    assert " ... / Differing items: / {'key" in line, line          # in either order:
    assert "{'key7': 7} != {'key7': 8}" in line and "{'key21': 21} != {'key21': 0}" in line
    assert line.endswith(" (at tests/test_exercises.py:7, in test_dict)"), line
    assert "'key29'" not in line and "Common items" not in line


def test_tests_that_do_not_collect_give_each_row_their_error(tmp_path):
    copy = tmp_path / "course"
    write_student_copy(copy, ROOT, solved=[3])
    (tmp_path / "teacher" / "tests").mkdir(parents=True)
    (tmp_path / "teacher" / "tests" / "test_exercises.py").write_text(
        "import pytest\nfrom minialign.layers import no_such_name\n\n\n"
        "@pytest.mark.exercise3\ndef test_x():\n    pass\n")
    result = run(["grade", "1", "3", "--tests", str(tmp_path / "teacher" / "tests")], copy)
    assert result.returncode == 1
    for n in (1, 3):
        assert (f"exercise {n}: error: test_exercises.py does not collect: ImportError: cannot "
                f"import name 'no_such_name' from 'minialign.layers' "
                f"({copy / 'minialign' / 'layers.py'})") in result.stdout.splitlines()
