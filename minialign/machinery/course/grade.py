"""`python -m minialign grade [N ...]`: each exercise's own tests, one row per exercise,
whatever the student's files hold.

Exercise N's tests are the tests of tests/test_exercises.py marked `exercise<N>` (pytest -m
exerciseN runs them alone); pyproject.toml registers each marker with its title and the
earlier exercises its tests call, e.g. "exercise5: attention backward (needs 1)".

The tests run in processes of their own (child.py), started in the copy graded (copy.py: the
copy holding the working directory, or --copy) and importing that copy's minialign only, each
exercise with a time limit (--timeout): a file that does not import, a loop that never ends or
a crash stays in its own rows (after a hang or a crash a new process runs the rest), and the
other exercises are graded. A row reads

    N  title  status  largest relative error  seconds  needs

status: "passed" (every test passed), "not started" (a test reached exercise N's stub,
exercises.py), "needs M" (a test reached the stub of an earlier exercise M: do M first),
"failed" (some test failed; the lines under the table say which and why, naming the student's
file and line), "error" (N's file does not import: the line under the table says where),
"timed out" (N's tests ran past the limit). Largest relative error: of a passed exercise, the
largest `rel_err` its tests recorded; of a failed one, the error of the check that failed;
"-" otherwise.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .child import MARKER  # noqa: F401  (pyproject's marker lines, for the kit's tests)
from .copy import find_copy, is_copy, mismatch, student_id
from .exercises import find_exercises

TESTS = "tests/test_exercises.py"
CHILD = Path(__file__).with_name("child.py")
TIMEOUT = 60.0        # seconds one exercise's tests may take (--timeout); all take ~1 s here
STARTUP = 120.0       # seconds more a child may take to import the copy and pytest
REACHED_STUB = "NotImplementedError: exercise "   # how a stub's failure message begins


class NotAllPassed(Exception):
    """grade's outcome when some exercise did not pass (exit code 1; the table says which)."""


def resolve_copy(copy=None):
    """The copy to grade: `copy` (--copy) or the one holding the working directory. Raises
    ValueError (one line) when there is none."""
    if copy is not None:
        if not is_copy(copy):
            raise ValueError(f"--copy {copy}: no minialign copy there (pyproject.toml and "
                             f"minialign/__init__.py)")
        return Path(copy).resolve()
    found = find_copy()
    if found is None:
        raise ValueError(f"{Path.cwd()} is in no minialign copy: run grade inside one, or pass "
                         f"--copy DIR")
    return found


def tests_file(copy, tests=None):
    """(the exercise tests file, the pyproject.toml with their markers): the copy's, or those
    of a teacher's tests folder (--tests DIR; its parent's pyproject.toml when it has one)."""
    folder = Path(tests).resolve() if tests else copy / "tests"
    path = folder / Path(TESTS).name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no exercise tests there" + (
            "" if tests else "; grade runs in the repository or a student copy"))
    config = folder.parent / "pyproject.toml"
    return path, config if config.is_file() else copy / "pyproject.toml"


