"""One writer per run: run directories locked for a read-modify-write, or waited for.

    with hold(run_dirs, wait=False): ...    each directory's dirlock.DirLock, sorted order

Every command that writes into a run directory holds that run's lock while it reads and
rewrites the run's files: train for the whole run (checkpoint.open_run), and here evaluate,
replicate's scoring and report's rescoring. So metrics.json is always rewritten from its
current contents, never from a copy another process has since made stale. A second writer is
refused with DirLock's one line, or (wait=True: --wait) waits for the holder to finish,
saying so once. Locks are taken in sorted order: two commands waiting for each other's runs
cannot each hold one.
"""
import contextlib
import sys
import time
from pathlib import Path

from .dirlock import DirLock, DirLockedError

WAIT_POLL_S = 1.0          # how often a waiting writer tries the lock again


def acquire(lock, wait, tag, poll=WAIT_POLL_S):
    """lock.acquire(); with wait, again every `poll` s while another process holds it (one
    line on stderr when the wait begins). Raises DirLockedError without wait."""
    said = False
    while True:
        try:
            return lock.acquire()
        except DirLockedError as err:
            if not wait:
                raise
            if not said:
                print(f"{tag} {err}: waiting for it (--wait)".lstrip(), file=sys.stderr,
                      flush=True)
                said = True
            time.sleep(poll)


@contextlib.contextmanager
def hold(directories, wait=False, tag="", poll=WAIT_POLL_S):
    """Hold the DirLock of every directory of `directories` (each once, in sorted order)
    within; all are released on leaving, however it is left. wait: wait for a lock another
    process holds instead of raising dirlock.DirLockedError; tag: the command's, e.g.
    "[replicate]", for the waiting line."""
    locks = []
    try:
        for directory in sorted({Path(d) for d in directories}, key=str):
            locks.append(acquire(DirLock(directory), wait, tag, poll))
        yield
    finally:
        for lock in reversed(locks):
            lock.release()
