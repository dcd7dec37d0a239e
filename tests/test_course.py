"""The course kit (minialign/machinery/course.py): the markers, a student copy and restore, the
student's check, and the class grader's worth: every mutant of tests/mutants.py fails."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NEEDS_SOLUTIONS, ROOT

from minialign.machinery import course

EXERCISES = course.list_exercises(ROOT)
ALL = [e.number for e in EXERCISES]
CORE = {"minialign/layers.py", "minialign/losses.py", "minialign/objectives.py",
        "minialign/optim.py", "minialign/metrics.py"}


def copied_files():
    return [rel for rel in course.repository_files(ROOT) if not rel.startswith(course.LEFT_OUT)]


@pytest.fixture(scope="module")
def blank(tmp_path_factory):
    out = tmp_path_factory.mktemp("course") / "blank"
    course.write_copy(out)
    return out


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    if not (ROOT / course.FAST).is_file():
        pytest.skip("a student copy holds no solutions")
    out = tmp_path_factory.mktemp("course") / "solved"
    course.write_copy(out, solved=ALL)
    return out


def test_fourteen_exercises_in_the_core_each_with_its_pytest_marker():
    assert ALL == list(range(1, 15)) and {e.path for e in EXERCISES} == CORE
    markers = re.findall(r'"exercise(\d+): ([^"(]+?)(?: \(needs [\d, ]+\))?"',
                         (ROOT / "pyproject.toml").read_text())
    assert {int(n): t for n, t in markers} == {e.number: e.title for e in EXERCISES}


@pytest.mark.parametrize("text, message", [
    ("    # --- exercise 1: a ---\n    x = 1\n", "m.py:1: exercise 1 is never closed"),
    ("    x = 1\n    # --- end of exercise 1 ---\n", "m.py:2: 'end of exercise 1' closes no"),
    ("  # --- exercise 1: a ---\n    x = 1\n    # --- end of exercise 1 ---\n", "m.py:3: 'end"),
    ("# --- exercise 1: a ---\n# --- exercise 2: b ---\n", "m.py:2: exercise 2 opens inside"),
    ("# --- exercise 1: a ---\n# --- end of exercise 1 ---\n", "m.py:2: exercise 1 marks no"),
])
def test_broken_markers_are_refused_naming_the_line(text, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        course.parse(text, "m.py")


def test_a_stub_spliced_in_and_out_keeps_every_other_byte():
    text = ("def f(x):\n    \"\"\"Doc.\"\"\"\n    # --- exercise 1: f ---\n    y = x + 1\r\n"
            "    return y\n    # --- end of exercise 1 ---\n\n\nZ = 3\r\n")
    stub = course.splice(text, "m.py", {1: [course.parse(text, "m.py")[0].stub]})
    assert stub == ("def f(x):\n    \"\"\"Doc.\"\"\"\n    # --- exercise 1: f ---\n    raise "
                    "NotImplementedError(\"exercise 1: f — see docs/course.md#exercise-1\")\n"
                    "    # --- end of exercise 1 ---\n\n\nZ = 3\r\n")
    assert course.splice(text, "m.py", {}) == text
    assert course.splice(stub, "m.py", {1: ["    y = x + 1\r\n", "    return y\n"]}) == text
    with pytest.raises(ValueError, match="^m.py: marks no exercise 2$"):
        course.splice(stub, "m.py", {2: []})


def test_the_copy_is_the_repository_with_only_the_bodies_blanked(blank):
    for rel in copied_files():
        original = (ROOT / rel).read_bytes()
        stubs = {e.number: [e.stub] for e in EXERCISES if e.path == rel}
        expected = course.splice(original.decode(), rel, stubs).encode() if stubs else original
        assert (blank / rel).read_bytes() == expected, rel
    for e in EXERCISES:
        text = (blank / e.path).read_text()
        assert f"# --- exercise {e.number}: {e.title} ---\n{e.stub}" in text
    assert [(e.number, e.title, e.path) for e in course.list_exercises(blank)] == \
        [(e.number, e.title, e.path) for e in EXERCISES]
    assert not any((blank / rel).exists() for rel in course.repository_files(ROOT)
                   if rel.startswith(course.LEFT_OUT))


@NEEDS_SOLUTIONS
def test_restore_puts_the_bodies_back_byte_for_byte(tmp_path):
    copy = tmp_path / "copy"
    course.write_copy(copy)
    assert course.restore(copy, [1, 12]) == ["minialign/layers.py", "minialign/metrics.py"]
    stubs = (copy / "minialign/layers.py").read_text()
    assert EXERCISES[0].stub not in stubs and EXERCISES[1].stub in stubs
    with pytest.raises(ValueError, match="^--restore: no exercise 99 "):
        course.restore(copy, [99])
    assert course.restore(copy) == sorted(CORE)
    for rel in copied_files():
        assert (copy / rel).read_bytes() == (ROOT / rel).read_bytes(), rel


def test_a_bad_out_or_number_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for out, kwargs, message in [(tmp_path / "full", {}, "not a new or empty directory"),
                                 (ROOT / "docs" / "copy", {}, "inside the repository"),
                                 (tmp_path / "new", {"solved": [99]}, "--solved: no exercise 99")]:
        with pytest.raises(ValueError, match=message):
            course.write_copy(out, **kwargs)
        assert not (tmp_path / "new").exists() and not (ROOT / "docs" / "copy").exists()
    with pytest.raises(ValueError, match="no student copy there"):
        course.restore(tmp_path / "full")


def test_the_solved_copy_encodes_with_the_reference_layers(solved):
    """A copy has no fast path: its model trains minialign/layers.py (--layers reference)."""
    code = ("import numpy as np; from minialign import model\n"
            "cfg = model.ModelConfig(vocab_size=20, max_len=8, d_model=8, n_layers=1, n_heads=2)\n"
            "assert cfg.layers == 'reference', cfg.layers\n"
            "params = model.init_params(cfg, np.random.default_rng(0))\n"
            "z = model.encode(params, np.array([[2, 5, 6, 3, 0]]), cfg, False)[0]\n"
            "assert z.shape == (1, 8) and np.isfinite(z).all(); print(model.__file__)")
    run = subprocess.run([sys.executable, "-c", code], cwd=solved, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(solved)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert Path(run.stdout.strip()) == solved / "minialign" / "model.py"


def make_grade(copy, *marks):
    """`make grade` in a copy, as a bare `pytest` runs it (-I: neither PYTHONPATH nor the working
    directory on sys.path; pyproject's pythonpath alone makes it the copy's minialign):
    (pytest's exit code, the rows conftest.py prints)."""
    run = subprocess.run([sys.executable, "-I", "-m", "pytest", "-q", "--tb=no", "-p",
                          "no:cacheprovider", "tests/test_exercises.py", *marks], cwd=copy,
                         capture_output=True, text=True)
    return run.returncode, [r for r in run.stdout.splitlines() if re.match(r" *\d+  ", r)]


def test_make_grade_says_not_started_on_the_blank_copy_and_passed_on_the_solved_one(solved, blank):
    code, rows = make_grade(blank)                 # the copy's own minialign, not this one's
    assert code == 1 and [r.split()[0] for r in rows] == [str(n) for n in ALL], rows
    assert all(r.endswith("not started") for r in rows), rows
    code, rows = make_grade(solved, "-m", "exercise1 or exercise6 or exercise9 or exercise10 or "
                            "exercise12")          # one exercise per module
    assert code == 0 and [r.split()[0] for r in rows] == ["1", "6", "9", "10", "12"], rows
    assert all(r.endswith("passed") for r in rows), rows


@NEEDS_SOLUTIONS
def test_the_class_grader_fails_every_mutant_and_passes_the_reference(tmp_path):
    """STYLE.md section 12: tests/mutants.py's plausible wrong bodies, in copies graded by one
    grade_class; an exercise that holds a mutant is never "passed", and the reference passes."""
    import mutants
    assert sorted(mutants.MUTANTS) == ALL
    for n, found in mutants.MUTANTS.items():     # write_class: each old text once, a change
        assert len({what for what, *_ in found}) == len(found) >= 4, n
    placed = sorted((n, k) for copy in mutants.schedule() for n, k in copy.items())
    assert placed == [(n, k) for n in ALL for k in range(len(mutants.MUTANTS[n]))]
    assert not any({1, 5} <= set(copy) for copy in mutants.schedule())  # 5 calls 1's code
    plan = mutants.write_class(tmp_path)
    rows = {(Path(r["copy"]).name, r["exercise"]): (r["status"], r["detail"])
            for r in course.grade_class(tmp_path, seed=mutants.SEED)}
    assert {n: rows["reference", n] for n in ALL} == {n: ("passed", "") for n in ALL}, rows
    passed = [f"exercise {n} ({what})" for name, copy in plan.items()
              for n, what in copy.items() if rows[name, n][0] == "passed"]
    assert not passed, f"{len(passed)} mutant(s) graded passed:\n" + "\n".join(passed)
