"""`python -m minialign grade [N ...]`: each exercise's own tests, one row per exercise.

Exercise N's tests are the tests of tests/test_exercises.py marked `exercise<N>` (pytest -m
exerciseN runs them alone); pyproject.toml registers each marker with its title and the
earlier exercises its tests call, e.g. "exercise5: attention backward (needs 1)". pytest runs
here, in this process, with Collector as a plugin (its own output hidden). A row reads

    N  title  status  largest relative error  seconds  needs

status: "passed" (every test passed), "not started" (a test reached exercise N's stub,
exercises.py), "needs M" (a test reached the stub of an earlier exercise M: do M first),
"failed" (some test failed); largest relative error: the largest `rel_err` a test recorded
(record_property), "-" if none did.
"""
import contextlib
import io
import json
import re
import time

from .exercises import ROOT, find_exercises

MARKER = re.compile(r"^exercise(\d+): (.+?)(?: \(needs ([\d, ]+)\))?$")   # pyproject's markers
REACHED_STUB = re.compile(r"NotImplementedError: exercise (\d+):")   # a stub's failure line
TESTS = "tests/test_exercises.py"


class NotAllPassed(Exception):
    """grade's outcome when some exercise did not pass (exit code 1; the table says which)."""


class Collector:
    """A pytest plugin that keeps, per test: its exercise, outcome, seconds, largest recorded
    rel_err and first failure line; and per exercise, the needs from the marker registry."""

    def __init__(self):
        self.tests, self.needs = {}, {}

    def pytest_configure(self, config):
        for line in config.getini("markers"):
            m = MARKER.match(line)
            if m:
                self.needs[int(m[1])] = [int(n) for n in re.findall(r"\d+", m[3] or "")]

    def pytest_collection_modifyitems(self, items):
        for item in items:
            numbers = [int(m.name[len("exercise"):]) for m in item.iter_markers()
                       if re.fullmatch(r"exercise\d+", m.name)]
            if len(numbers) == 1:
                self.tests[item.nodeid] = {"exercise": numbers[0], "outcome": "passed",
                                           "seconds": 0.0, "rel_err": None, "message": ""}

    def pytest_runtest_logreport(self, report):
        test = self.tests.get(report.nodeid)
        if test is None:
            return
        test["seconds"] += report.duration
        errs = [float(v) for k, v in report.user_properties if k == "rel_err"]
        if errs:
            test["rel_err"] = max(errs + [test["rel_err"] or 0.0])
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            test["outcome"] = "failed"
            test["message"] = (crash.message if crash else str(report.longrepr)).splitlines()[0]


def status(number, tests):
    """An exercise's status from its tests' records (see the module docstring)."""
    if not tests:
        return "no tests"
    reached = [int(m[1]) for t in tests if (m := REACHED_STUB.search(t["message"]))]
    if number in reached:
        return "not started"
    if reached:
        return f"needs {min(reached)}"
    return "failed" if any(t["outcome"] == "failed" for t in tests) else "passed"


def grade(numbers=None, root=ROOT):
    """Run the tests of exercises `numbers` (None: all) found in the code at root. Returns
    one row per exercise: {number, title, status, rel_err, seconds, needs, tests}."""
    try:
        import pytest     # the [test] extra: only grading needs it
    except ImportError:
        raise ImportError("grading runs pytest: pip install -e '.[test]'") from None
    exercises = find_exercises(root)
    known = {e.number: e for e in exercises}
    numbers = sorted(set(numbers or known))
    unknown = [n for n in numbers if n not in known]
    if unknown:
        raise ValueError(f"no exercise {', '.join(map(str, unknown))} (there are 1..{len(known)})")
    tests = root / TESTS
    if not tests.is_file():
        raise FileNotFoundError(f"{tests}: grading needs the tests beside the code; run it in "
                                f"the repository or a student copy (pip install -e)")
    collector = Collector()
    with contextlib.redirect_stdout(io.StringIO()) as output:     # the table says it all
        code = pytest.main([str(tests), "-q", "-p", "no:cacheprovider", "--rootdir", str(root),
                            "-c", str(root / "pyproject.toml"),
                            "-m", " or ".join(f"exercise{n}" for n in numbers)],
                           plugins=[collector])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        last = (output.getvalue().strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"pytest could not run {tests} (exit code {int(code)}): {last}")
    rows = []
    for n in numbers:
        mine = [dict(t, test=nodeid.split("::", 1)[-1]) for nodeid, t in collector.tests.items()
                if t["exercise"] == n]
        errs = [t["rel_err"] for t in mine if t["rel_err"] is not None]
        rows.append({"number": n, "title": known[n].title, "status": status(n, mine),
                     "rel_err": max(errs) if errs else None,
                     "seconds": sum(t["seconds"] for t in mine),
                     "needs": collector.needs.get(n, []), "tests": mine})
    return rows


def format_table(rows, seconds):
    """The rows as the table grade prints, then one line per failed test, then the tally."""
    width = max(len("exercise"), *(len(r["title"]) for r in rows))
    lines = [f" #  {'exercise':<{width}}  {'status':<11}  {'max rel err':>11}  {'seconds':>7}  "
             f"needs"]
    for r in rows:
        shown = r["rel_err"] is not None and r["status"] in ("passed", "failed")
        err = f"{r['rel_err']:.1e}" if shown else "-"
        needs = ", ".join(map(str, r["needs"])) or "-"
        lines.append(f"{r['number']:>2}  {r['title']:<{width}}  {r['status']:<11}  {err:>11}  "
                     f"{r['seconds']:>7.2f}  {needs}")
    for r in rows:
        for t in r["tests"]:
            if r["status"] == "failed" and t["outcome"] == "failed":
                lines.append(f"exercise {r['number']}, {t['test']}: {t['message']}")
    statuses = ["passed", "failed", "not started"] + sorted(
        {r["status"] for r in rows} - {"passed", "failed", "not started"})
    counts = ", ".join(f"{sum(r['status'] == s for r in rows)} {s}" for s in statuses)
    lines.append(f"{len(rows)} exercise(s): {counts}, in {seconds:.1f} s "
                 f"(one alone: python -m minialign grade N, or pytest -m exerciseN)")
    return "\n".join(lines)


def run_grade(numbers=None, as_json=False, root=ROOT):
    """`python -m minialign grade`: the table (or, --json, the rows). Raises NotAllPassed when
    some exercise did not pass."""
    t0 = time.perf_counter()
    rows = grade(numbers, root)
    seconds = time.perf_counter() - t0
    print(json.dumps({"rows": rows, "seconds": seconds}, indent=1) if as_json
          else format_table(rows, seconds))
    if any(r["status"] != "passed" for r in rows):
        raise NotAllPassed
    return rows
