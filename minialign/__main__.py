"""python -m minialign {train,evaluate,replicate,report,bench,export,synthetic,data} --help
(the command line itself: machinery/cli.py)."""
import os
import sys

from .machinery.run.blasenv import one_blas_thread

one_blas_thread(os.environ, sys.argv[1:])       # before numpy is imported (blasenv.py)

from .machinery import cli                            # noqa: E402 (numpy: after)
from .machinery.run.machine import keep_freed_memory  # noqa: E402


def main(argv=None):
    keep_freed_memory()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
