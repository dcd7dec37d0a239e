"""The course kit (docs/course.md): exercises marked in the working code (a body between
`# --- exercise N: title ---` and `# --- end of exercise N ---` in a module of minialign/), a
student copy with them blanked (Exercise.stub) and without LEFT_OUT (the fast path computes their
maths), the student's check (the copy's own tests), and the class grader: each copy's functions
called in a child that reaches nothing else (course_child.py), their answers judged here."""
import copy
import csv
import importlib.util
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import course_child

ROOT = Path(__file__).resolve().parents[2]     # the repository (or student copy) of this code
START = re.compile(r"^( *)# --- exercise (\d+): (.+) ---$")
END = re.compile(r"^( *)# --- end of exercise (\d+) ---$")
FAST = "minialign/machinery/fast.py"
LEFT_OUT = ("docs/teacher/", FAST, "tests/test_fast.py")    # prefixes kept out of a copy
STUDENT_FILE = "student.txt"                                 # a copy's student id, first line
TESTS = "tests/test_exercises.py"
TIMEOUT = 60.0       # seconds one exercise's tests may run (each takes about one here)
CASES = "tests/exercise_cases.py"           # what the class grader asks of each exercise
CHILD = Path(course_child.__file__)          # runs a student's function, reaching nothing else
NUMPY = str(Path(np.__file__).parents[1])    # the folder numpy is imported from
READABLE = sorted({str(Path(np.__file__).parent), *map(str, Path(NUMPY).glob("numpy.libs")),
                   sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})
POINTS = {1: 2, 2: 2, 3: 2, 4: 3, 5: 4, 6: 2, 7: 3, 8: 2, 9: 3, 10: 2, 11: 2, 12: 2, 13: 3, 14: 3}


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


def check(copy=None, numbers=(), timeout=None):
    """The student's own check: pytest on the copy's tests/test_exercises.py (those marked
    exerciseN for N in numbers, else all), in a child; tests/conftest.py prints a row per
    exercise. copy: default, the copy holding the working directory. Returns pytest's code."""
    here = Path.cwd().resolve()
    found = [p for p in [here, *here.parents] if (p / "minialign" / "__init__.py").is_file()]
    if copy is None and not found:
        raise ValueError(f"{here}: no minialign copy here or above (minialign/__init__.py)")
    copy = Path(copy or found[0]).resolve()
    marks = " or ".join(f"exercise{n}" for n in numbers) or "not nothing"
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "--tb=no", "-rN", "-p",
                               "no:cacheprovider", "-m", marks, TESTS], cwd=copy, env=env,
                              timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"stopped after {timeout:g} s (a loop that never ends?)")
        return 1


class Judge(NamedTuple):
    """One exercise of a class run: the calls made (pickled for the child, and as given), what
    the repository's function returns for them, and a check replacing value by value."""
    number: int
    job: bytes
    calls: list
    expected: dict
    check: object


def judge_of(number, rng, cases):
    """Exercise `number`'s calls, drawn from rng by cases.CASES[number], and the repository's
    answers: its outputs and its inputs after each call, flattened (course_child.flatten)."""
    module, name, calls = cases.CASES[number](rng)
    job = pickle.dumps({"module": f"minialign.{module}", "function": name, "cases": calls})
    function = getattr(importlib.import_module(f"minialign.{module}"), name)
    expected = {}
    for i, args in enumerate(copy.deepcopy(calls)):
        expected.update(course_child.call(function, args, i))
    return Judge(number, job, calls, expected, cases.CHECKS.get(number))


def run_child(folder, job, timeout):
    """The copy's function on the job's inputs in a child (course_child.py) of its own session,
    which can reach nothing but the copy, killed with all it started after `timeout` s.
    Returns its flattened outputs, or {"error": what happened instead}."""
    job = pickle.loads(job)
    module = folder / (job["module"].replace(".", "/") + ".py")
    if not module.is_file():
        return {"error": f"{module.relative_to(folder).as_posix()} is missing"}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        (scratch / "job.pkl").write_bytes(pickle.dumps(
            {**job, "copy": str(folder), "cpu_seconds": int(timeout) + 1, "readable": READABLE}))
        with open(scratch / "output.txt", "wb") as output:
            child = subprocess.Popen([sys.executable, "-I", "-S", str(CHILD), str(scratch),
                                      NUMPY], cwd=scratch, stdin=subprocess.DEVNULL,
                                     stdout=output, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                return {"error": f"timed out after {timeout:g} s"}
            finally:                  # the child and every process it started, then reap it
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except (AttributeError, ProcessLookupError, PermissionError):  # Windows, or gone
                    child.kill()
                child.wait()
        try:
            with zipfile.ZipFile(scratch / "out.npz") as f:        # never more than it may write
                if sum(i.file_size for i in f.infolist()) > course_child.FILE_SIZE:
                    return {"error": "returned more than 64 MB"}
            with np.load(scratch / "out.npz", allow_pickle=False) as f:
                return {k: f[k] for k in f.files}
        except (OSError, ValueError, zipfile.BadZipFile):
            code = child.returncode
            why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            said = (scratch / "output.txt").read_bytes()[-2000:].decode(errors="replace").split()
            return {"error": f"ended with no result ({why})" + (f": ...{' '.join(said[-12:])}"
                                                                if said else "")}


def differs(have, want, tol):
    """Why array `have` is not `want`: shape; dtype (0-d values may differ in type); value,
    exact for integers and booleans, else to `tol` of the largest |want|; or None."""
    if have.shape != want.shape:
        return f"shape {have.shape}, expected {want.shape}"
    if want.ndim and have.dtype != want.dtype:
        return f"dtype {have.dtype}, expected {want.dtype}"
    if want.dtype.kind not in "fc" or have.dtype.kind not in "fiub":
        return None if np.array_equal(have, want) else f"{have}, expected {want}"[:200]
    have, want = have.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(have), finite) or np.any(have[~finite] != want[~finite]):
        return "not finite where expected finite, or the other way round"
    scale = np.abs(want[finite]).max(initial=0) or 1.0                # all zeros: absolute
    err = np.abs(have - want)[finite].max(initial=0) / scale
    return f"off by {err:.1e} of its largest value" if err > tol else None


