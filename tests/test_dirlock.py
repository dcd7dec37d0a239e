"""Tests for minialign.machinery.run.dirlock: each lock backend refuses a second process, names the
holder, and never lets a dead holder block. flock runs here as itself; Windows' msvcrt.locking
is stood in for by POSIX record locks with its contract (a lock from the file position, EACCES
when held); the pidfile backend (neither fcntl nor msvcrt) runs as itself.
(The same lock with fcntl hidden, in `train`: test_platforms.py; in a real run: test_faults.py.)"""
import errno
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    import fcntl
except ImportError:                    # Windows: its own msvcrt, no flock
    fcntl = None

from minialign.machinery.run import dirlock
from minialign.machinery.run.dirlock import LOCK_FILE, DirLock, DirLockedError

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = [pytest.param("flock", marks=pytest.mark.skipif(fcntl is None, reason="no fcntl")),
            "msvcrt",                                  # Windows' own, elsewhere FakeMsvcrt
            pytest.param("pidfile", marks=pytest.mark.skipif(
                os.name == "nt", reason="pid liveness is not checked on Windows"))]


class FakeMsvcrt:
    """msvcrt.locking's contract on POSIX record locks (per process, like Windows' locks):
    locks `nbytes` from the file's current position; LK_NBLCK fails with EACCES when held."""
    LK_UNLCK, LK_NBLCK = 0, 2

    @staticmethod
    def locking(fd, mode, nbytes):
        start = os.lseek(fd, 0, os.SEEK_CUR)
        if mode == FakeMsvcrt.LK_UNLCK:
            fcntl.lockf(fd, fcntl.LOCK_UN, nbytes, start)
            return
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, nbytes, start)
        except OSError:
            raise PermissionError(errno.EACCES, "Permission denied") from None


HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[3])
from minialign.machinery.run import dirlock
from test_dirlock import FakeMsvcrt
dirlock.msvcrt = dirlock.msvcrt or FakeMsvcrt
lock = dirlock.DirLock(sys.argv[1], backend=sys.argv[2]).acquire()
print("locked", flush=True)
time.sleep(60)
"""


def hold(directory, backend):
    """A process holding `directory` with `backend`, started and locked."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), backend,
                               str(ROOT / "tests")], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_process_is_refused_and_a_killed_holder_never_blocks(backend, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setattr(dirlock, "msvcrt", dirlock.msvcrt or FakeMsvcrt)
    holder = hold(tmp_path / "run", backend)
    try:
        with pytest.raises(DirLockedError) as err:
            DirLock(tmp_path / "run", backend=backend).acquire()
        message = str(err.value)
        assert message.startswith(f"{tmp_path / 'run'}: in use by another minialign process "
                                  f"(pid {holder.pid} on {socket.gethostname()}, started ")
        assert "\n" not in message and message.endswith(
            f"then rerun (its lock file: {tmp_path / 'run' / LOCK_FILE})" if backend == "pidfile"
            else "then rerun")
    finally:
        holder.kill()                                 # SIGKILL: no clean-up of any kind
        holder.wait()
    with DirLock(tmp_path / "run", backend=backend) as lock:      # the dead holder's lock
        assert f"pid {os.getpid()} " in (tmp_path / "run" / LOCK_FILE).read_text()
        assert lock.fd is not None
    assert (tmp_path / "run" / LOCK_FILE).exists() == (backend != "pidfile")


def test_the_backend_is_chosen_by_what_the_platform_has(monkeypatch):
    assert dirlock.lock_backend() == ("msvcrt" if os.name == "nt" else "flock")
    monkeypatch.setattr(dirlock, "fcntl", None)
    monkeypatch.setattr(dirlock, "msvcrt", FakeMsvcrt)
    assert dirlock.lock_backend() == "msvcrt"                    # Windows
    monkeypatch.setattr(dirlock, "msvcrt", None)
    assert dirlock.lock_backend() == "pidfile"                   # neither
    assert DirLock("x").backend == "pidfile"


def started(args):
    """A process of `args`, once its command line is readable (/proc: empty just after the
    fork), or at once where there is no /proc."""
    process = subprocess.Popen(args)
    for _ in range(500):
        if not os.path.isdir("/proc") or dirlock.process_command(process.pid):
            break
        time.sleep(0.01)
    return process


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


STARTED = "started 2026-01-01 00:00:00: python -m minialign train"
SAFE = ("; if no minialign process runs on this directory, it is safe to delete that file, "
        "then rerun")


@pytest.mark.skipif(os.name == "nt", reason="pid liveness is not checked on Windows")
@pytest.mark.parametrize("line, refusal", [
    ("pid {dead} on {host}, " + STARTED, None),                     # gone: taken over
    ("pid {me} on {host}, " + STARTED, None),                       # this very process
    ("pid {alive} on {host}, " + STARTED + "\nprocess start ticks 1", None),   # a reused pid
    ("pid {alive} on {host}, " + STARTED + "\nprocess start ticks {ticks}",
     "{dir}: in use by another minialign process (pid {alive} on {host}, " + STARTED +
     "); wait for it to finish or stop it, then rerun (its lock file: {lock})"),
    ("pid {alive} on {host}, " + STARTED,                           # no start time to compare
     "{dir}: locked by {lock} (pid {alive} on {host}, " + STARTED + "), but pid {alive} is "
     "alive{running} and cannot be verified as the minialign process that wrote it (no start time "
     "recorded)" + SAFE),
    ("pid {dead} on another-host, " + STARTED,
     "{dir}: locked by {lock} (pid {dead} on another-host, " + STARTED + "), but its process "
     "runs on another-host, which cannot be checked from here" + SAFE),
    ("", "{dir}: locked by {lock}, but it is empty (a process killed while it started, or one "
     "starting now)" + SAFE),
])
def test_a_pid_file_is_taken_over_only_when_no_other_process_can_hold_it(line, refusal,
                                                                         tmp_path):
    """Taken over: a pid gone from this host, this very process, a live pid that started at
    another time than recorded (reused). Refused, naming the lock file: a verified holder;
    and, saying that deleting it is safe when no minialign runs, one that cannot be checked."""
    alive = started([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = dirlock.process_start(alive.pid)
        if ticks is None and "process start ticks" in line:
            pytest.skip("no /proc/<pid>/stat here: a process's start time is not known")
        command = dirlock.process_command(alive.pid)                 # None without /proc
        running = f" (running `{command}`)" if command else ""
        names = dict(dead=dead_pid(), me=os.getpid(), alive=alive.pid, ticks=ticks,
                     running=running, host=socket.gethostname(), dir=tmp_path,
                     lock=tmp_path / LOCK_FILE)
        (tmp_path / LOCK_FILE).write_text(line.format(**names))
        lock = DirLock(tmp_path, backend="pidfile")
        if refusal is None:
            lock.acquire()
            mine = (tmp_path / LOCK_FILE).read_text().splitlines()
            assert mine[0].startswith(f"pid {os.getpid()} on {socket.gethostname()}, started ")
            start = dirlock.process_start(os.getpid())               # None without /proc
            assert mine[1:] == ([] if start is None else [f"process start ticks {start}"])
            lock.release()
            assert not (tmp_path / LOCK_FILE).exists()
        else:
            with pytest.raises(DirLockedError) as err:
                lock.acquire()
            assert str(err.value) == refusal.format(**names)
            assert (tmp_path / LOCK_FILE).read_text() == line.format(**names)   # left as it was
    finally:
        alive.kill()
        alive.wait()


def test_check_free_leaves_no_pid_file_behind(tmp_path):
    DirLock(tmp_path, backend="pidfile").check_free()            # nothing there: nothing made
    assert not (tmp_path / LOCK_FILE).exists()
    with DirLock(tmp_path, backend="pidfile"):
        pass
    DirLock(tmp_path, backend="pidfile").check_free()
    assert list(tmp_path.iterdir()) == []
