"""One process at a time per run (or results) directory: DirLock, with the platform's own lock.

    lock_backend()          "flock" (fcntl: Linux, macOS, BSD), "msvcrt" (Windows), else
                            "pidfile" (an O_EXCL file naming its holder)
    DirLock(directory)      acquire / release / check_free, or `with DirLock(out):`

A second process that tries a held directory gets DirLockedError, one line naming the directory
and the holder (pid, host, start time, command). A holder killed outright never blocks: flock
and msvcrt locks belong to the process and the OS drops them at its exit; a pid file whose
process is gone from this host is taken over.

The pid file (pidfile backend) is checked as far as this host allows (pidfile_verdict): its
second line records the holder's start time in clock ticks since boot (/proc/<pid>/stat, Linux),
so a live pid whose start time differs is another process that reused the pid: taken over, as is
a file naming the very process that asks. A holder that cannot be checked (an empty file, a live
pid with no start time to compare, another host) is refused in one line that names the lock
file and says it is safe to delete when no minialign runs there.
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
START_KEY = "process start ticks"    # the pid file's second line: "process start ticks N"
LOCK_BYTE = 2**20                    # msvcrt: the byte locked, past the holder's line (a range
#                                      Windows locks cannot be read by another process)
O_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation in the lock file


def command_line(limit=300):
    """This process's command as typed: "python -m minialign train ..." (not __main__.py)."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("minialign", "__main__.py")):
        argv = ["python -m minialign"] + argv[1:]
    line = " ".join(argv)
    return (line if len(line) <= limit else line[:limit - 3] + "...") or None


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


def holder_pid_host(holder):
    """(pid, host) of a lock file's line "pid N on HOST, ...", or (None, None)."""
    words = holder.split()
    if len(words) < 4 or words[0] != "pid" or not words[1].isdigit() or words[2] != "on":
        return None, None
    return int(words[1]), words[3].rstrip(",")


def process_start(pid):
    """Process `pid`'s start time in clock ticks since boot (field 22 of /proc/<pid>/stat:
    Linux), a string; None where there is no /proc or no such process. With the pid it
    names one process: a reused pid has a later start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()      # after "pid (comm)": fields 3, 4, ...
    return fields[22 - 3] if len(fields) > 22 - 3 else None


def process_command(pid, limit=80):
    """Process `pid`'s command line as /proc/<pid>/cmdline gives it (Linux), cut to `limit`
    characters; None where there is no /proc or no such process. Only said, never trusted:
    a minialign run from a user's own script need not name minialign."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return None
    return (line if len(line) <= limit else line[:limit - 3] + "...") or None


def pidfile_verdict(text):
    """What to do with an existing pid file's text: ("take", why) when no other minialign
    process can hold it (its pid is this process, or gone from this host, or alive with
    another start time than recorded: a reused pid); ("held", "") when its holder is
    verified running; ("unverified", why) when it cannot be checked from here."""
    lines = text.splitlines()
    holder = lines[0].strip() if lines else ""
    pid, host = holder_pid_host(holder)
    if pid is None:
        return "unverified", ("it is empty (a process killed while it started, or one starting "
                              "now)" if not holder else "it names no pid")
    if host != socket.gethostname():
        return "unverified", f"its process runs on {host}, which cannot be checked from here"
    if pid == os.getpid():
        return "take", "it names this very process"
    if not pid_alive(pid):
        return "take", "its process is gone"
    recorded = lines[1].split()[-1] if len(lines) > 1 and lines[1].startswith(START_KEY) else None
    now = process_start(pid)
    if recorded is None or now is None:
        command = process_command(pid)
        running = f" (running `{command}`)" if command else ""
        return "unverified", (f"pid {pid} is alive{running} and cannot be verified as the "
                              f"minialign process that wrote it (no start time "
                              f"{'recorded' if recorded is None else 'readable here'})")
    return ("held", "") if now == recorded else ("take", f"pid {pid} is another process now")


def read_holder(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode("utf-8", "replace").strip()


class DirLock:
    """An exclusive lock on a directory, held by this process until release() (or exit).

    The platform's own lock on directory/LOCK_FILE (lock_backend): fcntl.flock, or
    msvcrt.locking on Windows; the OS drops it when the holder exits in any way (Ctrl-C,
    SIGKILL, a crash), so a lock left by a dead process never blocks. Where neither exists,
    LOCK_FILE itself is the lock (created with O_EXCL, removed on release) and one that no
    other process holds is taken over (pidfile_verdict: its process gone from this host, its
    pid reused, or this very process). The file records the holder (pid, host, command, start
    time; for the pidfile, its start in clock ticks where /proc tells) for the refusal message.
    Raises DirLockedError naming the directory and the process that holds it.
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

    def refused_pidfile(self, text, verdict, why):
        """The pidfile backend's refusal: the lock file named; deleting it said to be safe
        when its holder cannot be verified (pidfile_verdict)."""
        holder = text.splitlines()[0].strip() if text.strip() else ""
        if verdict == "held":
            return DirLockedError(errno.EBUSY, f"{self.directory}: in use by another minialign "
                                  f"process ({holder}); wait for it to finish or stop it, then "
                                  f"rerun (its lock file: {self.path})")
        return DirLockedError(errno.EBUSY, f"{self.directory}: locked by {self.path}"
                              f"{f' ({holder})' if holder else ''}, but {why}; if no minialign "
                              f"process runs on this directory, it is safe to delete that file, "
                              f"then rerun")

    def open_pidfile(self):
        """The pidfile backend: LOCK_FILE created exclusively, after removing a stale one."""
        for attempt in range(2):
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_BINARY, 0o644)
            except FileExistsError:
                try:
                    text = self.path.read_bytes().decode("utf-8", "replace")
                except FileNotFoundError:
                    continue                         # released meanwhile: try again
                verdict, why = pidfile_verdict(text)
                if attempt or verdict != "take":
                    raise self.refused_pidfile(text, verdict, why) from None
                self.path.unlink(missing_ok=True)    # no other process holds it: stale
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
        start = process_start(os.getpid()) if self.backend == "pidfile" else None
        if start is not None:                          # what pidfile_verdict checks
            holder += f"\n{START_KEY} {start}\n"
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