def verdict_of(judge, got):
    """(status, detail) for the child's outputs `got`: "passed"; "not started" / "needs M" (it
    reached exercise M's stub); "error" (it raised: where, if in the copy); "failed" (the first
    output or input after the call that differs from the repository's, and how)."""
    if "error" in got:
        stub = re.match(r"NotImplementedError: exercise (\d+):", str(got["error"]))
        if stub:
            return ("not started" if int(stub[1]) == judge.number else f"needs {stub[1]}"), ""
        return "error", str(got["error"])
    for i, args in enumerate(judge.calls):
        keys = [k for k in judge.expected if k.split("/")[0] == str(i)]
        tol = 1e-4 if any(judge.expected[k].dtype == np.float32 for k in keys) else 1e-8
        extra = sorted(k for k in got if k.split("/")[0] == str(i) and k not in judge.expected)
        for key in keys + extra:
            what = f"case {i}, {'returned' if key.split('/')[1] == 'out' else 'argument'} " + \
                "".join(f"[{p}]" for p in key.split("/")[2:])
            if key not in got or key not in judge.expected:
                return "failed", f"{what}: {'missing' if key in judge.expected else 'not expected'}"
            if judge.check and key == f"{i}/out":
                why = differs(got[key], judge.expected[key], np.inf) or \
                    judge.check(got[key], judge.expected[key], args)
            else:
                why = differs(got[key], judge.expected[key], tol)
            if why:
                return "failed", f"{what}{' after the call' if '/args' in key else ''}: {why}"
    return "passed", ""


def student_of(folder):
    """The first line of the copy's student.txt (any bytes), else the folder's name."""
    path = folder / STUDENT_FILE
    lines = path.read_bytes().decode("utf-8", "replace").split() if path.is_file() else []
    return lines[0] if lines else folder.name


def grade_class(folder, out=None, numbers=None, timeout=TIMEOUT, jobs=None, regrade=False,
                seed=None):
    """Grade exercises `numbers` (None: all) of every copy in folder's subfolders (each with
    a minialign/) against this repository's solutions, on inputs drawn from `seed` (None: a
    new one). A line per student as it is graded; the CSV (default: folder/grades.csv),
    rewritten after each copy, keeps a row per (student, exercise); a rerun keeps the rows
    of copies it holds in full unless `regrade`. Returns the rows."""
    folder = Path(folder)
    out = Path(out) if out else folder / "grades.csv"
    check_teacher(ROOT, "grade against")
    copies = sorted(p.parent.resolve() for p in folder.glob("*/minialign") if p.is_dir())
    if not copies:
        raise ValueError(f"{folder}: no copy in its subfolders (one with minialign/ per student)")
    numbers = sorted(set(numbers or [e.number for e in list_exercises(ROOT)]))
    list_exercises(ROOT, numbers, "grade")
    spec = importlib.util.spec_from_file_location("exercise_cases", ROOT / CASES)
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    named = {e.number: e.title for e in list_exercises(ROOT)}
    rows = [] if regrade or not out.is_file() else read_rows(out)
    done = {c for c in {r["copy"] for r in rows}
            if {int(r["exercise"]) for r in rows if r["copy"] == c} >= set(numbers)}
    rows = [r for r in rows if r["copy"] in done and r["copy"] in map(str, copies)]
    seed = np.random.SeedSequence(seed).entropy
    rng = np.random.default_rng(seed)
    judges = [judge_of(n, rng, cases) for n in numbers]
    kept = len(done & set(map(str, copies)))
    print(f"grading {len(copies) - kept} of {len(copies)} copies in {folder}" + (
          f" ({kept} graded in {out.name}: --regrade grades them again)" * bool(kept)) +
          f"; inputs: --seed {seed}; children " + ("confined by Landlock" if
          course_child.landlock_abi() else "NOT confined: no Landlock here (docs/course.md)"),
          flush=True)
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        for copy_ in (c for c in copies if str(c) not in done):
            student = student_of(copy_)
            mine = [{"student": student, "copy": str(copy_), "exercise": j.number,
                     "title": named[j.number], **dict(zip(("status", "detail"), verdict))}
                    for j, verdict in zip(judges, pool.map(
                        lambda j: verdict_of(j, run_child(copy_, j.job, timeout)), judges))]
            for r in mine:
                r["points"] = POINTS[r["exercise"]] if r["status"] == "passed" else 0
            rows += mine
            write_rows(out, rows)
            passed = [str(r["exercise"]) for r in mine if r["status"] == "passed"]
            print(f"{student}: {sum(r['points'] for r in mine):g} / "
                  f"{sum(POINTS[n] for n in numbers):g} points, {len(passed)} of {len(mine)} "
                  f"passed ({' '.join(passed)}) in {copy_}", flush=True)
    write_rows(out, rows)             # last, after every child is gone
    print(f"wrote {out}")
    return rows


COLUMNS = ["student", "copy", "exercise", "title", "status", "points", "detail"]


def write_rows(out, rows):
    partial = out.with_name(out.name + ".partial")
    with open(partial, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(partial, out)


def read_rows(out):
    with open(out, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(rows[0]) != set(COLUMNS):
        raise ValueError(f"{out}: not a grades CSV of this grader; pass --regrade or --out")
    return rows
