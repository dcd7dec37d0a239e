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
from minialign.machinery.course.copy import LEFT_OUT, STUDENT_FILE, left_out
from minialign.machinery.images import synthetic
from minialign.machinery.course.exercises import (blank, find_exercises, parse, repository_files,
                                                  restore_solutions, splice, write_student_copy)
from minialign.machinery.course.grade import MARKER

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = find_exercises(ROOT)
GRADE_SECONDS = 60       # the budget for grading every exercise on 2 cores


def run(argv, cwd, code=None, **kwargs):
    """python -m minialign argv in cwd, importing the minialign of `code` (default: cwd's)."""
    env = {**os.environ, "PYTHONPATH": str(code or cwd)}
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
    files = [rel for rel in repository_files(ROOT) if not left_out(rel)]
    assert repository_files(copy) == files                # the same files, no more
    marked = {e.path for e in EXERCISES}
    for rel in files:
        original = (ROOT / rel).read_bytes()
        expected = blank(original.decode(), rel).encode() if rel in marked else original
        assert (copy / rel).read_bytes() == expected, rel
    for e in EXERCISES:
        assert e.stub in (copy / e.path).read_text()
    assert os.access(copy / ".ci" / "run", os.X_OK)       # modes are kept


@pytest.mark.skipif(not (ROOT / LEFT_OUT[-1]).is_file(), reason="the repository's check: a "
                    "student copy holds none of the files it leaves out")
def test_the_copy_leaves_out_the_fast_path_and_the_teachers_files(copy):
    left = [rel for rel in repository_files(ROOT) if left_out(rel)]
    assert "minialign/machinery/fastpath/fast_layers.py" in left
    assert "minialign/machinery/fastpath/rows.py" not in left    # the thread pool: no answer
    assert not any((copy / rel).exists() for rel in left)
    assert not (copy / "docs" / "teacher").exists()
    assert all(left_out(p + "x" if p.endswith("/") else p) for p in LEFT_OUT)
    assert not left_out("docs/teacher.md") and not left_out("tests/test_fast_layers.py.txt")


