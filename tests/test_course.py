"""The course kit itself (docs/course.md): the markers, the student copy, the grader.

Every exercise's tests fail on its stub and pass on the solution, and reach no exercise but
it and the needs its marker declares (tests/reached.py traces them on the working code); the
student copy is the repository with only the marked bodies changed, runs `--help`, grades
"not started" everywhere and, with the solutions put back, is the repository again; the
lesson plan lists exactly the marked exercises.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minialign.machinery.course import exercises
from minialign.machinery.images import synthetic
from minialign.machinery.course.exercises import (blank, find_exercises, parse, repository_files,
                                                  restore_solutions, splice, write_student_copy)
from minialign.machinery.course.grade import MARKER

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = find_exercises(ROOT)
GRADE_SECONDS = 60       # the budget for grading every exercise on 2 cores


def run(argv, cwd, **kwargs):
    """python -m minialign argv in cwd, importing the minialign found there."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([sys.executable, "-m", "minialign", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, **kwargs)


def registered_markers():
    """{N: (title, [needs])} from pyproject.toml's pytest markers."""
    text = (ROOT / "pyproject.toml").read_text()
    found = {}
    for line in re.findall(r'^\s*"(exercise\d+: [^"]+)",?$', text, flags=re.M):
        m = MARKER.match(line)
        found[int(m[1])] = (m[2], [int(n) for n in re.findall(r"\d+", m[3] or "")])
    return found


# ---------------------------------------------------------------- the markers
def test_fourteen_exercises_in_the_top_level_modules():
    assert [e.number for e in EXERCISES] == list(range(1, 15))
    assert {e.path for e in EXERCISES} == {"minialign/layers.py", "minialign/losses.py",
                                           "minialign/optim.py", "minialign/objectives.py",
                                           "minialign/metrics.py"}


def test_every_exercise_has_its_registered_marker_and_title():
    markers = registered_markers()
    assert sorted(markers) == [e.number for e in EXERCISES]
    for e in EXERCISES:
        title, needs = markers[e.number]
        assert title == e.title, f"pyproject's exercise{e.number} says {title!r}"
        assert all(n < e.number for n in needs), f"exercise {e.number} needs a later one"


def test_the_lesson_plan_lists_exactly_the_marked_exercises():
    docs = (ROOT / exercises.DOCS).read_text()
    headings = re.findall(r'^<a id="exercise-(\d+)"></a>\n### Exercise \1: (.+)$', docs, re.M)
    assert [(int(n), t) for n, t in headings] == [(e.number, e.title) for e in EXERCISES]
    rows = re.findall(r"^\| \[(\d+)\]\(#exercise-\1\) \| ([^|]+) \|", docs, re.M)
    assert [(int(n), t.strip()) for n, t in rows] == [(e.number, e.title) for e in EXERCISES]


@pytest.mark.parametrize("text, message", [
    ("    # --- exercise 1: a ---\n    x = 1\n", "never closed"),
    ("    x = 1\n    # --- end of exercise 1 ---\n", "does not close"),
    ("  # --- exercise 1: a ---\n    x = 1\n    # --- end of exercise 1 ---\n", "does not close"),
    ("# --- exercise 1: a ---\n# --- exercise 2: b ---\n", "opens inside"),
    ("# --- exercise 1: a ---\n# --- end of exercise 1 ---\n", "marks no code"),
])
def test_broken_markers_are_refused_naming_the_line(text, message):
    with pytest.raises(ValueError, match=message):
        parse(text, "m.py")


def test_blank_keeps_every_other_byte_and_splice_puts_the_body_back():
    text = ("def f(x):\n    \"\"\"Doc.\"\"\"\n    # --- exercise 1: f ---\n    y = x + 1\n"
            "    return y\n    # --- end of exercise 1 ---\n\n\nZ = 3\r\n")
    stub = blank(text, "m.py")
    assert stub == ("def f(x):\n    \"\"\"Doc.\"\"\"\n    # --- exercise 1: f ---\n"
                    "    raise NotImplementedError(\"exercise 1: f — see docs/course.md#exercise-1\")\n"
                    "    # --- end of exercise 1 ---\n\n\nZ = 3\r\n")
    assert blank(text, "m.py", solved={1}) == text
    assert splice(stub, text, "m.py") == text
    assert splice(stub, text, "m.py", numbers=[]) == stub


# ---------------------------------------------------------------- the student copy
@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    out = tmp_path_factory.mktemp("course") / "course"
    write_student_copy(out, ROOT)
    return out


def test_the_copy_is_the_repository_with_only_the_bodies_blanked(copy):
    files = repository_files(ROOT)
    assert repository_files(copy) == files                # the same files, no more
    marked = {e.path for e in EXERCISES}
    for rel in files:
        original = (ROOT / rel).read_bytes()
        expected = blank(original.decode(), rel).encode() if rel in marked else original
        assert (copy / rel).read_bytes() == expected, rel
    for e in EXERCISES:
        assert e.stub in (copy / e.path).read_text()
    assert os.access(copy / ".ci" / "run", os.X_OK)       # modes are kept


