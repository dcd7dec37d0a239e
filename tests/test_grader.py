"""The class grader (course.grade_class): every copy gets a row per exercise whatever it holds,
and nothing a copy's code does reaches a verdict, another copy, the teacher's files or the CSV.
"""
import csv
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import NEEDS_SOLUTIONS, POSIX_SIGNALS, ROOT

from minialign.machinery import course, course_child

ALL = list(range(1, 15))
pytestmark = NEEDS_SOLUTIONS
confined = pytest.mark.skipif(not course_child.landlock_abi(),
                              reason="only Linux' Landlock keeps a child from the teacher's files")


def copy_with(folder, name, edit=None, solved=ALL):
    """A solved copy in folder/name with edit (module, old, new) made: old replaced by new (old
    "": new put at the top of the module; new None: the module deleted)."""
    course.write_copy(folder / name, solved=solved)
    if edit:
        module, old, new = edit
        path = folder / name / "minialign" / module
        text = path.read_bytes()
        assert not old or text.count(old.encode()) == 1, edit
        if new is None:
            path.unlink()
        else:
            path.write_bytes(text.replace(old.encode(), new if isinstance(new, bytes)
                                          else new.encode(), 1))


def read(path):
    try:
        return path.read_bytes()
    except OSError:                                           # a process gone meanwhile
        return b""


def statuses(rows):
    return {(r["student"], int(r["exercise"])): (r["status"], r["detail"]) for r in rows}


@POSIX_SIGNALS               # what a killed, hung or flooding child leaves is POSIX's to say
def test_a_class_always_finishes_with_a_row_per_exercise_and_student(tmp_path, capsys,
                                                                     monkeypatch):
    edits = {"exit": ("layers.py", "", "import sys\nsys.exit(3)\n"),
             "hang": ("metrics.py", "", "while True:\n    pass\n"),
             "forks": ("optim.py", "", "import os, time\nif not os.fork():\n    time.sleep(600)\n"),
             "latin1": ("losses.py", "", b'CAFE = "caf\xe9"\n'),
             "missing": ("metrics.py", "", None),
             "marker": ("optim.py", "    # --- exercise 9: AdamW step ---\n", ""),
             "shouts": ("objectives.py", "", "print('x' * (100 << 20))\n"),
             "killed": ("layers.py", "", "import os\nos.kill(os.getpid(), 9)\n")}
    for name, e in edits.items():
        copy_with(tmp_path, name, e)
    copy_with(tmp_path, "good")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # the children's scratch folders
    rows = course.grade_class(tmp_path, timeout=5)
    with open(tmp_path / "grades.csv", newline="") as f:
        assert [len(r) for r in csv.reader(f)] == [8] * (1 + 9 * 14)
    s = statuses(rows)
    assert {s[("good", n)][0] for n in ALL} == {"passed"}
    assert s[("exit", 1)] == ("error", "SystemExit: 3 (at minialign/layers.py:2)")
    assert s[("hang", 12)] == ("error", "timed out after 5 s") and s[("hang", 1)][0] == "passed"
    assert s[("latin1", 6)][0] == "error" and "losses.py" in s[("latin1", 6)][1]
    assert s[("missing", 13)] == ("error", "ModuleNotFoundError: No module named "
                                           "'minialign.metrics'")
    assert s[("marker", 9)][0] == "passed"
    assert s[("shouts", 10)][0] == "error" and "File too large" in s[("shouts", 10)][1]
    assert s[("killed", 2)][0] == "error" and "SIGKILL" in s[("killed", 2)][1]
    if sys.platform.startswith("linux"):                      # no child left, nor its fork
        assert not [p for p in Path("/proc").glob("[0-9]*/cmdline")
                    if str(tmp_path).encode() in read(p)]
    printed = capsys.readouterr().out
    assert printed.count(" / 35 points") == 9
    assert {str(r["seed"]) for r in rows} == {re.search(r"--seed (\d+);", printed)[1]}


