"""The course kit (docs/course.md): exercises marked in the working code (a body between
`# --- exercise N: title ---` and `# --- end of exercise N ---` in a module of minialign/), a
student copy with them blanked (Exercise.stub) and without LEFT_OUT (the fast path computes their
maths), and a grader running each exercise's tests (tests/test_exercises.py marked exerciseN) in
a process of its own. Standard library only: grading imports no student code."""
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]     # the repository (or student copy) of this code
START = re.compile(r"^( *)# --- exercise (\d+): (.+) ---$")
END = re.compile(r"^( *)# --- end of exercise (\d+) ---$")
FAST = "minialign/machinery/fast.py"
LEFT_OUT = ("docs/teacher/", FAST, "tests/test_fast.py")    # prefixes kept out of a copy
STUDENT_FILE = "student.txt"                                 # a copy's student id, first line
TESTS = "tests/test_exercises.py"
TIMEOUT = 60.0       # seconds one exercise's tests may run (each takes about one here)
POINTS = {1: 2, 2: 2, 3: 2, 4: 3, 5: 4, 6: 2, 7: 3, 8: 2, 9: 3, 10: 2, 11: 2, 12: 2, 13: 3, 14: 3}
# The grader's child: pytest, with an editable install's import hook removed, so a module
# missing from the copy is missing, not the teacher's (the copy comes first on PYTHONPATH).
CHILD = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in "
         "getattr(f, '__name__', type(f).__name__)]; import pytest; sys.exit(pytest.main())")


class Exercise(NamedTuple):
    """One marked body: path relative to the root; start, end: 0-based lines of its comments."""
    number: int
    title: str
    path: str
    start: int
    end: int

    @property
    def stub(self):
        return (f'raise NotImplementedError("exercise {self.number}: {self.title} — see '
                f'docs/course.md#exercise-{self.number}")')


def parse(text, path):
    """The exercises marked in one module's text, in file order. Raises ValueError naming path:line
    for an unclosed or unopened pair, nested or empty pairs, or a pair at two indentations."""
    found, opened = [], None
    for i, line in enumerate(text.splitlines()):
        start, end = START.match(line), END.match(line)
        if start and opened:
            raise ValueError(f"{path}:{i + 1}: exercise {start[2]} opens inside "
                             f"exercise {opened[2]}")
        if start:
            opened = (i, start[1], int(start[2]), start[3])
        elif end:
            if not opened or (end[1], int(end[2])) != (opened[1], opened[2]):
                raise ValueError(f"{path}:{i + 1}: 'end of exercise {end[2]}' closes no opening "
                                 f"comment of that number and indentation")
            if i == opened[0] + 1:
                raise ValueError(f"{path}:{i + 1}: exercise {end[2]} marks no code")
            found.append(Exercise(opened[2], opened[3], path, opened[0], i))
            opened = None
    if opened:
        raise ValueError(f"{path}:{opened[0] + 1}: exercise {opened[2]} is never closed")
    return found


def list_exercises(root=ROOT, numbers=(), flag=""):
    """Every exercise marked in root/minialign/*.py, by number. Raises ValueError unless they are
    numbered 1..N, each once, or (naming `flag`) when `numbers` holds one that is not there."""
    found = sorted((e for p in sorted(Path(root, "minialign").glob("*.py"))
                    for e in parse(p.read_text(encoding="utf-8"), f"minialign/{p.name}")),
                   key=lambda e: e.number)
    if [e.number for e in found] != list(range(1, len(found) + 1)):
        raise ValueError(f"{Path(root) / 'minialign'}: exercise numbers must be 1..N, each "
                         f"once; found {[e.number for e in found]}")
    if unknown := sorted(set(numbers) - {e.number for e in found}):
        raise ValueError(f"{flag}: no exercise {', '.join(map(str, unknown))} "
                         f"(there are 1..{len(found)})")
    return found