def test_a_non_empty_out_is_refused_in_one_line(copy, tmp_path):
    result = run(["exercises", str(copy)], ROOT)
    assert result.returncode == 2
    assert result.stderr == (f"minialign exercises: error: {copy}: not empty; the student copy "
                             f"needs a new or empty directory\n")
    (tmp_path / "empty").mkdir()
    write_student_copy(tmp_path / "empty", ROOT, solved=[3])   # an empty directory is fine
    stubs = blank_lines(tmp_path / "empty" / "minialign/layers.py")
    assert "exercise 3:" not in stubs and "exercise 4:" in stubs


def test_the_copy_runs_help_and_names_the_exercise_a_command_reaches(copy, tmp_path):
    assert run(["--help"], copy).returncode == 0
    assert run(["grade", "--help"], copy).returncode == 0
    captions, _ = synthetic.write_world(tmp_path / "world", n_scenes=300, seed=0)
    result = run(["train", "--objective", "good_views", "--captions", str(captions), "--out",
                  str(tmp_path / "run"), "--steps", "2", "--d-model", "16", "--n-heads", "2",
                  "--n-layers", "1", "--batch-photos", "16", "--eval-every", "2"], copy)
    assert result.returncode == 2, result.stderr
    line = result.stderr.splitlines()[-1]
    m = re.fullmatch(r"minialign train: exercise (\d+) \((.+)\) is not done yet: see "
                     r"docs/course\.md#exercise-\1; `python -m minialign grade \1` checks it", line)
    assert m and EXERCISES[int(m[1]) - 1].title == m[2], line


def test_grade_in_the_copy_says_not_started_for_every_exercise(copy):
    result = run(["grade", "--json"], copy)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert [(r["number"], r["status"]) for r in report["rows"]] == [
        (e.number, "not started") for e in EXERCISES]
    for r in report["rows"]:                               # every test failed on a stub
        for t in r["tests"]:
            assert t["outcome"] == "failed" and "NotImplementedError: exercise" in t["message"]
    assert report["seconds"] < GRADE_SECONDS


def test_the_copy_with_the_solutions_put_back_is_the_repository(copy, tmp_path):
    again = tmp_path / "again"
    write_student_copy(again, ROOT)
    restore_solutions(again, ROOT, numbers=[1, 4])
    assert "exercise 1:" not in blank_lines(again / "minialign/layers.py")
    assert "exercise 2:" in blank_lines(again / "minialign/layers.py")
    restore_solutions(again, ROOT)
    for rel in repository_files(ROOT):
        assert (again / rel).read_bytes() == (ROOT / rel).read_bytes(), rel


def blank_lines(path):
    """The exercise stub lines of a file, joined."""
    return "\n".join(l for l in path.read_text().splitlines() if " — see docs/course.md#" in l)


# ---------------------------------------------------------------- the grader
def test_grade_in_the_repository_passes_every_exercise():
    result = run(["grade", "--json"], ROOT)
    assert result.returncode == 0, result.stdout[-2000:]
    report = json.loads(result.stdout)
    assert [r["status"] for r in report["rows"]] == ["passed"] * len(EXERCISES)
    assert report["seconds"] < GRADE_SECONDS
    table = run(["grade", "5", "7"], ROOT).stdout.splitlines()
    assert re.match(r" 5  attention backward +passed +\d\.\de-\d\d +\d+\.\d\d  1$", table[1])
    assert re.match(r" 7  VICReg covariance term +passed +\d\.\de-\d\d +\d+\.\d\d  6$", table[2])


def test_grade_says_failed_with_the_error_and_needs_for_an_earlier_stub(tmp_path):
    """A wrong LayerNorm backward (dbeta doubled) fails with its relative error; attention
    backward, solved, waits for linear backward, not done."""
    student = tmp_path / "course"
    write_student_copy(student, ROOT, solved=range(2, len(EXERCISES) + 1))
    layers = student / "minialign" / "layers.py"
    right = "dbeta = dy.reshape(-1, D).sum(axis=0)"
    assert right in layers.read_text()
    layers.write_text(layers.read_text().replace(right, "dbeta = 2 * dy.reshape(-1, D).sum(axis=0)"))
    result = run(["grade", "4", "5", "6"], student)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert re.match(r" 4  LayerNorm backward +failed +5\.0e-01 ", lines[1]), lines[1]
    assert re.match(r" 5  attention backward +needs 1 +- ", lines[2]), lines[2]
    assert re.match(r" 6  VICReg variance term +passed ", lines[3]), lines[3]
    assert "exercise 4, test_layernorm_backward_finite_differences: AssertionError: dbeta: " \
           "relative error 5.0e-01 (tolerance 1e-07)" in lines
    assert lines[-1].startswith("3 exercise(s): 1 passed, 1 failed, 0 not started, 1 needs 1, in ")


