"""Independent runs side by side: each in its own process with its share of the cores, the
grid's time on N slots, and the memory check that refuses a --jobs count the machine cannot hold.

Why processes from multiprocessing's "spawn" context (a fresh interpreter), and not threads or
fork: a run is NumPy-bound and holds the GIL between BLAS calls, so threads would serialise;
fork would copy a parent whose OpenBLAS threads are already running (unsafe) and its memory;
a subprocess `python -m minialign train` would have to turn every TrainConfig field back into
flags. A spawned child gets the exact TrainConfig (pickled), sets its own BLAS threads
(machine.use_cores), and its peak memory is its own.

Cores follow the runs: each child's core count is a shared integer (multiprocessing.Value) the
parent rewrites whenever a child starts or finishes (rebalance: cores // running each, the
remainder to the oldest), and the child's row pool reads it between operations (rows.follow),
so the last run of a grid computes on every core. A run's numbers do not depend on its core
count (machine.use_cores keeps BLAS on one thread; the pool's sums are per fixed block).

Ctrl-C: the terminal sends SIGINT to every process of the group. A child is started with
SIGINT blocked (a Ctrl-C during its start-up waits), then takes the first SIGINT as
KeyboardInterrupt and ignores any later one, so its clean-up (the run directory's lock,
dirlock.DirLock; atomic writes) is never cut short; it exits with EXIT_INTERRUPTED. The parent
sends each live child one SIGINT too (for a SIGINT sent to the parent alone), then waits.
SIGTERM (`kill`, `timeout` and Slurm, which signal the whole group) is a Ctrl-C too, in the
parent (sigterm_interrupts: Terminated) and in the children, so a killed grid exits cleanly,
its multiprocessing semaphores released, and resumes like an interrupted one.

A child that reaches an exercise's stub (a student copy, exercises.py) exits EXIT_EXERCISE + N
and prints nothing; raise_unfinished makes the parent raise that stub's error, so the command
says which exercise in its one line.
"""
import contextlib
import heapq
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import wait as wait_sentinels
from pathlib import Path

from ..fastpath import rows
from ..course.exercises import stub_error, stub_number
from ..run.machine import available_cores, keep_freed_memory, use_cores

EXIT_INTERRUPTED = 130     # a child stopped by Ctrl-C (as `python -m minialign`)
EXIT_EXERCISE = 64         # + N: a child reached exercise N's stub (N < 64)
STOP_GRACE_S = 60          # seconds a child may take to stop after SIGINT before SIGKILL
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}    # Ctrl-C; kill, timeout, Slurm

# Peak resident memory of one run, MB, fitted to bench's peak_rss_mb at --threads 1 (numpy 2.4,
# OpenBLAS, COCO val2017 captions, V = 5814): default size (D=256, L=4, 256 photos, 6873 real
# tokens) good_views 871 MB, next_token 1203 MB; 128 photos 485 / 644 MB; D=512 1773 / 2116
# MB; L=8 1492 MB (fit within 3%). Activations kept for the backward grow with the tokens of
# a step x D, per block and outside the blocks (embedding, final LayerNorm, pooling);
# next_token adds (tokens, V) float32 logits, probabilities and their gradient; weights,
# gradients and Adam's two moments are 4 float32 copies of the parameters.
MEM_BASE_MB = 105              # interpreter, numpy, imports, captions, evaluation: measured,
# a tiny run (synthetic world, D=32, L=1, 64 photos, 5 steps, image evaluation, a --jobs
# child) peaks at 112 MB, of which ~10 MB activations; its estimate 1.15 x 115 = 133 MB
MEM_BLOCK_BYTES = 86           # per real token x D x block
MEM_TOKEN_BYTES = 104          # per real token x D, outside the blocks
MEM_HEAD_CHUNKS = 4            # next_token: logits blocks of rows.GEMM_BLOCK rows alive at once
MEM_MARGIN = 1.15              # headroom over the fit (allocator slack, evaluation batches)
TOKENS_PER_CAPTION = 13.5      # mean real tokens of a COCO caption, BOS and EOS included
MEM_SAFETY_MB = 500            # memory left to the rest of the machine, MB
MEM_TOTAL_SHARE = 0.5          # where only the total memory is known: the share deemed available