@pytest.mark.parametrize("make, message", [
    (lambda d: (d / "f").write_text("x") and d / "f", "{out}: is a file; the student copy "
     "needs a new or empty directory"),
    (lambda d: (d / "f").write_text("x") and d / "f" / "course", "{out}: {d}/f is a file, not a "
     "directory; the student copy needs a new or empty directory"),
    (lambda d: (d / "link").symlink_to(d / "gone") or d / "link", "{out}: a symbolic link to "
     "{d}/gone, which does not exist; give a new or empty directory"),
    (lambda d: ROOT / "docs" / "course", "{out}: inside the repository {root}; the student copy "
     "goes outside it, e.g. {root.parent}/course"),
    (lambda d: (d / "full").mkdir() or (d / "full" / "x").write_text("x") and d / "full",
     "{out}: not empty; the student copy needs a new or empty directory"),
])
def test_each_bad_out_is_refused_in_one_line_before_anything_is_written(make, message, tmp_path):
    out = make(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    result = run(["exercises", str(out)], ROOT)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "minialign exercises: error: " + message.format(
        out=out, d=tmp_path, root=ROOT.resolve()) + "\n"
    assert sorted(tmp_path.rglob("*")) == before and not (ROOT / "docs" / "course").exists()


def test_an_empty_out_is_fine_and_solved_exercises_stay(tmp_path):
    (tmp_path / "empty").mkdir()
    write_student_copy(tmp_path / "empty", ROOT, solved=[3], student="ada")
    stubs = blank_lines(tmp_path / "empty" / "minialign/layers.py")
    assert "exercise 3:" not in stubs and "exercise 4:" in stubs
    assert (tmp_path / "empty" / STUDENT_FILE).read_text() == "ada\n"


def test_the_copy_runs_help_and_names_the_exercise_a_command_reaches(copy, tmp_path):
    assert run(["--help"], copy).returncode == 0
    assert run(["grade", "--help"], copy).returncode == 0
    captions, _ = synthetic.write_world(tmp_path / "world", n_scenes=300, seed=0)
    train = ["train", "--objective", "good_views", "--captions", str(captions), "--steps", "2",
             "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--batch-photos", "16",
             "--eval-every", "2", "--out"]
    result = run([*train, str(tmp_path / "runs" / "run")], copy)
    assert result.returncode == 2, result.stderr
    assert "student copy: reference layers (minialign/layers.py) only" in result.stdout.splitlines()
    line = result.stderr.splitlines()[-1]
    m = re.fullmatch(r"minialign train: exercise (\d+) \((.+)\) is not done yet: see "
                     r"docs/course\.md#exercise-\1; `python -m minialign grade \1` checks it", line)
    assert m and EXERCISES[int(m[1]) - 1].title == m[2], line
    assert not (tmp_path / "runs").exists()     # stopped before a checkpoint: nothing left
    (tmp_path / "mine").mkdir()                 # a folder it did not make stays, and says how
    kept = run([*train, str(tmp_path / "mine")], copy)
    assert kept.stderr.splitlines()[-1] == line + (f"; then rerun with --resume "
                                                   f"({tmp_path / 'mine'} holds the run so far)")
    assert (tmp_path / "mine").is_dir()
    resumed = run([*train, str(tmp_path / "mine"), "--resume"], copy)   # as the hint says
    assert resumed.stderr.splitlines()[-1] == kept.stderr.splitlines()[-1]


def test_grade_from_a_subfolder_of_the_copy_grades_the_copy_whatever_python_imports(copy):
    """Run in copy/docs with the repository first on sys.path (as an editable install of it
    makes it): the copy is graded, every exercise "not started", and the header says which."""
    result = run(["grade", "--json", "--student", "ada"], copy / "docs", code=ROOT)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert (report["copy"], report["student"]) == (str(copy.resolve()), "ada")
    assert [(r["number"], r["status"]) for r in report["rows"]] == [
        (e.number, "not started") for e in EXERCISES]
    for r in report["rows"]:                               # every test failed on a stub
        for t in r["tests"]:
            assert t["outcome"] == "failed" and "NotImplementedError: exercise" in t["message"]
    assert report["seconds"] < GRADE_SECONDS
    table = run(["grade", "3"], copy / "docs", code=ROOT).stdout.splitlines()
    assert table[0] == f"grading {copy.resolve()}"
    assert re.match(r" 3  mean pooling +not started +- ", table[2]), table[2]


def test_a_command_run_in_a_copy_that_imports_another_tree_refuses_in_one_line(copy, tmp_path):
    result = run(["train", "--objective", "good_views", "--captions", "x", "--out",
                  str(tmp_path / "run")], copy / "docs", code=ROOT)
    assert result.returncode == 2
    assert result.stderr == (f"minialign train: error: this student copy is {copy.resolve()}, but "
                             f"Python imports minialign from {ROOT.resolve() / 'minialign'}; run "
                             f"it from {copy.resolve()} itself (cd {copy.resolve()}), or `pip "
                             f"install -e {copy.resolve()}`\n")
    assert not (tmp_path / "run").exists()
    assert run(["--help"], ROOT / "docs", code=ROOT).returncode == 0     # the repository: fine
    bad = run(["grade", "--copy", str(tmp_path)], ROOT)
    assert bad.returncode == 2 and bad.stderr == (f"minialign grade: error: --copy {tmp_path}: "
                                                  f"no minialign copy there (pyproject.toml and "
                                                  f"minialign/__init__.py)\n")


@pytest.mark.skipif(not (ROOT / LEFT_OUT[-1]).is_file(), reason="the repository's check: a "
                    "student copy holds no solutions to put back")
def test_the_copy_with_the_solutions_put_back_is_the_repository(copy, tmp_path):
    again = tmp_path / "again"
    write_student_copy(again, ROOT)
    restore_solutions(again, ROOT, numbers=[1, 4])
    assert "exercise 1:" not in blank_lines(again / "minialign/layers.py")
    assert "exercise 2:" in blank_lines(again / "minialign/layers.py")
    result = run(["exercises", "--restore", "2", "12", str(again)], ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"restored exercise(s) 2, 12 in {again} (minialign/layers.py, "
                             f"minialign/metrics.py)\n")
    assert "exercise 2:" not in blank_lines(again / "minialign/layers.py")
    assert "exercise 3:" in blank_lines(again / "minialign/layers.py")
    restore_solutions(again, ROOT)
    for rel in repository_files(ROOT):
        if not left_out(rel):
            assert (again / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
    for argv, message in [(["--restore", "99", str(again)], "--restore: no exercise 99 (there "
                                                            "are 1..14)"),
                          (["--restore", "1", str(tmp_path)], f"{tmp_path}: no student copy "
                           "there (pyproject.toml and minialign/__init__.py)")]:
        result = run(["exercises", *argv], ROOT)
        assert (result.returncode, result.stderr) == (2, f"minialign exercises: error: {message}\n")


def test_restore_and_solved_run_in_a_student_copy_refuse_in_one_line(copy, tmp_path):
    """The copy holds stubs, not solutions: it cannot put one back or leave one in."""
    before = (copy / "minialign/layers.py").read_bytes()
    for argv, what in [(["--restore", "3", str(copy)], "restore"),
                       ([str(tmp_path / "course3"), "--solved", "3"], "leave in (--solved)")]:
        result = run(["exercises", *argv], copy)
        assert (result.returncode, result.stdout, result.stderr) == (2, "", (
            f"minialign exercises: error: {copy.resolve()} is a student copy: it holds no "
            f"solutions to {what}; run this from the repository (the teacher's checkout)\n"))
    assert (copy / "minialign/layers.py").read_bytes() == before
    assert not (tmp_path / "course3").exists()


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
    assert table[0] == f"grading {ROOT.resolve()}"
    assert re.match(r" 5  attention backward +passed +\d\.\de-\d\d +\d+\.\d\d  1$", table[2])
    assert re.match(r" 7  VICReg covariance term +passed +\d\.\de-\d\d +\d+\.\d\d  6$", table[3])


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
    lines = result.stdout.splitlines()[1:]
    assert re.match(r" 4  LayerNorm backward +failed +5\.0e-01 ", lines[1]), lines[1]
    assert re.match(r" 5  attention backward +needs 1 +- ", lines[2]), lines[2]
    assert re.match(r" 6  VICReg variance term +passed ", lines[3]), lines[3]
    assert any(l.startswith("exercise 4, test_layernorm_backward_finite_differences: "
                            "AssertionError: dbeta: relative error 5.0e-01 (tolerance 1e-07)")
               for l in lines), lines
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


def test_the_copy_trains_the_students_layers_and_refuses_the_fast_path(tmp_path):
    """Exercises 6-14 solved, the layers (1-5) not: the copy trains minialign/layers.py by
    default, so it stops at one of the student's layers; --layers fast is refused in one line
    (the copy has no fast path), and so is bench."""
    captions, _ = synthetic.write_world(tmp_path / "world", n_scenes=300, seed=0)
    student = tmp_path / "course"
    write_student_copy(student, ROOT, solved=range(6, len(EXERCISES) + 1))
    train = ["train", "--objective", "good_views", "--captions", str(captions), "--steps", "2",
             "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--batch-photos", "16",
             "--eval-every", "2"]
    reference = run([*train, "--out", str(tmp_path / "reference")], student)
    assert reference.returncode == 2
    m = re.fullmatch(r"minialign train: exercise (\d+) \(.+\) is not done yet: .*",
                     reference.stderr.splitlines()[-1])
    assert m and 1 <= int(m[1]) <= 5, reference.stderr[-500:]
    fast = run([*train, "--out", str(tmp_path / "fast"), "--layers", "fast"], student)
    assert (fast.returncode, fast.stderr.splitlines()[-1]) == (2, (
        'minialign train: error: layers=fast: a student copy has no fast path (docs/course.md, '
        '"What the student copy holds"); it trains minialign/layers.py: --layers reference'))
    assert not (tmp_path / "fast").exists()
    bench = run(["bench"], student)
    assert (bench.returncode, bench.stderr) == (2, (
        'minialign bench: error: a student copy has no fast path to time (docs/course.md, "What '
        'the student copy holds"): run bench in the repository\n'))


@pytest.mark.parametrize("line, message", [
    ("broken = (1,", "SyntaxError at minialign/optim.py:{n}: '(' was never closed"),
    ("x = undefined_name", "NameError at minialign/optim.py:{n}: name 'undefined_name' is not "
                           "defined"),
    ("import not_a_module", "ModuleNotFoundError at minialign/optim.py:{n}: No module named "
                            "'not_a_module'"),
])
def test_a_file_that_does_not_import_is_one_line_for_every_command(line, message, tmp_path):
    """A student's slip in optim.py (exercise 9): train, exercises --list and --help each say
    which file and line, and that grade grades the others; exit 2."""
    copy = tmp_path / "course"
    write_student_copy(copy, ROOT)
    optim = copy / "minialign" / "optim.py"
    n = len(optim.read_text().splitlines()) + 1
    optim.write_text(optim.read_text() + line + "\n")
    expected = (message.format(n=n) + " (the file of exercise 9; `python -m minialign grade` "
                "grades the others)\n")
    for argv, command in [(["train", "--objective", "x"], " train"),
                          (["exercises", "--list"], " exercises"), (["--help"], "")]:
        result = run(argv, copy)
        assert (result.returncode, result.stdout, result.stderr) == (
            2, "", f"minialign{command}: error: {expected}"), argv


@pytest.mark.parametrize("argv", [["exercises", "--list"], ["--help"], ["grade", "--help"]])
def test_a_closed_stdout_ends_quietly(argv):
    """`... | head -1`: the reader is gone before the command writes; no error line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-m", "minialign", *argv], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()
    stderr = child.stderr.read()
    assert child.wait() in (0, 141) and stderr == b"", stderr
