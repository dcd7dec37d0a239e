"""python -m minialign COMMAND --help: the command line is machinery/cli.py."""
import sys

try:
    from .machinery.cli import main
except SyntaxError as err:          # a student's unfinished file: one line, not a traceback
    sys.exit(f"minialign: error: {err.filename}:{err.lineno}: {err.msg}")

if __name__ == "__main__":
    sys.exit(main())
