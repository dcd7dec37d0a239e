"""The machine a number was measured on: numpy, its BLAS, threads, CPU, Python. One
description, written into a replicate directory's environment.json (report prints it) and
printed by bench above its table; and keep_freed_memory, the process-level tweak every entry
point (python -m minialign, bench's children) makes."""
import ctypes
import os
from contextlib import contextmanager
import platform
from pathlib import Path

import numpy as np

from . import rows

THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
OPENBLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")   # OpenBLAS's kernel choice


def describe(env=None):
    """{"numpy", "blas": "name version", "cpus", "cpu", "python", "platform", "thread_env":
    the THREAD_ENV variables set, "blas_threads": OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS,
    else all cores, and the OPENBLAS_ENV settings, lower-case, None when unset}, for a process
    with environment `env` (default: this one's)."""
    env = os.environ if env is None else env
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").exists():
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    threads = env.get("OPENBLAS_NUM_THREADS") or env.get("OMP_NUM_THREADS") or os.cpu_count()
    return {"numpy": np.__version__, "blas": f"{blas.get('name')} {blas.get('version')}",
            "cpus": os.cpu_count(), "thread_env": {k: env[k] for k in THREAD_ENV if k in env},
            "cpu": cpu, "python": platform.python_version(), "platform": platform.platform(),
            "blas_threads": int(threads), **{k.lower(): env.get(k) for k in OPENBLAS_ENV}}


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


available_cores = rows.available_cores   # defined there: the row pool's default size


def cores():
    """Cores this process computes on: use_cores's n, else available_cores() (the row pool's
    size: rows.threads holds it, set once by use_cores)."""
    return rows.threads()


_openblas = rows.openblas   # numpy's own OpenBLAS function, found there (the pool needs it)


def blas_threads():
    """Threads numpy's OpenBLAS uses now, or None when it cannot tell (another BLAS)."""
    getter = _openblas("get_num_threads")
    return None if getter is None else int(getter())


BLAS_THREADS = 1   # numpy's BLAS threads after use_cores: one; the row pool holds the cores


def use_cores(n):
    """This process computes on n >= 1 cores: the fast path's row pool (rows.py) runs n
    threads, and numpy's BLAS one thread (OpenBLAS, through its own openblas_set_num_threads;
    other BLAS libraries keep their setting), inside the pool and outside it: OpenBLAS's
    threaded products round differently from its one-thread ones, so with BLAS fixed the
    numbers of a run (training, evaluation) do not depend on n, and n may change while it
    runs (rows.follow). Products outside the pool (VICReg's covariance, the evaluation's
    similarities and rotation fit) are small beside a step's. Returns True when the BLAS
    setting took effect. Raises ValueError for n < 1."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"use_cores: n={n!r} must be an integer >= 1")
    rows.set_threads(n)
    setter = _openblas("set_num_threads")
    if setter is None:
        return False
    setter(ctypes.c_int(BLAS_THREADS))
    return True


@contextmanager
def blas_on(n):
    """Run the body with numpy's OpenBLAS on n threads, then restore its setting: bench's
    peak and replayed GEMMs, timed on every core like the pool's row blocks."""
    getter, setter = _openblas("get_num_threads"), _openblas("set_num_threads")
    before = None if getter is None or setter is None else int(getter())
    if before is not None:
        setter(ctypes.c_int(n))
    try:
        yield
    finally:
        if before is not None:
            setter(ctypes.c_int(before))