def blank(text, path, solved=()):
    """text with each marked body but those numbered in `solved` replaced by its stub line."""
    lines = text.splitlines(keepends=True)
    for e in reversed(parse(text, path)):
        if e.number not in solved:
            indent = START.match(lines[e.start].rstrip("\r\n"))[1]
            lines[e.start + 1:e.end] = [f"{indent}{e.stub}\n"]
    return "".join(lines)


def splice(student, solution, path, numbers=None):
    """The student's text with the bodies of `numbers` (None: all) taken from the solution's."""
    mine, theirs = parse(student, path), {e.number: e for e in parse(solution, path)}
    if sorted(e.number for e in mine) != sorted(theirs):
        raise ValueError(f"{path}: the copy and the repository mark different exercises")
    lines, solved = student.splitlines(keepends=True), solution.splitlines(keepends=True)
    for e in reversed(mine):
        if numbers is None or e.number in numbers:
            s = theirs[e.number]
            lines[e.start + 1:e.end] = solved[s.start + 1:s.end]
    return "".join(lines)


def repository_files(root=ROOT):
    """The repository's files, relative posix paths, sorted: tracked or not ignored by git
    (`git ls-files`), or outside a checkout every file but caches, runs and results."""
    root = Path(root)
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=True).stdout.strip()
        if Path(top).resolve() == root.resolve():
            listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached",
                                     "--others", "--exclude-standard"], capture_output=True,
                                    check=True).stdout.decode().split("\0")
            return sorted({p for p in listed if p and (root / p).is_file()})
    except (OSError, subprocess.CalledProcessError):      # no git, or not a checkout of its own
        pass
    skip = {"__pycache__", "runs", "results", "build"}
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
                  and not any(part.startswith(".") or part in skip or part.endswith(".egg-info")
                              for part in p.relative_to(root).parts) and p.suffix != ".pyc")


def check_teacher(root, what):
    if not (Path(root) / FAST).is_file():
        raise ValueError(f"{root} is a student copy: it holds no solutions to {what}; run this "
                         f"from the repository (the teacher's checkout)")


def write_copy(out, solved=(), student=None, root=ROOT):
    """Write root's student copy into `out` (new or empty, outside root): all but `solved`
    blanked, `student` in STUDENT_FILE. Refuses before writing; returns (exercises, file count)."""
    out, root = Path(out), Path(root)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: not a new or empty directory")
    if root.resolve() in [out.resolve(), *out.resolve().parents]:
        raise ValueError(f"{out}: inside the repository {root.resolve()}; the copy goes outside it")
    if solved:
        check_teacher(root, "leave in (--solved)")
    exercises = list_exercises(root, solved, "--solved")
    marked = {e.path for e in exercises}
    files = [rel for rel in repository_files(root) if not rel.startswith(LEFT_OUT)]
    for rel in files:
        src, dst = root / rel, out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel in marked:
            dst.write_bytes(blank(src.read_bytes().decode(), rel, solved).encode())
        else:
            shutil.copy2(src, dst)
    if student:
        (out / STUDENT_FILE).write_text(f"{student}\n", encoding="utf-8")
    return exercises, len(files)


def restore(copy, numbers=None, root=ROOT):
    """Put root's bodies of exercises `numbers` (None: all) back into the student copy at `copy`,
    the rest untouched; ValueError before writing anything. Returns the paths rewritten."""
    copy = Path(copy)
    if not (copy / "minialign" / "__init__.py").is_file():
        raise ValueError(f"{copy}: no student copy there (no minialign/__init__.py)")
    check_teacher(root, "restore")
    exercises = list_exercises(root, numbers or (), "--restore")
    paths = sorted({e.path for e in exercises if numbers is None or e.number in numbers})
    texts = {rel: splice((copy / rel).read_bytes().decode(), (Path(root) / rel).read_bytes()
                         .decode(), f"{copy / rel}", numbers) for rel in paths}
    for rel, text in texts.items():                      # every file spliced before any write
        (copy / rel).write_bytes(text.encode())
    return paths


