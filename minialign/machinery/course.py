"""The course kit (docs/course.md): exercises marked in the working code (START, END), a student
copy with them blanked and without LEFT_OUT (the fast path computes their maths), the student's
check (the copy's own tests), and the class grader: each copy's functions called in a child that
reaches nothing else (course_child.py), their answers judged here."""
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
TIMEOUT = 60.0       # seconds one exercise of one copy may take in its child
CASES = "tests/exercise_cases.py"           # what the class grader asks of each exercise
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
    indent: str

    @property
    def stub(self):
        return (f'{self.indent}raise NotImplementedError("exercise {self.number}: {self.title} '
                f'— see docs/course.md#exercise-{self.number}")\n')


def parse(text, path):
    """The exercises marked in one module's text, in file order. Raises ValueError naming path:line
    for an unclosed or unopened pair, nested or empty pairs, or a pair at two indentations."""
    found, opened = [], None
    for i, line in enumerate(text.splitlines()):
        start, end = START.match(line), END.match(line)
        if start and opened:
            raise ValueError(f"{path}:{i + 1}: exercise {start[2]} opens inside "
                             f"exercise {opened.number}")
        if start:
            opened = Exercise(int(start[2]), start[3], path, i, None, start[1])
        elif end:
            if not opened or (end[1], int(end[2])) != (opened.indent, opened.number):
                raise ValueError(f"{path}:{i + 1}: 'end of exercise {end[2]}' closes no opening "
                                 f"comment of that number and indentation")
            if i == opened.start + 1:
                raise ValueError(f"{path}:{i + 1}: exercise {end[2]} marks no code")
            found.append(opened._replace(end=i))
            opened = None
    if opened:
        raise ValueError(f"{path}:{opened.start + 1}: exercise {opened.number} is never closed")
    return found


def list_exercises(root=ROOT, numbers=(), flag=None):
    """Every exercise marked in root/minialign/*.py, by number. Raises ValueError unless they are
    numbered 1..N, each once, and with `flag` (an option that needs the solutions, named in the
    message) if root is a student copy or `numbers` holds one that is not there."""
    if flag and not (Path(root) / FAST).is_file():
        raise ValueError(f"{root} is a student copy: it holds no solutions ({flag}); run this "
                         f"from the repository (the teacher's checkout)")
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


def splice(text, path, bodies):
    """text with the body of each exercise N in `bodies` replaced by bodies[N] (a list of lines).
    Raises ValueError naming path if text does not mark one of them."""
    lines, marked = text.splitlines(keepends=True), parse(text, path)
    if missing := sorted(set(bodies) - {e.number for e in marked}):
        raise ValueError(f"{path}: marks no exercise {', '.join(map(str, missing))}")
    for e in reversed(marked):
        lines[e.start + 1:e.end] = bodies.get(e.number, lines[e.start + 1:e.end])
    return "".join(lines)


def repository_files(root=ROOT):
    """The repository's files, relative posix paths, sorted: tracked or not ignored by git
    (`git ls-files`), or outside a checkout every file but caches, runs and results."""
    root = Path(root)
    try:
        if (root / ".git").exists():                      # a checkout (or worktree) of its own
            listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached",
                                     "--others", "--exclude-standard"], capture_output=True,
                                    check=True).stdout.decode().split("\0")
            return sorted({p for p in listed if p and (root / p).is_file()})
    except (OSError, subprocess.CalledProcessError):      # no git
        pass
    skip = {"__pycache__", "runs", "results", "build"}
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
                  and not any(part.startswith(".") or part in skip or part.endswith(".egg-info")
                              for part in p.relative_to(root).parts) and p.suffix != ".pyc")


def write_copy(out, solved=(), root=ROOT):
    """Write root's student copy into `out` (new or empty, outside root): all but `solved`
    blanked. Refuses before writing; returns (exercises, file count)."""
    out, root = Path(out), Path(root)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: not a new or empty directory")
    if root.resolve() in [out.resolve(), *out.resolve().parents]:
        raise ValueError(f"{out}: inside the repository {root.resolve()}; the copy goes outside it")
    exercises = list_exercises(root, solved, "--solved" if solved else None)
    files = [rel for rel in repository_files(root) if not rel.startswith(LEFT_OUT)]
    for rel in files:
        src, dst = root / rel, out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        stubs = {e.number: [e.stub] for e in exercises if e.path == rel and e.number not in solved}
        if stubs:
            dst.write_bytes(splice(src.read_bytes().decode(), rel, stubs).encode())
    return exercises, len(files)


def restore(copy, numbers=None, root=ROOT):
    """Put root's bodies of exercises `numbers` (None: all) back into the student copy at `copy`,
    the rest untouched; ValueError before writing anything. Returns the paths rewritten."""
    copy, root = Path(copy), Path(root)
    if not (copy / "minialign" / "__init__.py").is_file():
        raise ValueError(f"{copy}: no student copy there (no minialign/__init__.py)")
    chosen = [e for e in list_exercises(root, numbers or (), "--restore")
              if numbers is None or e.number in numbers]
    texts = {}
    for rel in sorted({e.path for e in chosen}):         # every file spliced before any write
        solution = (root / rel).read_bytes().decode().splitlines(keepends=True)
        texts[rel] = splice((copy / rel).read_bytes().decode(), f"{copy / rel}", {
            e.number: solution[e.start + 1:e.end] for e in chosen if e.path == rel})
    for rel, text in texts.items():
        (copy / rel).write_bytes(text.encode())
    return list(texts)


