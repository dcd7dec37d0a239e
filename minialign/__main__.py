"""python -m minialign {train,evaluate,replicate,report,bench,export,synthetic,data} --help
(the command line itself: machinery/cli.py)."""
import os
import re
import sys
from pathlib import Path

from .machinery.run.blasenv import one_blas_thread

one_blas_thread(os.environ, sys.argv[1:])       # before numpy is imported (blasenv.py)

from .machinery import grading                        # noqa: E402 (numpy: after)
from .machinery.course import child, exercises        # noqa: E402 (no student file)
from .machinery.run.machine import keep_freed_memory  # noqa: E402


def import_failed(command, err):
    """The one line for a command whose code does not import (a student's syntax error in
    optim.py, say): which file, which exercise(s) it holds, and that grade still works."""
    root = Path(__file__).resolve().parent.parent
    line = child.import_error(err, root)
    at = re.search(r" at (minialign/[^:/]+\.py):", line)
    try:
        held = [e.number for e in exercises.find_exercises(root) if at and e.path == at[1]]
    except ValueError:                              # its markers are broken too
        held = []
    which = (f" (the file of exercise{'s' * (len(held) > 1)} {', '.join(map(str, held))}; "
             f"`python -m minialign grade` grades the others)" if held else "")
    return f"minialign{' ' + command if command else ''}: error: {line}{which}"


def main(argv=None):
    keep_freed_memory()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["grade"]:   # without cli, which imports the student's files (grading.py)
            return grading.main(argv)
        try:
            from .machinery import cli      # the rest of the command line
        except Exception as err:            # SyntaxError, NameError, ImportError in a module
            command = argv[0] if argv and not argv[0].startswith("-") else ""
            print(import_failed(command, err), file=sys.stderr)
            return 2
        return cli.main(argv)
    except BrokenPipeError:         # stdout closed early (`... | head -1`): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # for the last flush
        return 128 + 13             # 141: SIGPIPE's code, as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
