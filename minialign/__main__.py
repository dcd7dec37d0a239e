"""python -m minialign COMMAND --help: the command line is machinery/cli.py."""
import os
import sys

for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(name, "1")   # before numpy: the fast path's row blocks use the cores

from .machinery.cli import main  # noqa: E402 (after the environment: cli's commands import numpy)

if __name__ == "__main__":
    sys.exit(main())