@confined
def test_no_cheat_reaches_a_verdict_the_teachers_files_another_copy_or_the_csv(tmp_path, server):
    csv_path, other = tmp_path / "grades.csv", tmp_path / "victim" / "minialign" / "layers.py"
    solutions, tests = str(ROOT / "minialign" / "layers.py"), str(ROOT / course.CASES)
    edits = {
        "reads_solutions": ("layers.py", "    x, w = cache\n",
                            f"    exec(open({solutions!r}).read())\n    x, w = cache\n"),
        "writes_tests": ("metrics.py", "", f"open({tests!r}, 'a').write('x')\n"),
        "writes_csv": ("losses.py", "", f"open({str(csv_path)!r}, 'w').write('x')\n"),
        "breaks_other": ("optim.py", "", f"open({str(other)!r}, 'w').write('x')\n"),
        "late_writer": ("objectives.py", "", "import os, time\nif os.fork() == 0:\n    os.setsid()"
                        f"\n    time.sleep(2)\n    open({str(csv_path)!r}, 'w').write('x')\n"),
        "patches_numpy": ("metrics.py", "", "import numpy\nnumpy.allclose = numpy.array_equal = "
                          "lambda *a, **k: True\n"),
        "reads_other": ("layers.py", "    x, w = cache\n",
                        f"    exec(open({str(other)!r}).read())\n    x, w = cache\n"),
        "downloads": ("losses.py", "", "import urllib.request\n"
                      f"urllib.request.urlopen({server.url!r})\n"),
        "forges": ("metrics.py", "", "import __main__\n__main__.call = lambda *a: {}\n")}
    for name, e in edits.items():
        copy_with(tmp_path, name, e, solved=[] if name == "patches_numpy" else ALL)
    copy_with(tmp_path, "victim")
    before = (ROOT / course.CASES).read_bytes()
    s = statuses(course.grade_class(tmp_path))
    time.sleep(3)                                            # the late writer's moment
    assert (ROOT / course.CASES).read_bytes() == before
    assert {s[(name, n)][0] for name in ("victim", "late_writer") for n in ALL} == {"passed"}
    assert csv_path.read_text().startswith(",".join(course.COLUMNS))
    for student, n in [("reads_solutions", 1), ("writes_tests", 12), ("writes_csv", 6),
                       ("breaks_other", 9), ("reads_other", 1)] + [("downloads", 7)] * (
                           course_child.landlock_abi() >= 4):        # Linux 6.7: no TCP
        status, detail = s[(student, n)]
        assert status == "error" and "Permission denied" in detail, (student, detail)
    assert s[("forges", 13)] == ("failed", "case 0, returned : missing")
    assert {s[("patches_numpy", n)][0] for n in ALL} == {"not started"}


def test_verdicts_compare_dtype_values_ties_and_inputs_after_the_call():
    """differs: what a wrong output looks like to the grader, on small arrays."""
    f32, f64 = np.ones(3, np.float32), np.ones(3)
    assert course.differs(f32, f64, 1e-8) == "dtype float32, expected float64"
    assert course.differs(np.float32(1), np.float64(1), 1e-8) is None          # 0-d: value only
    assert course.differs(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 4e-8]), 1e-8) is not None
    assert course.differs(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-8]), 1e-8) is None
    assert course.differs(np.array([1, 2]), np.array([1.0, 2.0]), 1e-8) == \
        "dtype int64, expected float64"
    assert course.differs(np.array([np.inf]), np.array([1.0]), 1.0) is not None
    assert course.differs(np.array([3]), np.array([3 + 1]), np.inf) is not None  # integers exact
    assert course.differs(np.zeros((2, 3)), np.zeros((3, 2)), 1) == "shape (2, 3), expected (3, 2)"


def test_flatten_keeps_every_array_of_nested_outputs():
    out = course_child.flatten(({"a": np.zeros(2), "t": 3}, [np.ones(1)], None,
                                np.random.default_rng(0)), "0/out")
    assert sorted(out) == ["0/out/0/a", "0/out/0/t", "0/out/1/0", "0/out/2"]
    assert out["0/out/2"].dtype.kind == "U" and out["0/out/0/t"] == 3
