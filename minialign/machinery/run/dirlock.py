"""One process at a time per run (or results) directory: DirLock, with the platform's own lock.

    lock_backend()          "flock" (fcntl: Linux, macOS, BSD), "msvcrt" (Windows), else
                            "pidfile" (an O_EXCL file naming its holder)
    DirLock(directory)      acquire / release / check_free, or `with DirLock(out):`

A second process that tries a held directory gets DirLockedError, one line naming the directory
and the holder (pid, host, start time, command). A holder killed outright never blocks: flock
and msvcrt locks belong to the process and the OS drops them at its exit; a pid file whose
process is gone from this host is taken over.
"""
import errno
import os
import socket
import sys
import time
from pathlib import Path

from .files import FileError

try:                        # the lock's mechanism: flock on Linux, macOS and the BSDs ...
    import fcntl
except ImportError:
    fcntl = None
try:                        # ... msvcrt.locking on Windows (lock_backend picks one)
    import msvcrt
except ImportError:
    msvcrt = None

LOCK_FILE = ".lock"                  # DirLock's file inside the locked directory
LOCK_BYTE = 2**20                    # msvcrt: the byte locked, past the holder's line (a range
#                                      Windows locks cannot be read by another process)
O_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation in the lock file


def command_line(limit=300):
    """This process's command as typed: "python -m minialign train ..." (not __main__.py)."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("minialign", "__main__.py")):
        argv = ["python -m minialign"] + argv[1:]
    line = " ".join(argv)
    return line if len(line) <= limit else line[:limit - 3] + "..."


class DirLockedError(FileError):
    """Another live process holds the directory's lock."""


def lock_backend():
    """DirLock's mechanism on this platform: "flock" (fcntl: Linux, macOS, BSD), "msvcrt"
    (Windows), else "pidfile" (an O_EXCL file naming its holder; stale once that pid is gone)."""
    return "flock" if fcntl is not None else "msvcrt" if msvcrt is not None else "pidfile"


def try_lock(fd, backend):
    """Take the lock on open file `fd` without waiting: True, or False when another process
    holds it. flock and msvcrt locks belong to the process: the OS drops them at its exit."""
    try:
        if backend == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            os.lseek(fd, LOCK_BYTE, os.SEEK_SET)       # msvcrt locks from the file position
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError as err:
        if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):
            raise
        return False
    return True


def unlock(fd, backend):
    if backend == "flock":
        fcntl.flock(fd, fcntl.LOCK_UN)
    elif backend == "msvcrt":
        os.lseek(fd, LOCK_BYTE, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def pid_alive(pid):
    """Whether process `pid` exists on this machine (os.kill(pid, 0)); True when it cannot
    tell, so that a lock is never taken from a process that may be running. On Windows
    os.kill(pid, 0) would send Ctrl-C (signal 0 is CTRL_C_EVENT there): it is never called."""
    if os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, AttributeError, ValueError, OverflowError):
        return True
    return True


def holder_gone(holder):
    """Whether a lock file's line "pid N on HOST, ..." names a process of this host that no
    longer runs (the pidfile backend's stale lock). A line without one (not yet written, or
    unreadable) or another host's: False, never taken over."""
    words = holder.split()
    if len(words) < 4 or words[0] != "pid" or not words[1].isdigit() or words[2] != "on":
        return False
    return words[3].rstrip(",") == socket.gethostname() and not pid_alive(int(words[1]))


def read_holder(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode("utf-8", "replace").strip()


class DirLock:
    """An exclusive lock on a directory, held by this process until release() (or exit).

    The platform's own lock on directory/LOCK_FILE (lock_backend): fcntl.flock, or
    msvcrt.locking on Windows; the OS drops it when the holder exits in any way (Ctrl-C,
    SIGKILL, a crash), so a lock left by a dead process never blocks. Where neither exists,
    LOCK_FILE itself is the lock (created with O_EXCL, removed on release) and one left by a
    process of this host that is gone is taken over (a reused pid would still block: remove
    the file by hand). The file records the holder (pid, host, command, start time) for the
    refusal message. Raises DirLockedError naming the directory and the process that holds it.
    backend: lock_backend()'s name, None for this platform's (tests pick another)."""

    def __init__(self, directory, backend=None):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.backend = backend or lock_backend()
        self.fd = None

    def refused(self, holder):
        return DirLockedError(errno.EBUSY, f"{self.directory}: in use by another minialign "
                              f"process ({holder or 'unknown'}); wait for it to finish or stop "
                              f"it, then rerun")

    def open_pidfile(self):
        """The pidfile backend: LOCK_FILE created exclusively, after removing a stale one."""
        for attempt in range(2):
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_BINARY, 0o644)
            except FileExistsError:
                try:
                    holder = self.path.read_bytes().decode("utf-8", "replace").strip()
                except FileNotFoundError:
                    continue                         # released meanwhile: try again
                if attempt or not holder_gone(holder):
                    raise self.refused(holder) from None
                self.path.unlink(missing_ok=True)    # its process is gone: a stale lock
        raise self.refused("")

    def acquire(self):
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.backend == "pidfile":
            fd = self.open_pidfile()
        else:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | O_BINARY, 0o644)
            if not try_lock(fd, self.backend):
                holder = read_holder(fd)
                os.close(fd)
                raise self.refused(holder)
        holder = (f"pid {os.getpid()} on {socket.gethostname()}, started "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {command_line()}")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, holder.encode())
        self.fd = fd
        return self

    def check_free(self):
        """Raise DirLockedError if another process holds the lock now; never creates it."""
        if self.path.is_file():
            self.acquire()
            self.release()

    def release(self):
        if self.fd is not None:
            if self.backend == "pidfile":
                self.path.unlink(missing_ok=True)
            unlock(self.fd, self.backend)
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