def titles(tests):
    """{N: title} of the exerciseN markers in the pyproject.toml beside the tests' folder."""
    text = (Path(tests).resolve().parent.parent / "pyproject.toml").read_text(errors="replace")
    return {int(n): t for n, t in re.findall(r'"exercise(\d+): ([^"(]+?)(?: \([^")]*\))?"', text)}


def run_tests(copy, tests, number, timeout):
    """Exercise `number`'s tests on the copy's code: pytest in a child (own session, scratch cwd,
    the copy first on its path), its process group killed at `timeout` s or its end."""
    if not (copy / "minialign" / "__init__.py").is_file():    # or Python finds another minialign
        return "error", f"{copy}: no minialign/__init__.py"
    with tempfile.TemporaryDirectory() as scratch:
        report, log = Path(scratch, "report.xml"), Path(scratch, "output.txt")
        env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1",
               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        argv = [sys.executable, "-c", CHILD, str(tests), "-q", "-m", f"exercise{number}",
                "-p", "no:cacheprovider", "--noconftest", "--import-mode=importlib",
                f"--junitxml={report}"]
        with open(log, "wb") as output:
            child = subprocess.Popen(argv, cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                                     stdout=output, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                return "timed out", f"after {timeout:g} s (a loop that never ends?)"
            finally:                  # the child and every process it started, then reap it
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except (AttributeError, ProcessLookupError, PermissionError):  # Windows, or gone
                    child.kill()
                child.wait()
        if not report.is_file():
            lines = log.read_text(errors="replace").strip().splitlines()
            return "error", lines[-1] if lines else f"pytest ended with code {child.returncode}"
        return verdict(number, report, copy, scratch)


def verdict(number, report, copy, cwd):
    """(status, detail) from the JUnit report of pytest run in cwd: "passed"; "not started" (a
    test reached the exercise's own stub); "needs M" (a test reached exercise M's stub first);
    "failed" (detail: the first failing test, its error and where); "error" (no test ran)."""
    cases = list(ET.parse(report).iter("testcase"))
    bad = [(c.get("name"), e) for c in cases for e in c if e.tag in ("failure", "error")]
    reached = {int(n) for _, e in bad
               for n in re.findall(r"NotImplementedError: exercise (\d+):", e.get("message", ""))}
    if not cases:
        return "error", f"no test is marked exercise{number}"
    if number in reached:
        return "not started", ""
    if reached:
        return f"needs {min(reached)}", ""
    if not bad:
        return "passed", ""
    name, e = bad[0]
    said = re.findall(r"^E +([\w.]+: .*)$", e.text or "", re.M)
    detail = f"{name}: {said[0] if said else e.get('message', e.tag).splitlines()[0]}"
    places = re.findall(r'^(\S+\.py):(\d+): |File "(.+\.py)", line (\d+)', e.text or "", re.M)
    places = [(Path(cwd, a or c).resolve(), b or d) for a, b, c, d in places]
    mine = [(p.relative_to(copy), n) for p, n in places if Path(copy) in p.parents]
    if mine or places:
        path, line = (mine or places)[-1]
        detail += f" (at {path.as_posix() if mine else path.name}:{line})"
    return ("error" if e.tag == "error" else "failed"), detail


def grade(copy=None, numbers=None, tests=None, timeout=TIMEOUT, jobs=None):
    """Grade exercises `numbers` (None: all in the tests' pyproject.toml) of the copy (default: the
    one holding the working directory) against `tests` (default: the copy's), `jobs` at once. Rows
    {number, title, status, detail, seconds}; what the copy holds never raises (it is a row)."""
    here = Path.cwd().resolve()
    found = [p for p in [here, *here.parents] if (p / "minialign" / "__init__.py").is_file()]
    if copy is None and not found:
        raise ValueError(f"{here}: no minialign copy here or above (minialign/__init__.py)")
    copy = Path(copy or found[0]).resolve()
    tests = Path(tests).resolve() if tests is not None else copy / TESTS
    if not tests.is_file():
        raise FileNotFoundError(f"{tests}: no exercise tests there")
    named = titles(tests)
    numbers = sorted(set(numbers or named))
    if set(numbers) - set(named):
        raise ValueError(f"grade: no exercise {sorted(set(numbers) - set(named))} in {tests}")

    def one(n):
        t0 = time.perf_counter()
        try:
            status, detail = run_tests(copy, tests, n, timeout)
        except Exception as e:        # noqa: BLE001 (whatever happens is this exercise's row)
            status, detail = "error", f"{type(e).__name__}: {e}"
        return {"number": n, "title": named[n], "status": status, "detail": detail,
                "seconds": time.perf_counter() - t0}
    with ThreadPoolExecutor(jobs or min(4, os.cpu_count() or 1)) as pool:
        return list(pool.map(one, numbers))


def table(rows, copy=None, student=None):
    """The rows as lines: a header, one line per exercise (its detail at the end), a tally."""
    width = max([len("exercise")] + [len(r["title"]) for r in rows])
    lines = [f"grading {copy}" + (f" (student {student})" if student else "")] if copy else []
    lines.append(f" #  {'exercise':<{width}}  {'status':<11}  seconds")
    for r in rows:
        lines.append(f"{r['number']:>2}  {r['title']:<{width}}  {r['status']:<11}  "
                     f"{r['seconds']:7.1f}  {r['detail']}".rstrip())
    counts = ", ".join(f"{n} {s}" for s, n in Counter(r["status"] for r in rows).items())
    lines.append(f"{len(rows)} exercise(s): {counts} (one alone: pytest -m exerciseN)")
    return "\n".join(lines)


def grade_class(folder, out=None, numbers=None, tests=None, timeout=TIMEOUT, jobs=None):
    """Grade every copy in folder's subfolders (one with minialign/ per student) against `tests`
    (default: this repository's), a line per student, into a CSV (default: folder/grades.csv)
    rewritten after each copy, a row per (student, exercise). Returns the rows."""
    folder = Path(folder)
    out = Path(out) if out else folder / "grades.csv"
    copies = sorted(p.parent for p in folder.glob("*/minialign") if p.is_dir())
    if not copies:
        raise ValueError(f"{folder}: no copy in its subfolders (one with minialign/ per student)")
    tests = Path(tests) if tests else ROOT / TESTS
    rows = []
    for copy in copies:
        sid = copy / STUDENT_FILE                      # its first line, else the folder's name
        sid = sid.read_text(errors="replace").strip().splitlines() if sid.is_file() else []
        student = sid[0].strip() if sid else copy.name
        mine = [{**r, "student": student, "copy": str(copy),
                 "points": POINTS.get(r["number"], 0) if r["status"] == "passed" else 0}
                for r in grade(copy, numbers, tests, timeout, jobs)]
        rows += mine
        partial = out.with_name(out.name + ".partial")
        with open(partial, "w", encoding="utf-8", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(
                [["student", "copy", "exercise", "title", "status", "points", "detail"]] +
                [[r["student"], r["copy"], r["number"], r["title"], r["status"],
                  f"{r['points']:g}", r["detail"]] for r in rows])
        os.replace(partial, out)
        passed = [str(r["number"]) for r in mine if r["status"] == "passed"]
        full = sum(POINTS.get(r["number"], 0) for r in mine)
        print(f"{student}: {sum(r['points'] for r in mine):g} / {full:g} points, "
              f"{len(passed)} of {len(mine)} passed ({' '.join(passed)}) in {copy}", flush=True)
    print(f"wrote {out}: {len(copies)} copies against {tests}")
    return rows
