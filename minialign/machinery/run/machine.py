"""The machine a number was measured on: numpy, its BLAS, threads, CPU, Python. One
description, written into a replicate directory's environment.json (report prints it) and
printed by bench above its table; and keep_freed_memory, the process-level tweak every entry
point (python -m minialign, bench's children) makes."""
import ctypes
import functools
import os
import platform
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..fastpath import rows
from .blasenv import ONE_THREAD_ENV

THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
OPENBLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")   # OpenBLAS's kernel choice


def openblas_text(function):
    """What OpenBLAS's `function` ("get_config", "get_corename") says, or None (another BLAS)."""
    f = _openblas(function)
    if f is None:
        return None
    f.restype = ctypes.c_char_p
    return f().decode("ascii", "replace").strip()


def blas_library():
    """{"name", "version", "core"} of numpy's BLAS. name and version from numpy's build record
    (np.show_config(mode="dicts"), numpy >= 1.26), else from OpenBLAS's own openblas_get_config
    ("OpenBLAS 0.3.23.dev ..."); core: the kernel OpenBLAS runs on this CPU
    (openblas_get_corename: "Haswell", "SkylakeX", "Zen", "neoversen1", ...), None for
    another BLAS, whose kernel no call names."""
    try:
        build = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name, version = build.get("name"), build.get("version")
    except TypeError:                             # numpy < 1.26: show_config has no mode
        config = (openblas_text("get_config") or "unknown unknown").split()
        name, version = config[0].lower(), config[1]
    return {"name": name, "version": version, "core": openblas_text("get_corename")}


def describe(env=None):
    """{"numpy", "blas": "name version", "cpus", "cpu", "python", "platform", "thread_env":
    the THREAD_ENV variables set, "blas_threads": OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS,
    else all cores, "blas_core": the kernel OpenBLAS runs (blas_library) or None, and the
    OPENBLAS_ENV settings, lower-case, None when unset}, for a process with environment `env`
    (default: this one's)."""
    env = os.environ if env is None else env
    blas = blas_library()
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").exists():
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    threads = env.get("OPENBLAS_NUM_THREADS") or env.get("OMP_NUM_THREADS") or os.cpu_count()
    return {"numpy": np.__version__, "blas": f"{blas['name']} {blas['version']}",
            "blas_core": blas["core"],
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
    threads, and numpy's BLAS one thread, inside the pool and outside it: OpenBLAS through its
    own openblas_set_num_threads; Accelerate, MKL and BLIS through blasenv.ONE_THREAD_ENV, which
    only counts when set before numpy was imported (python -m minialign does). OpenBLAS's threaded
    products round differently from its one-thread ones, so with BLAS fixed the numbers of a
    run (training, evaluation) do not depend on n, and n may change while it runs
    (rows.follow). Products outside the pool (VICReg's covariance, the evaluation's
    similarities and rotation fit) are small beside a step's. Returns True when BLAS is on one
    thread; otherwise says once (unpinned_note) that the numbers may depend on --threads.
    Raises ValueError for n < 1."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"use_cores: n={n!r} must be an integer >= 1")
    rows.set_threads(n)
    setter = _openblas("set_num_threads")
    if setter is not None:
        setter(ctypes.c_int(BLAS_THREADS))
        return True
    name = blas_library()["name"]
    variable = next((v for k, v in ONE_THREAD_ENV.items() if k in str(name).lower()), None)
    if variable is not None and os.environ.get(variable) == str(BLAS_THREADS):
        return True
    unpinned_note(name, variable)
    return False


@functools.lru_cache(maxsize=None)
def unpinned_note(name, variable):
    """Once per process, on stderr: BLAS threads not fixed, numbers may depend on --threads."""
    how = (f"{variable}={BLAS_THREADS} before numpy is imported" if variable
           else "no known way to fix its threads")
    print(f"note: numpy's BLAS ({name}) may run several threads here ({how}): a run's numbers "
          f"can differ between --threads values (docs/platforms.md)", file=sys.stderr,
          flush=True)


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
