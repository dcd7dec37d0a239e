"""Exercises' tests in a process of their own (grade.py starts it, and again for the rest after
an exercise that hung or ended the process), importing the copy's minialign and no other:

    python child.py COPY TESTS_FILE CONFIG OUT TIMEOUT N:MODULE ...

COPY: the copy graded (its minialign/ is imported, whatever else is installed); TESTS_FILE:
the exercise tests (the copy's, or a teacher's --tests); CONFIG: the pyproject.toml pytest
reads its markers from; OUT: where the JSON record goes (main says what it holds); TIMEOUT:
seconds one exercise's tests may run (faulthandler then writes every thread's stack to
OUT.hang and ends the process: the parent reads where it hung from it); N:MODULE: each
exercise and its file, "4:minialign/layers.py".

A module of the copy that does not import is replaced by a stand-in that raises its error when
used, so the tests of the other exercises still collect and run; N's own module not importing
is N's row ("error: SyntaxError at minialign/metrics.py:188: invalid syntax"). A failure's
message names the deepest line of the copy's code it passed through (the student's file and
line). Run as a script (its folder is not the package): only the standard library and pytest.
"""
import faulthandler
import importlib
import json
import re
import sys
import time
import traceback
import types
from pathlib import Path

MARKER = re.compile(r"^exercise(\d+): (.+?)(?: \(needs ([\d, ]+)\))?$")   # pyproject's markers
EXPLAINED = 6    # lines of an assertion's explanation kept after its first line
SHORT = 160      # characters of a long first line kept when an explanation follows


def where(frames, copy, tests=None):
    """'minialign/layers.py:88, in linear_backward' for the deepest frame in the copy's code,
    else 'tests/test_exercises.py:56, in test_x' for the deepest in the tests file `tests` (a
    helper's line says less than the test's own), else None."""
    found = {}
    for frame in frames:
        path = Path(frame.filename).resolve()
        if copy / "minialign" in path.parents:
            found["code"] = f"{path.relative_to(copy).as_posix()}:{frame.lineno}, in {frame.name}"
        elif path == tests:
            found["test"] = (f"{path.relative_to(tests.parent.parent).as_posix()}:"
                             f"{frame.lineno}, in {frame.name}")
    return found.get("code") or found.get("test")


def explanation(lines):
    """The lines of pytest's assertion explanation (-vv: never truncated) worth a row: what
    differs, what one side has more of; not the items in common, nor the full diff."""
    kept, skipping = [], False
    for line in lines:
        if line.endswith(":") and line[:1].isalpha():              # a section's header
            skipping = line.startswith(("Common items", "Full diff", "Omitting"))
        if not skipping and not line.startswith(("Use -v", "...")):
            kept.append(line)
    return kept[:EXPLAINED]


def describe(err, copy, tests=None):
    """One failure as the grader shows it: 'Type: message (at file:line, in function)'; a
    SyntaxError: 'SyntaxError at minialign/metrics.py:188: message'."""
    if isinstance(err, SyntaxError) and err.filename:
        path = Path(err.filename).resolve()
        shown = path.relative_to(copy).as_posix() if copy in path.parents else err.filename
        return f"SyntaxError at {shown}:{err.lineno}: {err.msg}"
    lines = [l.strip() for l in str(err).splitlines() if l.strip()] or [""]
    first = lines[0] if len(lines) == 1 or len(lines[0]) <= SHORT else lines[0][:SHORT] + " ..."
    at = where(traceback.extract_tb(err.__traceback__), copy, tests)
    text = f"{type(err).__name__}: " + " / ".join([first] + explanation(lines[1:]))
    return f"{text} (at {at})" if at else text


def import_error(err, copy):
    """An import-time failure: 'SyntaxError at minialign/metrics.py:188: ...', or
    'NameError at minialign/metrics.py:12: name 'x' is not defined'."""
    if isinstance(err, SyntaxError):
        return describe(err, copy)
    at = where(traceback.extract_tb(err.__traceback__), copy)
    place = f" at {at.split(', in ')[0]}" if at else ""
    return f"{type(err).__name__}{place}: {err}"


class StandIn(types.ModuleType):
    """A module of the copy that failed to import: any use raises ImportError with its error."""

    def __init__(self, name, error):
        super().__init__(name)
        self.__error = error

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise ImportError(f"{self.__name__} does not import: {self.__error}")


def import_copy(copy):
    """Import the copy's minialign and every top-level module of it; a module that fails gets
    a StandIn. Returns (package file, {module: error line})."""
    sys.path[:0] = [str(copy)]
    minialign = importlib.import_module("minialign")       # the copy's, not this file's tree
    errors = {}
    for path in sorted((copy / "minialign").glob("*.py")):
        name = f"minialign.{path.stem}"
        if path.stem == "__main__" or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception as err:          # SyntaxError, NameError, ImportError, anything at import
            errors[name] = import_error(err, copy)
            sys.modules[name] = StandIn(name, errors[name])
            setattr(minialign, path.stem, sys.modules[name])
    return minialign.__file__, errors


