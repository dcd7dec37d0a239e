"""`python -m minialign grade --class DIR`: every copy in a folder graded against the teacher's
tests, into one CSV (docs/course.md, "Grading a class").

Each subfolder of DIR that is a copy (pyproject.toml and minialign/) is one student: their id
is the copy's student.txt (`exercises OUT --student ID` writes it), else the folder's name.
The tests are the teacher's (--tests DIR, default: this repository's tests/), so tests a
student edited in their copy change nothing. An exercise earns its points (POINTS, a table the
teacher edits, or --points FILE) when it passed, else 0. The CSV, one row per student:

    student,copy,1,2,...,N,total

and beside it (grades.csv -> grades-status.csv) the same rows with each exercise's status
instead of its points: passed, failed, error, timed out, not started, needs N.
"""
import csv
import io
import os
import time
from pathlib import Path

from .copy import is_copy, student_id
from .exercises import ROOT, find_exercises
from .grade import TIMEOUT, grade

POINTS = Path(__file__).with_name("points.csv")    # exercise,points; # comments


def read_points(path=POINTS, root=ROOT):
    """{exercise number: points} from a points table. Raises ValueError (naming the file and
    line) for a line that is no "N,points" with points >= 0, an exercise listed twice or
    unknown, or an exercise without a line."""
    path = Path(path)
    lines = [(i + 1, l) for i, l in enumerate(path.read_text(encoding="utf-8").splitlines())
             if l.strip() and not l.lstrip().startswith("#")]
    numbers = {e.number for e in find_exercises(root)}
    points, header = {}, lines and lines[0][1].replace(" ", "") == "exercise,points"
    for i, line in lines[1:] if header else lines:
        try:
            n, value = next(csv.reader([line]))
            n, value = int(n), float(value)
        except ValueError:
            raise ValueError(f"{path}:{i}: {line!r} is not 'exercise,points'") from None
        if n not in numbers or n in points or not value >= 0:
            raise ValueError(f"{path}:{i}: exercise {n} " + (
                "is no exercise" if n not in numbers else "is listed twice" if n in points
                else f"has points {value:g}; they must be >= 0"))
        points[n] = value
    missing = sorted(numbers - set(points))
    if missing:
        raise ValueError(f"{path}: no points for exercise(s) {', '.join(map(str, missing))}")
    return points


def copies_in(folder):
    """The copies in folder's subfolders, sorted by name. Raises ValueError when there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"--class {folder}: not a directory")
    found = sorted(p for p in folder.iterdir() if p.is_dir() and is_copy(p))
    if not found:
        raise ValueError(f"--class {folder}: no copy in its subfolders (each student's copy is "
                         f"one subfolder holding pyproject.toml and minialign/)")
    return found


def grade_class(folder, numbers=None, tests=None, timeout=TIMEOUT, points=POINTS):
    """[(student, copy, rows)] for every copy in folder, against `tests` (default: the
    repository's tests/)."""
    table = read_points(points)
    tests = tests or ROOT / "tests"
    graded = []
    for copy in copies_in(folder):
        copy, rows = grade(numbers, copy, tests, timeout)
        graded.append((student_id(copy) or copy.name, copy, rows, table))
    return graded


def class_csv(graded):
    """The CSV text: student, copy, the points of each exercise graded, total."""
    numbers = [r["number"] for r in graded[0][2]]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["student", "copy", *numbers, "total"])
    for student, copy, rows, table in graded:
        earned = [table[r["number"]] if r["status"] == "passed" else 0.0 for r in rows]
        writer.writerow([student, str(copy), *(f"{p:g}" for p in earned), f"{sum(earned):g}"])
    return out.getvalue()


def status_csv(graded):
    """The status CSV's text: student, copy, each exercise's status (passed, failed, error,
    timed out, not started, needs N), the same rows and columns as class_csv's."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["student", "copy", *(r["number"] for r in graded[0][2])])
    for student, copy, rows, _ in graded:
        writer.writerow([student, str(copy), *(r["status"] for r in rows)])
    return out.getvalue()


def spans(numbers):
    """'2 3 5 7 8 10-14': sorted numbers, runs of three or more as first-last."""
    runs = []
    for n in sorted(numbers):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return " ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else " ".join(map(str, r)) for r in runs)


def summary(rows):
    """A student's statuses in one phrase: 'passed 1 4 6; error 9; not started 2 3 5 7 8
    10-13; 14 needs 13', in the order the statuses first occur."""
    by = {}
    for r in rows:
        by.setdefault(r["status"], []).append(r["number"])
    return "; ".join(f"{spans(numbers)} {state}" if state.startswith("needs ")   # 11 needs 10
                     else f"{state} {spans(numbers)}" for state, numbers in by.items())


def status_path(out):
    """Where the status CSV goes: beside the points CSV, grades.csv -> grades-status.csv."""
    return out.with_name(f"{out.stem}-status{out.suffix or '.csv'}")


def run_class(folder, numbers=None, tests=None, timeout=TIMEOUT, out=None, points=POINTS):
    """Grade the class, write the CSV and its status CSV (atomically: a half-written file
    never replaces a whole one), print one line per student."""
    out = Path(out) if out else Path(folder) / "grades.csv"
    for path in (out, status_path(out)):
        if path.is_dir():
            raise ValueError(f"{path}: is a directory; give the CSV file's path (--out)")
    t0 = time.perf_counter()
    graded = grade_class(folder, numbers, tests, timeout, points)
    text = class_csv(graded)
    for path, content in ((status_path(out), status_csv(graded)), (out, text)):
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, path)
    full = sum(graded[0][3][r["number"]] for r in graded[0][2])
    for line, (_, copy, rows, _) in zip(list(csv.reader(io.StringIO(text)))[1:], graded):
        print(f"{line[0]}: {line[-1]} / {full:g} points ({summary(rows)}) in {copy}")
    print(f"wrote {out} and {status_path(out).name}: {len(graded)} copies against the tests in "
          f"{Path(tests or ROOT / 'tests').resolve()}, in {time.perf_counter() - t0:.1f} s")
