"""A pytest plugin for the course kit's own tests (test_course.py): which exercises' bodies each
test runs. `python -m pytest -p reached --reached-out FILE tests/test_exercises.py` traces
the lines executed in the marked modules (sys.settrace, only in those files) and writes
{test node id: {"markers": [N of its exerciseN markers], "reached": [exercise numbers whose
marked body ran]}} as JSON to FILE.

A body that never runs in a test cannot change its outcome, so this says, on the working
code, exactly which stubs a test would reach in a student copy."""
import json
import re
import sys
from pathlib import Path

import pytest

from minialign.machinery.course.exercises import ROOT, find_exercises


def pytest_addoption(parser):
    parser.addoption("--reached-out", help="where the JSON of reached exercises goes")


def body_lines():
    """{absolute path: {1-based line: exercise number}} of every marked body."""
    lines = {}
    for ex in find_exercises():
        path = str((ROOT / ex.path).resolve())
        lines.setdefault(path, {}).update({i + 1: ex.number for i in range(ex.start + 1, ex.end)})
    return lines


class Reached:
    def __init__(self, out):
        self.out, self.lines, self.found = out, body_lines(), {}
        self.by_name = {}                  # co_filename -> its marked lines or None (cached)

    def marked(self, filename):
        if filename not in self.by_name:
            self.by_name[filename] = self.lines.get(str(Path(filename).resolve()))
        return self.by_name[filename]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        seen = set()
        self.found[item.nodeid] = {"markers": [int(m.name[len("exercise"):]) for m in
                                               item.iter_markers() if
                                               re.fullmatch(r"exercise\d+", m.name)],
                                   "reached": seen}

        def trace(frame, event, arg):
            marked = self.marked(frame.f_code.co_filename)
            if marked is None:
                return None                            # no line events outside marked files

            def local(frame, event, arg):
                if event == "line" and frame.f_lineno in marked:
                    seen.add(marked[frame.f_lineno])
                return local
            return local
        sys.settrace(trace)
        try:
            yield
        finally:
            sys.settrace(None)

    def pytest_sessionfinish(self):
        Path(self.out).write_text(json.dumps(
            {k: {**v, "reached": sorted(v["reached"])} for k, v in self.found.items()}))


def pytest_configure(config):
    out = config.getoption("--reached-out")
    if out:
        config.pluginmanager.register(Reached(out), "reached-recorder")
