"""A small thread pool over ROW BLOCKS of packed (n, C) activations: the fast path's way of
using every core one run owns (fast_layers.py's "rows" section runs its layers through it).

NumPy releases the GIL inside ufuncs and matmul, so Python threads that each take a block of
rows compute in parallel. Two rules make the result independent of the number of threads:

  1. The partition depends only on n: rows [0, ROW_BLOCK), [ROW_BLOCK, 2 ROW_BLOCK), ...
     (row_blocks). Which thread computes a block changes nothing, so element-wise work and
     row-wise GEMMs (x_block @ w) give the same bits on 1, 2 or 16 threads.
  2. A sum over rows (bias, LayerNorm-gain and weight gradients, x^T dy) is one partial per
     fixed group of rows, written into its own slot, then added up in slot order
     (sum_partials). Never "each thread accumulates its own blocks".

GEMMs split this way run on one BLAS thread each: run() sets numpy's OpenBLAS to one thread
while the pool works and back afterwards, so BLAS's workers do not fight the pool's threads for
the same cores (several times slower otherwise). machine.use_cores keeps BLAS on one thread
outside the pool too: OpenBLAS's threaded sgemm rounds differently from its one-thread sgemm
(even a (512, 256)^T (512, 256) product), so the pool is the only thing a core count changes,
and it changes no bit.

The pool's size may change while a process runs (jobs.py: a run gets the cores another run
freed): follow(shared) makes the size be re-read from a shared integer at the entry of every
top-level run(), that is between two operations, never inside one.

Block sizes (float32; the measurements behind them: docs/performance.md, "Why the fast path
is shaped as it is"):
  BLOCK_ELEMENTS  an element-wise chain (LayerNorm, GELU) runs over blocks of
                  block_rows(C) = 131072 // C rows: 512 KB per array, 128 rows of the MLP's
                  (n, 1024), 512 rows of (n, 256), so a block stays in L2 from pass to pass.
                  Smaller blocks cost more than they save: every NumPy call takes the GIL back,
                  and with two threads issuing ~15 small calls per block they queue for it.
  GEMM_BLOCK      a row-block GEMM (linear layers, matmul_rows, weight gradients, the tied
                  head) takes up to 512 rows: OpenBLAS packs the whole weight for every call,
                  a large part of a small call's time; 256 and 512 rows run at the same rate.
  GEMM_TAIL       ... but the last rows of a product go in halving blocks, down to 64 rows
                  (gemm_blocks): threads claim blocks one at a time, so they finish within one
                  small block of each other instead of one idling for most of a 512-row block.
                  OpenBLAS's results for a row depend on the call's row count, so this one
                  partition is used by every GEMM over rows, and a weight gradient x^T dy is one
                  partial per block of it (summed in block order): the tied head's fused pass
                  and the three calls it replaces give the same bits.
  ROW_BLOCK       64 rows: the default partition (sum_partials' rows, tests).
"""
import ctypes
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROW_BLOCK = 64      # rows per block of the default partition
BLOCK_ELEMENTS = 131072   # elements per block of an element-wise chain (block_rows; 512 KB float32)
GEMM_BLOCK = 512    # rows per GEMM of a row-block product (see above: OpenBLAS's packing)
GEMM_TAIL = 64      # the smallest block of gemm_blocks' taper
SMALL_SUM = 65536   # sum_partials adds a total smaller than this on the calling thread
POOL_NAME = "minialign-rows"   # the workers' thread name prefix
_THREADS = None     # threads the pool runs, set by set_threads (machine.use_cores); None: all
_EXECUTOR = None    # (threads, ThreadPoolExecutor of threads - 1 workers), made on first use
_BLAS = {}          # OpenBLAS function name -> ctypes function or None, found once (openblas)
_FOLLOW = None      # a shared integer the pool's size is re-read from (follow), or None