class Collector:
    """Per test: its exercise, outcome, seconds, rel_err (largest recorded), failed_err (the
    last one recorded in a failing test: the check that failed), message; per exercise, the
    marker's needs and the seconds its tests took. Before each test it writes the record to
    `out` with "running": the test's exercise, and gives faulthandler that exercise's time left
    (dump every stack to `hang`, then end the process): a test that never ends is then one
    exercise's timeout, and the parent knows which."""

    def __init__(self, copy, tests, record, out, hang, timeout):
        self.copy, self.file, self.record, self.out = copy, tests, record, out
        self.hang, self.timeout, self.spent, self.started = hang, timeout, {}, None

    def pytest_configure(self, config):
        for line in config.getini("markers"):
            m = MARKER.match(line)
            if m:
                self.record["needs"][m[1]] = [int(n) for n in re.findall(r"\d+", m[3] or "")]

    def test(self, nodeid):
        return self.record["tests"].setdefault(nodeid.split("::", 1)[-1], {
            "exercise": None, "outcome": "passed", "seconds": 0.0, "rel_err": None,
            "failed_err": None, "message": ""})

    def pytest_runtest_protocol(self, item, nextitem):
        numbers = [int(m.name[len("exercise"):]) for m in item.iter_markers()
                   if re.fullmatch(r"exercise\d+", m.name)]
        number = numbers[0] if numbers else None
        self.test(item.nodeid)["exercise"] = number
        self.record["running"] = number
        write(self.out, self.record)
        left = self.timeout - self.spent.get(number, 0.0)
        faulthandler.dump_traceback_later(max(left, 1e-3), exit=True, file=self.hang)
        self.started = (number, time.perf_counter())
        return None                                  # pytest's own protocol runs the test

    def pytest_runtest_logfinish(self, nodeid, location):
        faulthandler.cancel_dump_traceback_later()
        number, t0 = self.started
        self.spent[number] = self.spent.get(number, 0.0) + time.perf_counter() - t0
        self.record["running"] = None

    def pytest_runtest_makereport(self, item, call):
        if call.excinfo is not None and call.excinfo.errisinstance(Exception):   # not a skip
            test = self.test(item.nodeid)
            test["message"] = test["message"] or describe(call.excinfo.value, self.copy,
                                                          self.file)

    def pytest_runtest_logreport(self, report):
        test = self.test(report.nodeid)
        test["seconds"] += report.duration
        errs = [float(v) for k, v in report.user_properties if k == "rel_err"]
        if errs:
            test["rel_err"] = max(errs + [test["rel_err"] or 0.0])
        if report.failed:
            test["outcome"] = "failed"
            test["failed_err"] = errs[-1] if errs else None
            if not test["message"]:
                crash = getattr(report.longrepr, "reprcrash", None)
                test["message"] = (crash.message if crash else str(report.longrepr)).splitlines()[0]

    def pytest_collectreport(self, report):
        if report.failed:
            last = str(report.longrepr).strip().splitlines()[-1]
            self.record["collection_error"] = re.sub(r"^E\s+", "", last)   # pytest's E marker


def write(out, record):
    """The record, whole (written then renamed: the parent never reads half of one)."""
    Path(f"{out}.partial").write_text(json.dumps(record))
    Path(f"{out}.partial").replace(out)


def main(copy, tests, config, out, timeout, *exercises):
    """exercises: "N:minialign/module.py" each. Writes {"package", "import_errors" {N: line},
    "tests" {name: {exercise, outcome, ...}}, "needs" {N: [M]}, "running": N or None,
    "done": bool} to out."""
    copy, tests = Path(copy).resolve(), Path(tests).resolve()
    record = {"package": None, "import_errors": {}, "tests": {}, "needs": {}, "running": None,
              "done": False}
    package, errors = import_copy(copy)
    record["package"] = str(Path(package).resolve().parent)
    numbers = []
    for given in exercises:
        number, module = given.split(":", 1)
        own = f"minialign.{Path(module).stem}"
        if own in errors:
            record["import_errors"][number] = errors[own]
        else:
            numbers.append(number)
    if numbers and Path(package).resolve().parent == copy / "minialign":   # else: the parent
        import pytest                                                       # refuses
        with open(f"{out}.hang", "w") as hang:
            collector = Collector(copy, tests, record, out, hang, float(timeout))
            pytest.main([str(tests), "-vv", "--tb=no", "-p", "no:cacheprovider", "--rootdir",
                         str(Path(config).parent), "-c", str(config),
                         "-m", " or ".join(f"exercise{n}" for n in numbers)],
                        plugins=[collector])
    record["done"] = True
    write(out, record)


if __name__ == "__main__":
    sys.path.pop(0)                                  # this script's folder: not a package root
    sys.stdout = sys.stderr                          # pytest's own output: the parent drops it
    main(*sys.argv[1:])