def run_child(copy, tests, config, exercises, timeout):
    """The tests of `exercises` in one child.py process. Returns (its record or None when it
    wrote none, its hang dump, its output's last line)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, log = Path(tmp) / "record.json", Path(tmp) / "output.txt"
        argv = [sys.executable, str(CHILD), str(copy), str(tests), str(config), str(out),
                str(timeout), *(f"{e.number}:{e.path}" for e in exercises)]
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1",   # no __pycache__ left in the copy
               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}     # the exercise tests need no plugin
        env.pop("PYTHONPATH", None)                  # the copy's minialign, nothing else
        with open(log, "w") as output:
            child = subprocess.Popen(argv, cwd=copy, env=env, stdin=subprocess.DEVNULL,
                                     stdout=output, stderr=subprocess.STDOUT)
            try:
                child.wait(timeout * len(exercises) + STARTUP)
            except subprocess.TimeoutExpired:        # hung outside any test: importing
                child.kill()
                child.wait()
        hang = Path(f"{out}.hang")
        last = (log.read_text(errors="replace").strip().splitlines()
                or [f"exit code {child.returncode}"])[-1]
        return (json.loads(out.read_text()) if out.is_file() else None,
                hang.read_text(errors="replace") if hang.is_file() else "", last)


def run_exercises(copy, tests, config, exercises, timeout):
    """{number: {"tests", "needs", and "import_error" or "timed_out" when so}} for exercises,
    and the package the copy's processes imported. One process runs them all; when an
    exercise's tests hang (or end the process), it gets its row and a new process runs the
    others again."""
    results, package, todo = {}, None, list(exercises)
    while todo:
        record, dump, last = run_child(copy, tests, config, todo, timeout)
        if record is None:                           # it died before its first test
            for e in todo:
                results[e.number] = {"import_error": f"the grader's process stopped: {last}"}
            break
        package = record["package"]
        stuck = None if record["done"] else record["running"]
        for e in todo:
            if e.number == stuck:
                results[e.number] = ({"timed_out": hung_at(dump, copy)} if dump.strip() else
                                     {"import_error": f"the process running its tests "
                                                      f"stopped: {last}"})
            elif record["done"] or stuck is None:
                results[e.number] = {"import_error": record["import_errors"][str(e.number)]} \
                    if str(e.number) in record["import_errors"] else {"tests": {
                        k: t for k, t in record["tests"].items() if t["exercise"] == e.number}}
            if e.number in results:
                if not results[e.number].get("tests") and record.get("collection_error"):
                    results[e.number] = {"import_error": f"{Path(tests).name} does not "
                                                         f"collect: {record['collection_error']}"}
                results[e.number].setdefault("tests", {})
                results[e.number]["needs"] = record["needs"].get(str(e.number), [])
        if stuck is None and not record["done"]:     # it stopped between two tests
            for e in todo:
                results.setdefault(e.number, {"import_error": f"the grader's process "
                                                              f"stopped: {last}", "tests": {}})
        todo = [e for e in todo if e.number not in results]
    return results, package


def hung_at(dump, copy):
    """Where faulthandler's stack dump (child.py) says the tests were: the innermost line of
    the copy's minialign/ ('in minialign/optim.py:38, adamw_step'), or ''."""
    for path, line, name in re.findall(r'File "(.+)", line (\d+) in (\S+)', dump):
        path = Path(path).resolve()          # faulthandler lists the innermost frame first
        if copy / "minialign" in path.parents:
            return f"in {path.relative_to(copy).as_posix()}:{line}, {name}"
    return ""


def status(number, record):
    """(status, detail line or None) of an exercise from its child's record."""
    if "timed_out" in record:
        return "timed out", None
    if record.get("import_error"):
        return "error", f"error: {record['import_error']}"
    tests = record["tests"].values()
    if not tests:
        return "no tests", None
    reached = [int(t["message"][len(REACHED_STUB):].split(":")[0]) for t in tests
               if t["message"].startswith(REACHED_STUB)]
    if number in reached:
        return "not started", None
    if reached:
        return f"needs {min(reached)}", None
    return ("failed" if any(t["outcome"] == "failed" for t in tests) else "passed"), None


def row(exercise, record):
    """One row of the table (and of --json) from an exercise's child record."""
    state, detail = status(exercise.number, record)
    tests = [dict(t, test=name) for name, t in record["tests"].items()]
    if state == "passed":
        errs = [t["rel_err"] for t in tests if t["rel_err"] is not None]
    elif state == "failed":        # the check that failed, when it was a relative error
        errs = [t["failed_err"] for t in tests if t["outcome"] == "failed"
                and t["failed_err"] is not None and "relative error" in t["message"]]
    else:
        errs = []
    return {"number": exercise.number, "title": exercise.title, "path": exercise.path,
            "status": state, "detail": detail, "hung": record.get("timed_out"),
            "rel_err": max(errs) if errs else None,
            "seconds": sum(t["seconds"] for t in tests) if tests else None,    # none ran to the end
            "needs": record.get("needs", []),
            "tests": tests}