# ---------------------------------------------------------------- memory
def run_memory_mb(cfg, vocab_size=None):
    """Estimated peak resident memory of one training run of `cfg` (a train.TrainConfig), MB:
    MEM_MARGIN x (MEM_BASE_MB + activations + next_token's head + 4 copies of the weights):
    linear in batch_photos (tokens per step) and n_layers, in d_model but for the weights'
    D^2 terms. next_token's fused head (fast_layers.tied_head_cross_entropy_fast) never holds
    all (n, V) logits: its partials of dtok_emb (V, D), one per block of rows.gemm_blocks(n),
    and dtok_emb itself, plus MEM_HEAD_CHUNKS logits blocks of (rows.GEMM_BLOCK, V) (~0.16 GB
    of ~1.2 GB at the default size; measured: a next_token bench process peaks ~45 MB above a good_views one).
    vocab_size: V, else cfg.model.vocab_size."""
    m = cfg.model
    V = vocab_size or m.vocab_size
    n = 2 * cfg.batch_photos * TOKENS_PER_CAPTION                  # real tokens per step
    activations = n * m.d_model * (m.n_layers * MEM_BLOCK_BYTES + MEM_TOKEN_BYTES)
    partials = len(rows.gemm_blocks(math.ceil(n))) + 1
    head = (partials * V * m.d_model + MEM_HEAD_CHUNKS * rows.GEMM_BLOCK * V) * 4
    head = head if cfg.objective == "next_token" else 0.0
    weights = 4 * 4 * (V * m.d_model + m.n_layers * (4 + 2 * m.mlp_ratio) * m.d_model ** 2)
    return MEM_MARGIN * (MEM_BASE_MB + (activations + head + weights + reference_mb(cfg, V)
                                        * 2**20) / 2**20)


def reference_mb(cfg, V):
    """What the reference layer set (ModelConfig.layers = "reference") holds beyond the fast
    one, MB, an upper bound (not measured): per block, attention on the padded (2B, T, D) grid
    with T = max_len (scores and probabilities (2B, H, T, T), the q | k | v grid (2B, T, 3D)
    and its gradient), and next_token's (n, V) logits, probabilities and dlogits at once."""
    m = cfg.model
    if m.layers != "reference":
        return 0.0
    B2, T, n = 2 * cfg.batch_photos, m.max_len, 2 * cfg.batch_photos * TOKENS_PER_CAPTION
    attention = m.n_layers * B2 * (2 * m.n_heads * T * T + 8 * T * m.d_model) * 4
    head = 3 * n * V * 4 if cfg.objective == "next_token" else 0.0
    return (attention + head) / 2**20