def available_cores():
    """Cores this process may run on (its CPU affinity where the OS tells, else os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def openblas_paths(maps="/proc/self/maps"):
    """Files of the OpenBLAS numpy may have loaded: on Linux the loaded libraries themselves
    (/proc/self/maps); elsewhere the libraries named *openblas* that numpy's wheels ship beside
    it (numpy.libs on Windows and Linux, numpy/.dylibs on macOS, scipy_openblas64/lib), which
    ctypes opens as the copy already loaded."""
    maps = Path(maps)
    if maps.exists():
        return sorted({line.split()[-1] for line in maps.read_text().splitlines()
                       if "openblas" in line})
    numpy_dir = Path(np.__file__).parent
    folders = [numpy_dir / ".dylibs", numpy_dir.parent / "numpy.libs",
               numpy_dir.parent / "scipy_openblas64" / "lib"]
    return sorted(str(path) for folder in folders if folder.is_dir()
                  for path in folder.iterdir() if "openblas" in path.name.lower()
                  and (path.suffix in (".so", ".dylib", ".dll") or ".so." in path.name))


def openblas(function):
    """numpy's own OpenBLAS function `function` ("set_num_threads", "get_num_threads",
    "get_config", "get_corename"), found among openblas_paths(), or None (another BLAS)."""
    if function in _BLAS:
        return _BLAS[function]
    _BLAS[function] = None
    for path in openblas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in (f"scipy_openblas_{function}64_", f"openblas_{function}64_",
                     f"openblas_{function}"):
            if hasattr(lib, name) and _BLAS[function] is None:
                _BLAS[function] = getattr(lib, name)
    return _BLAS[function]


def set_threads(k):
    """The pool runs k >= 1 threads (the calling thread and k - 1 workers) from now on.
    Called by machine.use_cores. Raises ValueError for k < 1."""
    global _THREADS
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"rows.set_threads: k={k!r} must be an integer >= 1")
    _THREADS = k


def follow(shared):
    """From now on, the pool runs shared.value threads (a multiprocessing.Value("i") another
    process may change; 0 or less: keep the current size), re-read at the entry of every
    top-level run(), so a change applies between operations. None: stop following."""
    global _FOLLOW
    _FOLLOW = shared


def threads():
    """Threads the pool runs: set_threads's k, else available_cores()."""
    return _THREADS or available_cores()