def test_each_exercises_tests_reach_its_body_and_only_its_needs(tmp_path):
    """Traced on the working code: a test of exercise N runs N's body (so it fails on N's
    stub) and no other marked body but those of N's declared needs (so it passes with only
    those solved); and each declared need is really reached."""
    out = tmp_path / "reached.json"
    # tests/ on PYTHONPATH: pytest < 7.1 imports -p plugins before the ini's pythonpath applies
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "reached",
                             "--reached-out", str(out), "tests/test_exercises.py"], cwd=ROOT,
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout[-2000:]
    tests = json.loads(out.read_text())
    markers = registered_markers()
    for t, found in tests.items():
        assert len(found["markers"]) == 1, f"{t}: exercise markers {found['markers']}"
    for e in EXERCISES:
        mine = {t: found["reached"] for t, found in tests.items() if found["markers"] == [e.number]}
        assert mine, f"exercise {e.number} has no test"
        for t, reached in mine.items():
            assert e.number in reached, f"{t} never runs exercise {e.number}'s body"
            extra = set(reached) - {e.number} - set(markers[e.number][1])
            assert not extra, f"{t} also runs exercise(s) {sorted(extra)}: declare them as needs"
        used = set().union(*mine.values()) - {e.number}
        assert used == set(markers[e.number][1]), f"exercise {e.number} needs {sorted(used)}"


def test_a_child_process_that_reaches_a_stub_names_it_through_its_exit_code():
    from minialign.machinery.grid import jobs
    with pytest.raises(NotImplementedError, match="^exercise 3: mean pooling — see "
                                                  "docs/course.md#exercise-3$") as err:
        jobs.raise_unfinished([0, None, jobs.EXIT_EXERCISE + 3])
    assert exercises.stub_number(err.value) == 3
    assert exercises.unfinished(err.value).startswith("exercise 3 (mean pooling) is not done yet")
    jobs.raise_unfinished([0, 1, 2, jobs.EXIT_INTERRUPTED, None])   # no stub: nothing raised


# ---------------------------------------------------------------- the student's code trains
TINY_GRID = ["--no-estimate", "--jobs", "1", "--steps", "6", "--eval-every", "3",
             "--warmup-steps", "2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1",
             "--batch-photos", "16", "--lr-search", "off", "--seeds", "0"]
LAYERS = ["--layers", "reference"]   # the student's layers.py is what trains


def test_the_copy_with_its_solutions_put_back_trains_the_repositorys_table(tmp_path):
    """make demo LAYERS=reference, small: three objectives, one seed, 6 steps of a D = 16
    encoder on a 300-scene synthetic world, in the restored copy and in the repository."""
    captions, embeddings = synthetic.write_world(tmp_path / "world", n_scenes=300, seed=0)
    student = tmp_path / "student"
    write_student_copy(student, ROOT)
    restore_solutions(student, ROOT)
    tables = {}
    for name, code in [("student", student), ("repository", ROOT)]:
        out = tmp_path / name / "grid" / "results"
        result = run(["replicate", "--captions", str(captions), "--embeddings", str(embeddings),
                      "--out", str(out), *TINY_GRID, *LAYERS], code)
        assert result.returncode == 0, result.stderr[-2000:]
        tables[name] = (out / "results.md").read_text().split("\n## Environment")[0]
    assert "| next_token | 0." in tables["student"]
    assert tables["student"] == tables["repository"]


def test_reference_mode_trains_the_students_layers_and_the_fast_mode_does_not(tmp_path):
    """Exercises 6-14 solved, the layers (1-5) not: the fast set trains, --layers reference
    stops at one of the student's layers."""
    captions, _ = synthetic.write_world(tmp_path / "world", n_scenes=300, seed=0)
    student = tmp_path / "course"
    write_student_copy(student, ROOT, solved=range(6, len(EXERCISES) + 1))
    train = ["train", "--objective", "good_views", "--captions", str(captions), "--steps", "2",
             "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--batch-photos", "16",
             "--eval-every", "2"]
    fast = run([*train, "--out", str(tmp_path / "fast")], student)
    assert fast.returncode == 0, fast.stderr[-2000:]
    reference = run([*train, "--out", str(tmp_path / "reference"), "--layers", "reference"],
                    student)
    assert reference.returncode == 2
    m = re.fullmatch(r"minialign train: exercise (\d+) \(.+\) is not done yet: .*",
                     reference.stderr.splitlines()[-1])
    assert m and 1 <= int(m[1]) <= 5, reference.stderr[-500:]