def mem_available_mb(meminfo="/proc/meminfo"):
    """MemAvailable of the machine, MB (Linux's estimate of what new processes can use without
    swapping), or None where /proc/meminfo does not say."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024                 # kB -> MB
    except (OSError, ValueError, IndexError):
        pass
    return None


def sysconf_mb(sysconf, pages):
    """os.sysconf(pages) x the page size, MB, or None where this platform has no such name."""
    try:
        return sysconf(pages) * sysconf("SC_PAGE_SIZE") / 2**20
    except (ValueError, OSError, TypeError):
        return None


def available_memory(meminfo="/proc/meminfo", sysconf=getattr(os, "sysconf", None)):
    """(MB new runs may use, where that number comes from) for --jobs: Linux's MemAvailable;
    else the free pages (os.sysconf SC_AVPHYS_PAGES: BSD, Solaris); else MEM_TOTAL_SHARE of
    the physical memory (SC_PHYS_PAGES: macOS, whose free pages leave out its file cache); else
    (None, None): not known (Windows, no os.sysconf), --jobs is not checked against memory."""
    found = mem_available_mb(meminfo)
    if found is not None:
        return found, "MemAvailable"
    if sysconf is not None:
        free = sysconf_mb(sysconf, "SC_AVPHYS_PAGES")
        if free is not None:
            return free, "free memory"
        total = sysconf_mb(sysconf, "SC_PHYS_PAGES")
        if total is not None:
            return MEM_TOTAL_SHARE * total, (f"{MEM_TOTAL_SHARE:.0%} of {total:,.0f} MB in "
                                             "all: what is free is not known here")
    return None, None


def check_jobs_fit(jobs, per_run_mb, available_mb):
    """Raise ValueError (one line: the count, the estimate, what is available) when `jobs`
    runs of per_run_mb each, plus MEM_SAFETY_MB, exceed available_mb (None: not checked)."""
    if available_mb is not None and jobs * per_run_mb + MEM_SAFETY_MB > available_mb:
        fit = max(0, int((available_mb - MEM_SAFETY_MB) // per_run_mb))
        raise ValueError(f"--jobs {jobs}: {jobs} runs need ~{jobs * per_run_mb:,.0f} MB "
                         f"(~{per_run_mb:,.0f} MB each, estimated) but this machine has "
                         f"{available_mb:,.0f} MB available (MemAvailable, {MEM_SAFETY_MB} MB "
                         f"kept free); use --jobs {max(1, fit)} or fewer")


def default_jobs(cores, per_run_mb, available_mb, runs):
    """The default --jobs: one run per core (one BLAS thread each: two runs side by side give
    more steps per second than one run on two threads), at most the runs of the grid, at most
    what fits in memory (check_jobs_fit), at least 1."""
    fit = cores if available_mb is None else int((available_mb - MEM_SAFETY_MB) // per_run_mb)
    return max(1, min(cores, runs, fit))


def threads_per_run(jobs, cores=None):
    """Cores each of `jobs` concurrent runs computes on: cores // jobs, at least 1."""
    return max(1, (cores or available_cores()) // jobs)


def split_cores(running, cores):
    """Cores for each of `running` runs in start order (oldest first), `cores` in all:
    cores // running each, the remainder one more each to the oldest, at least 1 each.
    E.g. 2 cores: [2], [1, 1], [1, 1, 1]; 5 cores, 3 runs: [2, 2, 1]."""
    if running == 0:
        return []
    share, extra = divmod(cores, running)
    return [max(1, share + (i < extra)) for i in range(running)]


def rebalance(running, cores):
    """Give the children `running` (processes from start(), oldest first) split_cores's
    shares of `cores`: each child's row pool takes its new size at its next operation.
    Called whenever a child starts or finishes. Returns the shares."""
    shares = split_cores(len(running), cores)
    for process, k in zip(running, shares):
        process.cores.value = k
    return shares


# ---------------------------------------------------------------- time
def makespan(durations, slots, busy=()):
    """Seconds until `durations` (run lengths, s, in the order they start) are done on `slots`
    parallel slots, each run starting on the first slot to free up (list scheduling); busy:
    seconds left on the slots still running something. 0.0 for nothing to do."""
    free = sorted(list(busy)[:slots]) + [0.0] * max(0, slots - len(busy))
    heapq.heapify(free)
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free, default=0.0) if durations or busy else 0.0


# ---------------------------------------------------------------- processes
class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt (sigterm_interrupts), so every
    clean-up written for Ctrl-C (locks, atomic writes, stop_all, multiprocessing's
    semaphores) runs for `kill`, `timeout` and Slurm too."""


def _ignore(signum, frame):
    """A signal that arrives while stopping: ignored. A Python function, not SIG_IGN: a
    signal already caught but not yet handled would otherwise print "Signal 15 ignored due to
    race condition" (timeout signals the command and then its group: twice)."""


def _terminate(signum, frame):
    """The parent's SIGTERM handler: the first one stops the command, later ones are ignored
    so that its clean-up runs to its end."""
    signal.signal(signal.SIGTERM, _ignore)
    raise Terminated


@contextlib.contextmanager
def sigterm_interrupts():
    """Within: SIGTERM raises Terminated in the main thread (where Python runs signal
    handlers; elsewhere nothing changes). The previous handler is restored on leaving."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt_once(signum, frame):
    """A child's SIGINT and SIGTERM handler: the first one stops the work, later ones (the
    parent's, a second Ctrl-C, the group's SIGTERM) are ignored so that the clean-up runs to
    its end."""
    for stop in STOP_SIGNALS:
        signal.signal(stop, _ignore)
    raise KeyboardInterrupt


def sigmask(how, signals=STOP_SIGNALS):
    """signal.pthread_sigmask(signal.SIG_<how>, signals) for how "BLOCK", "UNBLOCK" or
    "SETMASK"; returns the previous mask. Windows has no signal masks: nothing is done, so a
    Ctrl-C during a child's start is not held back there (docs/platforms.md)."""
    if not hasattr(signal, "pthread_sigmask"):
        return set()
    return signal.pthread_sigmask(getattr(signal, f"SIG_{how}"), signals)


