"""Independent runs side by side: each in its own process with its share of the cores, and the
grid's time on N slots (the memory check that refuses a --jobs count the machine cannot hold:
memory.py; its names are also jobs.X).

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
from ..run.machine import keep_freed_memory, use_cores
# memory's names, also as jobs.X (the memory check was this module's before #28)
from .memory import (MEM_BASE_MB, MEM_BLOCK_BYTES, MEM_HEAD_CHUNKS, MEM_MARGIN,  # noqa: F401
                     MEM_SAFETY_MB, MEM_TOKEN_BYTES, MEM_TOTAL_SHARE, TOKENS_PER_CAPTION,
                     available_memory, check_jobs_fit, default_jobs, mem_available_mb,
                     reference_mb, run_memory_mb, sysconf_mb, threads_per_run)

EXIT_INTERRUPTED = 130     # a child stopped by Ctrl-C (as `python -m minialign`)
EXIT_EXERCISE = 64         # + N: a child reached exercise N's stub (N < 64)
STOP_GRACE_S = 60          # seconds a child may take to stop after SIGINT before SIGKILL
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}    # Ctrl-C; kill, timeout, Slurm


# ---------------------------------------------------------------- cores
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
