"""python -m minialign {train,evaluate,replicate,report,bench,export,synthetic,data} --help
(the command line itself: machinery/cli.py)."""
import sys

from .machinery import cli
from .machinery.machine import keep_freed_memory


def main(argv=None):
    keep_freed_memory()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