class Judge(NamedTuple):
    """One exercise of a class run: the child's job (module, function, cases: the calls), the
    repository's answers to them (course_child.call) and a check replacing value by value."""
    number: int
    job: dict
    expected: dict
    check: object


def judge_of(number, rng, cases):
    """Exercise `number`'s Judge, its calls drawn from rng by cases.CASES[number]."""
    module, name, calls = cases.CASES[number](rng)
    function = getattr(importlib.import_module(f"minialign.{module}"), name)
    expected = {}
    for i, args in enumerate(copy.deepcopy(calls)):
        expected.update(course_child.call(function, args, i))
    job = {"module": f"minialign.{module}", "function": name, "cases": calls}
    return Judge(number, job, expected, cases.CHECKS.get(number))


def run_child(folder, judge, timeout):
    """The copy's function on the judge's calls in a child (course_child.py) of its own session,
    which can reach nothing but the copy, killed with all it started after `timeout` s.
    Returns its flattened outputs, or {"error": what happened instead}."""
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        job = {**judge.job, "copy": folder, "cpu_seconds": int(timeout) + 1, "readable": READABLE}
        (scratch / "job.pkl").write_bytes(pickle.dumps(job))
        with open(scratch / "output.txt", "wb") as output:
            child = subprocess.Popen(
                [sys.executable, "-I", "-S", course_child.__file__, str(scratch), NUMPY],
                cwd=scratch, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
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
            with np.load(scratch / "out.npz", allow_pickle=False) as f:
                if sum(i.file_size for i in f.zip.infolist()) > course_child.FILE_SIZE:
                    return {"error": "returned more than 64 MB"}      # never more than it may write
                return {k: f[k] for k in f.files}
        except Exception:         # noqa: BLE001 (no out.npz, or not one np.savez would write)
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
    for i, args in enumerate(judge.job["cases"]):
        want = {k: v for k, v in judge.expected.items() if k.startswith(f"{i}/")}
        tol = 1e-4 if any(v.dtype == np.float32 for v in want.values()) else 1e-8
        for key in dict.fromkeys([*want, *sorted(k for k in got if k.startswith(f"{i}/"))]):
            _, part, *index = key.split("/")
            what = f"case {i}, {'returned' if part == 'out' else 'argument'} " + \
                "".join(f"[{p}]" for p in index)
            if key not in got or key not in want:
                return "failed", f"{what}: {'missing' if key in want else 'not expected'}"
            check = judge.check if key == f"{i}/out" else None
            why = differs(got[key], want[key], np.inf if check else tol) or \
                (check and check(got[key], want[key], args))
            if why:
                return "failed", f"{what}{' after the call' if part == 'args' else ''}: {why}"
    return "passed", ""


def grade_class(folder, out=None, numbers=None, timeout=TIMEOUT, jobs=None, seed=None):
    """Grade exercises `numbers` (None: all) of every copy in folder's subfolders (the student:
    the subfolder's name) against this repository's solutions, on inputs drawn from `seed`
    (None: a new one), a line per student; the CSV `out` (default: folder/grades.csv), rewritten
    after each copy, holds a row per (student, exercise). A rerun grades every copy again."""
    folder = Path(folder)
    out = Path(out) if out else folder / "grades.csv"
    copies = sorted(str(p.parent.resolve()) for p in folder.glob("*/minialign") if p.is_dir())
    if not copies:
        raise ValueError(f"{folder}: no copy in its subfolders (one with minialign/ per student)")
    titles = {e.number: e.title for e in list_exercises(ROOT, numbers or (), "grade")}
    numbers = sorted(set(numbers or titles))
    spec = importlib.util.spec_from_file_location("exercise_cases", ROOT / CASES)
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    rows = []
    seed = np.random.SeedSequence(seed).entropy
    rng = np.random.default_rng(seed)
    judges = [judge_of(n, rng, cases) for n in numbers]
    print(f"grading {len(copies)} copies in {folder}; inputs: --seed {seed}; children "
          + ("confined by Landlock" if course_child.landlock_abi() else
             "NOT confined: no Landlock here (docs/course.md)"), flush=True)
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        for copy_ in copies:
            student = Path(copy_).name
            verdicts = pool.map(lambda j: verdict_of(j, run_child(copy_, j, timeout)), judges)
            mine = [{"student": student, "copy": copy_, "exercise": j.number,
                     "title": titles[j.number], "status": status,
                     "points": POINTS[j.number] * (status == "passed"), "detail": detail,
                     "seed": seed}
                    for j, (status, detail) in zip(judges, verdicts)]
            rows += mine
            write_rows(out, rows)
            passed = [str(r["exercise"]) for r in mine if r["status"] == "passed"]
            print(f"{student}: {sum(r['points'] for r in mine)} / "
                  f"{sum(POINTS[n] for n in numbers)} points, {len(passed)} of {len(mine)} "
                  f"passed ({' '.join(passed)}) in {copy_}", flush=True)
    write_rows(out, rows)             # last, after every child is gone
    print(f"wrote {out}")
    return rows


COLUMNS = ["student", "copy", "exercise", "title", "status", "points", "detail", "seed"]


def write_rows(out, rows):
    partial = out.with_name(out.name + ".partial")
    with open(partial, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(partial, out)