def _child(target, args, threads, log_path, cores):
    """The body of a spawned child: output to log_path (appended; None: the parent's
    terminal), `threads` cores, then as many as the shared integer `cores` says (rows.follow;
    threads None: numpy's default, not followed), SIGINT once, then target(*args). Exit code:
    target's return value (an int) or 0, EXIT_INTERRUPTED after Ctrl-C or SIGTERM, 2 after
    OSError / ValueError (its message on the log's last line), EXIT_EXERCISE + N after exercise
    N's stub, 1 after anything else (traceback in the log)."""
    for stop in STOP_SIGNALS:
        signal.signal(stop, _interrupt_once)
    keep_freed_memory()                        # as python -m minialign does (machine.py)
    if log_path is not None:
        log = open(log_path, "a", buffering=1)
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
    try:
        sigmask("UNBLOCK")                          # a pending Ctrl-C: now
        if threads is not None:                 # None: numpy's own default (OPENBLAS_*)
            use_cores(threads)
            rows.follow(cores)                  # the parent's rebalance, between operations
        code = target(*args)
    except KeyboardInterrupt:
        if log_path is not None:            # on the terminal, the parent's line says it once
            print("interrupted", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except NotImplementedError as err:         # an exercise not done yet: its number
        number = stub_number(err)
        if number is None:
            raise
        sys.exit(EXIT_EXERCISE + number)
    sys.stdout.flush()
    sys.exit(code if isinstance(code, int) else 0)


def raise_unfinished(exitcodes):
    """Raise the NotImplementedError of exercise N's stub if one of the children's exit codes
    is EXIT_EXERCISE + N (exercises.stub_error); else nothing."""
    for code in exitcodes:
        if code is not None and EXIT_EXERCISE < code < EXIT_EXERCISE + 64:
            raise stub_error(code - EXIT_EXERCISE)


def start(target, args, threads, log_path, started):
    """Start target(*args) in a spawned child on `threads` cores (None: numpy's default, as
    the environment's OPENBLAS_NUM_THREADS says), append its multiprocessing.Process to the
    list `started` and return it; its `cores` attribute is the shared integer the child's
    core count follows (rebalance writes it). target: a module-level function (the child
    imports it).
    SIGINT and SIGTERM are blocked here until the child is in `started`, so a Ctrl-C at that
    moment reaches a parent that knows every child it must stop (stop_all(started))."""
    context = multiprocessing.get_context("spawn")
    cores = context.Value("i", threads or 0)                             # 0: not followed
    process = context.Process(target=_child, args=(target, args, threads, log_path, cores),
                              daemon=False)
    old = sigmask("BLOCK")                                            # inherited by the child
    try:
        process.start()
        process.cores = cores
        started.append(process)
    finally:
        sigmask("SETMASK", old)
    return process


def wait_any(processes, timeout=None):
    """Block until at least one of `processes` has exited (or timeout s); return those that
    have, joined (reaped). An empty list returns at once (poll() on no file would block)."""
    if not processes:
        return []
    ready = set(wait_sentinels([p.sentinel for p in processes], timeout))
    done = [p for p in processes if p.sentinel in ready]
    for p in done:
        p.join()                  # its sentinel closes at exit, a moment before it is reapable
    return done


def stop_all(processes, grace=STOP_GRACE_S):
    """Stop every live child cleanly: one SIGINT each, then wait up to `grace` s in all; a child
    still alive then gets SIGKILL (it ignores a SIGTERM once stopping). Their run directories
    stay resumable either way."""
    alive = [p for p in processes if p.exitcode is None]
    for p in alive:
        try:
            os.kill(p.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.exitcode is None:
            p.kill()
            p.join()
    return [p.exitcode for p in alive]


def log_tail(path, lines=1):
    """The last `lines` non-empty lines of a child's log, joined by ' | ' ('' if none)."""
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join([line.strip() for line in text if line.strip()][-lines:])
