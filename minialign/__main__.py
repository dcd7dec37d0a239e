"""python -m minialign {train,evaluate,replicate,report,bench,export,synthetic,data} --help
(the command line itself: machinery/cli.py)."""
import os
import sys

from .machinery.run.blasenv import one_blas_thread

one_blas_thread(os.environ, sys.argv[1:])       # before numpy is imported (blasenv.py)

from .machinery import grading                        # noqa: E402 (numpy: after)
from .machinery.run.machine import keep_freed_memory  # noqa: E402


def main(argv=None):
    keep_freed_memory()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["grade"]:       # without cli, which imports the student's files (grading.py)
        return grading.main(argv)
    from .machinery import cli      # the rest of the command line
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