def grade(numbers=None, copy=None, tests=None, timeout=TIMEOUT, jobs=None):
    """Grade exercises `numbers` (None: all) of the copy (resolve_copy) against its tests or
    those of --tests, in `jobs` processes at once (default: the cores, at most 4), each
    exercise with `timeout` seconds (run_exercises). Returns (copy, rows): one row per exercise (row). Raises ValueError naming the two
    trees when the copy's processes import another minialign than the copy's."""
    copy = resolve_copy(copy)
    known = {e.number: e for e in find_exercises(copy)}
    numbers = sorted(set(numbers or known))
    unknown = [n for n in numbers if n not in known]
    if unknown:
        raise ValueError(f"no exercise {', '.join(map(str, unknown))} (there are 1..{len(known)})")
    path, config = tests_file(copy, tests)
    try:
        import pytest  # noqa: F401  (the [test] extra: the children run it)
    except ImportError:
        raise ImportError("grading runs pytest: pip install -e '.[test]'") from None

    jobs = jobs or min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                       else os.cpu_count() or 1)
    chunks = [[known[n] for n in numbers[i::jobs]] for i in range(min(jobs, len(numbers)))]
    with ThreadPoolExecutor(len(chunks)) as pool:
        done = list(pool.map(lambda c: run_exercises(copy, path, config, c, timeout), chunks))
    results = {n: r for found, _ in done for n, r in found.items()}
    for _, package in done:
        if package and mismatch(copy, Path(package) / "__init__.py"):
            raise ValueError(mismatch(copy, Path(package) / "__init__.py"))
    return copy, [row(known[n], results[n]) for n in numbers]


def format_table(rows, seconds, copy, timeout=TIMEOUT, student=None, tests=None):
    """The header (which copy, whose tests), one row per exercise, one line per failed test or
    error, the tally and the time limit."""
    width = max(len("exercise"), *(len(r["title"]) for r in rows))
    lines = [f"grading {copy}" + (f" (student {student})" if student else "")
             + (f" against the tests in {tests}" if tests else ""),
             f" #  {'exercise':<{width}}  {'status':<11}  {'max rel err':>11}  {'seconds':>7}  "
             f"needs"]
    for r in rows:
        err = f"{r['rel_err']:.1e}" if r["rel_err"] is not None else "-"
        needs = ", ".join(map(str, r["needs"])) or "-"
        took = "-" if r["seconds"] is None else f"{r['seconds']:.2f}"
        lines.append(f"{r['number']:>2}  {r['title']:<{width}}  {r['status']:<11}  {err:>11}  "
                     f"{took:>7}  {needs}")
    graded = {r["number"]: r["status"] for r in rows}
    for r in rows:
        behind = [n for n in r["needs"] if graded.get(n, "passed") != "passed"]
        if r["status"] == "failed" and behind:
            lines.append(f"exercise {r['number']}: its tests also run exercise(s) "
                         f"{', '.join(map(str, behind))}, not passed yet: fix those first")
        if r["detail"]:
            lines.append(f"exercise {r['number']}: {r['detail']}")
        if r["status"] == "timed out":
            lines.append(f"exercise {r['number']}: timed out after {timeout:g} s "
                         f"{r['hung']}".rstrip() + " (a loop that never ends?)")
        for t in r["tests"]:
            if r["status"] == "failed" and t["outcome"] == "failed":
                lines.append(f"exercise {r['number']}, {t['test']}: {t['message']}")
    statuses = ["passed", "failed", "not started"] + sorted(
        {r["status"] for r in rows} - {"passed", "failed", "not started"})
    counts = ", ".join(f"{sum(r['status'] == s for r in rows)} {s}" for s in statuses)
    lines.append(f"{len(rows)} exercise(s): {counts}, in {seconds:.1f} s; each exercise's "
                 f"tests at most {timeout:g} s (--timeout) "
                 f"(one alone: python -m minialign grade N, or pytest -m exerciseN)")
    return "\n".join(lines)


def run_grade(numbers=None, as_json=False, copy=None, tests=None, timeout=TIMEOUT, student=None):
    """`python -m minialign grade`: the table (or, --json, the copy, student and rows).
    Raises NotAllPassed when some exercise did not pass."""
    t0 = time.perf_counter()
    copy, rows = grade(numbers, copy, tests, timeout)
    seconds = time.perf_counter() - t0
    student = student or student_id(copy)
    if as_json:
        print(json.dumps({"copy": str(copy), "student": student, "tests": tests and
                          str(Path(tests).resolve()), "timeout": timeout, "rows": rows,
                          "seconds": seconds}, indent=1))
    else:
        print(format_table(rows, seconds, copy, timeout, student, tests))
    if any(r["status"] != "passed" for r in rows):
        raise NotAllPassed
    return rows
