"""python -m minialign {train,evaluate,replicate,report,bench,export,synthetic,data} --help
(the command line itself: machinery/cli.py)."""
import ctypes
import sys

from .machinery import cli


def keep_freed_memory():
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS.
    Each training step allocates and frees the same large activations; by default glibc maps
    every array over 32 MB afresh and unmaps it when freed, and touching new pages costs far
    more than the arithmetic (a page fault per 4 KB). Process-wide, so called once at the
    entry point (here, and in bench's child processes). No effect outside glibc (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4                                 # from glibc's malloc.h
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**30))


def main(argv=None):
    keep_freed_memory()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
