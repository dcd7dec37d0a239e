"""One exercise's tests, in a process of their own (grade.py starts one per exercise, with a
time limit), importing the copy's minialign and no other:

    python child.py COPY TESTS_FILE CONFIG N MODULE OUT TIMEOUT

COPY: the copy graded (its minialign/ is imported, whatever else is installed); TESTS_FILE:
the exercise tests (the copy's, or a teacher's --tests); CONFIG: the pyproject.toml pytest
reads its markers from; N: the exercise; MODULE: its file, "minialign/layers.py"; OUT: where
the JSON record goes; TIMEOUT: seconds the tests may run (faulthandler then writes every
thread's stack to OUT.hang and ends the process: the parent reads where it hung from it):

    {"package": where minialign was imported from, "import_error": a line or null,
     "tests": {test: {outcome, seconds, rel_err, failed_err, message}}, "needs": [M, ...]}

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
    """Per test: outcome, seconds, rel_err (largest recorded), failed_err (the last one recorded
    in a failing test: the check that failed), message; per exercise, the marker's needs."""

    def __init__(self, copy, tests):
        self.copy, self.file, self.tests, self.needs = copy, tests, {}, {}

    def pytest_configure(self, config):
        for line in config.getini("markers"):
            m = MARKER.match(line)
            if m:
                self.needs[int(m[1])] = [int(n) for n in re.findall(r"\d+", m[3] or "")]

    def record(self, nodeid):
        return self.tests.setdefault(nodeid.split("::", 1)[-1], {
            "outcome": "passed", "seconds": 0.0, "rel_err": None, "failed_err": None,
            "message": ""})

    def pytest_runtest_makereport(self, item, call):
        if call.excinfo is not None and call.excinfo.errisinstance(Exception):   # not a skip
            test = self.record(item.nodeid)
            test["message"] = test["message"] or describe(call.excinfo.value, self.copy,
                                                          self.file)

    def pytest_runtest_logreport(self, report):
        test = self.record(report.nodeid)
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
            self.record("collection")["outcome"] = "failed"
            self.tests["collection"]["message"] = str(report.longrepr).strip().splitlines()[-1]


def main(copy, tests, config, number, module, out, timeout):
    copy, tests = Path(copy).resolve(), Path(tests).resolve()
    record = {"package": None, "import_error": None, "tests": {}, "needs": []}
    package, errors = import_copy(copy)
    record["package"] = str(Path(package).resolve().parent)
    own = f"minialign.{Path(module).stem}"
    if Path(package).resolve().parent != copy / "minialign":
        pass                                         # the parent refuses, naming both
    elif own in errors:
        record["import_error"] = errors[own]
    else:
        import pytest
        collector = Collector(copy, tests)
        t0 = time.perf_counter()
        hang = open(f"{out}.hang", "w")
        faulthandler.dump_traceback_later(float(timeout), exit=True, file=hang)
        pytest.main([str(tests), "-vv", "--tb=no", "-p", "no:cacheprovider", "--rootdir",
                     str(Path(config).parent), "-c", str(config), "-m", f"exercise{number}"],
                    plugins=[collector])
        faulthandler.cancel_dump_traceback_later()
        record.update(tests=collector.tests, needs=collector.needs.get(int(number), []),
                      seconds=time.perf_counter() - t0)
    Path(out).write_text(json.dumps(record))


if __name__ == "__main__":
    sys.path.pop(0)                                  # this script's folder: not a package root
    sys.stdout = sys.stderr                          # pytest's own output: the parent drops it
    main(*sys.argv[1:])
