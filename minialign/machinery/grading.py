"""`python -m minialign grade`, apart from the rest of the command line (cli.py): __main__
runs it without importing cli, so a student copy whose own files do not import (a syntax error
in metrics.py, a name error in optim.py: cli imports them through train and evaluate) is still
graded, each exercise in its own process (course/grade.py). cli lists the same command."""
import sys

from .course import classes, grade
from .course.copy import STUDENT_FILE
from .run.flags import Parser, positive_float, positive_int

EXIT_NOT_PASSED = 1  # some exercise did not pass (the table says which)


def add_grade_args(p):
    p.add_argument("numbers", nargs="*", type=positive_int, metavar="N",
                   help="exercises to grade (default: all)")
    p.add_argument("--json", action="store_true",
                   help="the copy, the student and the rows, every test's too, as JSON")
    p.add_argument("--copy", metavar="DIR", help="the copy to grade (default: the one holding "
                   "the working directory)")
    p.add_argument("--tests", metavar="DIR", help="grade against the exercise tests in DIR "
                   "(a teacher's own tests/ folder) instead of the copy's")
    p.add_argument("--student", metavar="ID", help=f"the student's id in the header and JSON "
                   f"(default: the first line of the copy's {STUDENT_FILE})")
    p.add_argument("--timeout", type=positive_float, default=grade.TIMEOUT, metavar="S",
                   help="seconds one exercise's tests may run before its row says timed out")
    p.add_argument("--class", dest="class_dir", metavar="DIR",
                   help="grade every copy in DIR (each subfolder one student) into one CSV "
                        "(--out), against --tests (default: this repository's tests)")
    p.add_argument("--out", metavar="CSV", help="with --class: the CSV to write (default: "
                   "DIR/grades.csv; each exercise's status beside it, DIR/grades-status.csv)")
    p.add_argument("--points", metavar="FILE", help="with --class: the points of each "
                   "exercise, lines 'exercise,points' (default: minialign/machinery/course/"
                   "points.csv)")


def run_grade(args):
    """One copy's table (grade.run_grade), or with --class a folder's CSV (classes.run_class)."""
    if args.class_dir is not None:
        return classes.run_class(args.class_dir, args.numbers, args.tests, args.timeout,
                                 args.out, args.points or classes.POINTS)
    if args.out is not None or args.points is not None:
        raise ValueError("--out, --points: only with --class DIR")
    grade.run_grade(args.numbers, args.json, args.copy, args.tests, args.timeout, args.student)


def main(argv):
    """argv: ["grade", ...]. Returns the exit code: 0 every exercise passed (or the class was
    graded), 1 some did not, 2 a refusal (one line), 130 Ctrl-C."""
    parser = Parser(prog="python -m minialign grade", description="the course kit: each "
                    "exercise's own tests, one row per exercise")
    add_grade_args(parser)
    args = parser.parse_args(argv[1:])
    try:
        run_grade(args)
    except grade.NotAllPassed:
        return EXIT_NOT_PASSED
    except BrokenPipeError:                          # stdout closed: __main__ ends quietly
        raise
    except (OSError, ValueError, ImportError) as e:
        print(f"minialign grade: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("minialign grade: interrupted; rerun it: grading writes nothing but --class's "
              "CSV, at the end", file=sys.stderr)
        return 130
    return 0