def block_rows(C):
    """Rows per block of an element-wise chain over (n, C) rows: BLOCK_ELEMENTS // C (read at
    the call, so a test may shrink it), at least 1."""
    return max(1, BLOCK_ELEMENTS // C)


def row_blocks(n, block=ROW_BLOCK):
    """The fixed partition of n rows: a list of (start, stop), each `block` rows but the last."""
    return [(start, min(start + block, n)) for start in range(0, n, block)]


def gemm_blocks(n):
    """The fixed partition of n rows for GEMMs over rows: blocks of GEMM_BLOCK rows, then, where
    fewer than twice a block's rows are left, blocks halved down to GEMM_TAIL rows, e.g.
    n = 1300: 512, 256, 256, 128, 64, 64, 20. Depends only on n (rows.GEMM_BLOCK and
    GEMM_TAIL, read at the call). Returns a list of (start, stop)."""
    blocks, start = [], 0
    while start < n:
        block = GEMM_BLOCK
        while block > GEMM_TAIL and n - start < 2 * block:
            block //= 2
        blocks.append((start, min(start + block, n)))
        start += block
    return blocks


def run(task, n_items):
    """task(i) for i in range(n_items), spread over threads() threads; returns when all are
    done, re-raising the first exception of any task. Items are claimed one at a time, so a
    thread slowed by another process takes fewer. task must write only its own outputs.
    Called from inside a task, runs on the calling thread alone (no deadlock on the pool).
    A top-level call first takes the size a follow()ed shared integer holds."""
    nested = threading.current_thread().name.startswith(POOL_NAME)      # a task's own run()
    wanted = _FOLLOW.value if _FOLLOW is not None and not nested else 0   # read once
    if wanted >= 1 and wanted != _THREADS:
        set_threads(int(wanted))                                          # between operations
    get, set_ = openblas("get_num_threads"), openblas("set_num_threads")
    blas = get() if get is not None and set_ is not None else 1
    if blas != 1:
        set_(ctypes.c_int(1))
    try:
        _run(task, n_items, 1 if nested else min(threads(), n_items))
    finally:
        if blas != 1:
            set_(ctypes.c_int(blas))


def _run(task, n_items, k):
    """run's work on k threads, BLAS already on one. The workers take the caller's
    np.errstate (a thread's own setting: train_step's over="ignore" holds for its tasks too)."""
    if k <= 1:
        for i in range(n_items):
            task(i)
        return
    counter, lock, errors = itertools.count(), threading.Lock(), np.geterr()

    def worker():
        with np.errstate(**errors):
            while True:
                with lock:
                    i = next(counter)
                if i >= n_items:
                    return
                task(i)

    futures = [_executor().submit(worker) for _ in range(k - 1)]
    try:
        worker()
    finally:
        for f in futures:
            f.result()


def _executor():
    """The worker threads for threads() (made again when set_threads changed the count)."""
    global _EXECUTOR
    k = threads()
    if _EXECUTOR is None or _EXECUTOR[0] != k:
        if _EXECUTOR is not None:
            _EXECUTOR[1].shutdown(wait=True)
        _EXECUTOR = (k, ThreadPoolExecutor(max(k - 1, 1), thread_name_prefix=POOL_NAME))
    return _EXECUTOR[1]


def map_blocks(task, n, block=ROW_BLOCK):
    """task(i, start, stop) for every block i of row_blocks(n, block), on the pool."""
    map_partition(task, row_blocks(n, block))


def map_partition(task, blocks):
    """task(i, start, stop) for every (start, stop) = blocks[i] (e.g. gemm_blocks(n)), on the pool."""
    run(lambda i: task(i, *blocks[i]), len(blocks))


def sum_partials(partials):
    """partials: (P, ...) array, one partial sum per fixed group of rows -> their sum (...),
    added in slot order 0, 1, ..., P-1 (the same bits for any number of threads). The rows of
    the result are split over the pool; each is summed over all P partials in order."""
    total = partials[0].copy()                                            # (...)
    flat_total = total.reshape(len(total), -1) if total.ndim else total.reshape(1, 1)
    flat_parts = partials.reshape(len(partials), *flat_total.shape)       # (P, rows, cols)

    def add(i, start, stop):
        for p in range(1, len(partials)):
            flat_total[start:stop] += flat_parts[p, start:stop]

    if total.size < SMALL_SUM:   # a bias's (C,): the same order of additions, no thread hand-off
        add(0, 0, len(flat_total))
    else:
        map_blocks(add, len(flat_total))
    return total


def matmul_rows(x, w, out=None):
    """x @ w with x's rows in the blocks of gemm_blocks(n) on the pool. x: (n, K); w: (K, M);
    out: (n, M) or None. Returns out. Each block is one BLAS call: the same bits for any
    thread count."""
    n = x.shape[0]
    out = np.empty((n, w.shape[1]), dtype=np.result_type(x, w)) if out is None else out

    def block(i, start, stop):
        np.matmul(x[start:stop], w, out=out[start:stop])

    map_partition(block, gemm_blocks(n))
    return out


def matmul_tn_rows(x, dy):
    """x^T dy, a sum over rows, for weight gradients. x: (n, K); dy: (n, M). Returns (K, M):
    one partial per block of gemm_blocks(n), computed on the pool, then sum_partials."""
    blocks = gemm_blocks(x.shape[0])
    partials = np.empty((max(len(blocks), 1), x.shape[1], dy.shape[1]),
                        dtype=np.result_type(x, dy))                      # (P, K, M)
    if not blocks:
        partials[0] = 0
        return partials[0]

    def block(i, start, stop):
        np.matmul(x[start:stop].T, dy[start:stop], out=partials[i])

    map_partition(block, blocks)
    return sum_partials(partials)
