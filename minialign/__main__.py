"""python -m minialign COMMAND --help: the command line is machinery/cli.py."""
import os
import sys

for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(name, "1")   # before numpy: the fast path's row blocks use the cores

try:
    from .machinery.cli import main
except SyntaxError as err:          # a student's unfinished file: one line, not a traceback
    sys.exit(f"minialign: error: {err.filename}:{err.lineno}: {err.msg}")

if __name__ == "__main__":
    sys.exit(main())
