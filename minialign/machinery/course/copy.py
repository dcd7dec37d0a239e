"""Which copy of minialign a command is about, and whether Python imports that copy's code.

A copy (the repository, or a student copy written by `exercises`) is a folder holding
pyproject.toml and minialign/__init__.py. A student runs commands from inside it, maybe from
a subfolder, maybe with the repository installed in editable mode (the README's first command):
then `python -m minialign` imports the repository, not the copy, and would train or grade the
wrong code. find_copy walks up from the working directory; check_imported refuses in one line
when the package Python imported is not the copy's (in the repository itself it costs a few
stat calls and never refuses).

A student copy leaves out LEFT_OUT (the teacher's answer notes, the mutation suite, the fast
path: docs/course.md, "What the student copy holds") and carries STUDENT_FILE, the student's id.
"""
from pathlib import Path

STUDENT_FILE = "student.txt"      # in a copy: its student's id, on the first line
# What a student copy does not hold: the fast path computes the exercises' layers and
# cross-entropy (machinery/fastpath/rows.py, the thread pool, stays: no maths of an exercise)
LEFT_OUT = ("docs/teacher/", "tests/test_course_mutations.py",
            "minialign/machinery/fastpath/fast.py", "minialign/machinery/fastpath/fast_layers.py",
            "minialign/machinery/fastpath/fast_rows.py",
            # the tests of the fast path against the reference, and the benchmark of both
            "tests/test_fast.py", "tests/test_fast_layers.py", "tests/test_rows.py",
            "tests/test_bench.py")


def left_out(rel):
    """True when the repository file rel (a relative posix path) stays out of a student copy."""
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in LEFT_OUT)


def is_copy(folder):
    """A minialign copy: pyproject.toml and minialign/__init__.py in folder."""
    folder = Path(folder)
    return (folder / "pyproject.toml").is_file() and (folder / "minialign" / "__init__.py").is_file()


def is_student_copy(folder):
    """A copy written by `exercises`: it lacks the fast path (LEFT_OUT), so holds no solutions."""
    return is_copy(folder) and not (Path(folder) / LEFT_OUT[2]).is_file()


def find_copy(start=None):
    """The copy holding `start` (default: the working directory): start or its nearest parent
    that is_copy, resolved; None outside any copy."""
    start = Path(start or Path.cwd()).resolve()
    return next((p for p in [start, *start.parents] if is_copy(p)), None)


def package_root(package_file):
    """The copy a package's __init__.py belongs to (minialign/__init__.py -> its parent)."""
    return Path(package_file).resolve().parent.parent


def mismatch(copy, package_file):
    """The one line saying Python imports another tree than `copy`, or None when it is the
    copy's own minialign."""
    root = package_root(package_file)
    if root == Path(copy).resolve():
        return None
    which = "this student copy" if is_student_copy(copy) else "this checkout"
    return (f"{which} is {copy}, but Python imports minialign from {root / 'minialign'}; "
            f"run it from {copy} itself (cd {copy}), or `pip install -e {copy}`")


def check_imported(package_file, start=None):
    """Raise ValueError (mismatch's line) when the working directory is inside a copy whose
    minialign is not the one imported (package_file: minialign.__file__)."""
    copy = find_copy(start)
    line = mismatch(copy, package_file) if copy else None
    if line:
        raise ValueError(line)


def student_id(copy):
    """The first line of the copy's STUDENT_FILE, or None."""
    path = Path(copy) / STUDENT_FILE
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").strip().splitlines()
    return lines[0].strip() if lines else None
