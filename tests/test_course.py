"""The course kit (minialign/machinery/course.py): the markers, a student copy and restore, the
grader on one copy and on a class whatever its copies hold."""
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minialign.machinery import course

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = course.list_exercises(ROOT)
ALL = [e.number for e in EXERCISES]
CORE = {"minialign/layers.py", "minialign/losses.py", "minialign/objectives.py",
        "minialign/optim.py", "minialign/metrics.py"}
needs_solutions = pytest.mark.skipif(not (ROOT / course.FAST).is_file(),
                                     reason="a student copy holds no solutions")


def copied_files():
    return [rel for rel in course.repository_files(ROOT) if not rel.startswith(course.LEFT_OUT)]


@pytest.fixture(scope="module")
def blank(tmp_path_factory):
    out = tmp_path_factory.mktemp("course") / "blank"
    course.write_copy(out, student="ada")
    return out


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    if not (ROOT / course.FAST).is_file():
        pytest.skip("a student copy holds no solutions")
    out = tmp_path_factory.mktemp("course") / "solved"
    course.write_copy(out, solved=ALL)
    return out


# ---------------------------------------------------------------- the markers
def test_fourteen_exercises_in_the_core_each_with_its_pytest_marker():
    assert ALL == list(range(1, 15)) and {e.path for e in EXERCISES} == CORE
    assert course.titles(ROOT / course.TESTS) == {e.number: e.title for e in EXERCISES}


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


def test_blank_and_splice_keep_every_other_byte():
    text = ("def f(x):\n    \"\"\"Doc.\"\"\"\n    # --- exercise 1: f ---\n    y = x + 1\r\n"
            "    return y\n    # --- end of exercise 1 ---\n\n\nZ = 3\r\n")
    stub = course.blank(text, "m.py")
    assert stub == ("def f(x):\n    \"\"\"Doc.\"\"\"\n    # --- exercise 1: f ---\n    raise "
                    "NotImplementedError(\"exercise 1: f — see docs/course.md#exercise-1\")\n"
                    "    # --- end of exercise 1 ---\n\n\nZ = 3\r\n")
    assert course.blank(text, "m.py", solved={1}) == text
    assert course.splice(stub, text, "m.py") == text
    assert course.splice(stub, text, "m.py", numbers=[]) == stub


# ---------------------------------------------------------------- the student copy
def test_the_copy_is_the_repository_with_only_the_bodies_blanked(blank):
    for rel in copied_files():
        original = (ROOT / rel).read_bytes()
        expected = course.blank(original.decode(), rel).encode() if rel in CORE else original
        assert (blank / rel).read_bytes() == expected, rel
    for e in EXERCISES:
        text = (blank / e.path).read_text()
        assert f"# --- exercise {e.number}: {e.title} ---\n    {e.stub}\n" in text
    assert [(e.number, e.title, e.path) for e in course.list_exercises(blank)] == \
        [(e.number, e.title, e.path) for e in EXERCISES]
    assert not any((blank / rel).exists() for rel in course.repository_files(ROOT)
                   if rel.startswith(course.LEFT_OUT))
    assert (blank / course.STUDENT_FILE).read_text() == "ada\n"


@needs_solutions
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


# ---------------------------------------------------------------- the grader
def test_grade_passes_the_solved_copy_and_says_not_started_on_the_blank_one(solved, blank):
    """The blank copy: every exercise's tests reach its own stub first. The solved copy: one
    exercise per module (every exercise's tests pass on the repository: test_exercises.py)."""
    some = [1, 6, 9, 10, 12]             # layers, losses, optim, objectives, metrics
    rows = course.grade(solved, some, jobs=2)
    assert [(r["number"], r["status"]) for r in rows] == [(n, "passed") for n in some], \
        course.table(rows)
    rows = course.grade(blank, jobs=2)          # the copy's code, though Python has the repo's
    assert [(r["number"], r["status"]) for r in rows] == [(n, "not started") for n in ALL], \
        course.table(rows)
    lines = course.table(rows, blank, "ada").splitlines()
    assert lines[0] == f"grading {blank} (student ada)"
    assert lines[-1].startswith("14 exercise(s): 14 not started")


@needs_solutions
def test_a_class_grades_into_one_csv_whatever_a_copy_holds(tmp_path):
    """ada: exercise 3 solved, no student.txt (her folder's name), her copy's tests edited to
    pass everything (the teacher's tests grade); bo: every exercise solved, then metrics.py does
    not parse and the AdamW step starts a process and never ends."""
    group = tmp_path / "class"
    course.write_copy(group / "ada", solved=[3])
    course.write_copy(group / "b", solved=ALL, student="bo")
    (group / "notes").mkdir()                                  # not a copy: no student
    (group / "ada" / course.TESTS).write_text("".join(
        f"import pytest\n@pytest.mark.exercise{n}\ndef test_{n}():\n    pass\n" for n in ALL))
    code = group / "b" / "minialign"
    (code / "metrics.py").write_text((code / "metrics.py").read_text() + "broken = (\n")
    pid_file = tmp_path / "orphan.pid"
    optim = (code / "optim.py").read_text().replace(
        "# --- exercise 9: AdamW step ---\n", "# --- exercise 9: AdamW step ---\n"
        "    import subprocess, sys\n"
        f"    open({str(pid_file)!r}, 'w').write(str(subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(600)']).pid))\n    while True:\n        pass\n")
    (code / "optim.py").write_text(optim)

    rows = course.grade_class(group, numbers=[3, 9, 12], timeout=8, jobs=3)
    table = list(csv.reader((group / "grades.csv").read_text().splitlines()))
    assert table[0] == ["student", "copy", "exercise", "title", "status", "points", "detail"]
    assert [row[:6] for row in table[1:]] == [
        [student, str(group / folder), str(n), EXERCISES[n - 1].title, status, points]
        for student, folder, statuses in [
            ("ada", "ada", ["passed", "not started", "not started"]),
            ("bo", "b", ["passed", "timed out", "failed"])]
        for n, status in zip([3, 9, 12], statuses)
        for points in [f"{course.POINTS[n]:g}" if status == "passed" else "0"]]
    assert len(rows) == 6
    assert table[6][6].startswith("test_recall_at_k_by_hand_with_ties: SyntaxError: '(' was never")
    assert table[6][6].endswith("(at minialign/metrics.py:%d)" % len(
        (code / "metrics.py").read_text().splitlines())), table[6][6]
    pid = int(pid_file.read_text())                  # the hanging exercise's own child is gone
    for _ in range(50):
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {pid}, started by the student's code, outlived grading")
