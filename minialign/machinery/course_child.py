"""The class grader's child (course.py): `python -I -S course_child.py SCRATCH NUMPY_DIR` calls
one function of a student's copy on the inputs in SCRATCH/job.pkl and writes what it returned,
and its inputs after the call, to SCRATCH/out.npz; it judges nothing. Before the copy's code is
imported it limits CPU time, memory, file sizes and processes, and on Linux (Landlock) gives up
reading or writing any file but the copy's, Python's, numpy's and the scratch folder's."""
import os
import pickle
import struct
import sys
import traceback

if __name__ == "__main__":
    sys.path.append(sys.argv[2])                 # numpy's folder (-S: no site-packages)
import numpy as np                               # noqa: E402

MEMORY = 2 << 30                                 # bytes of address space
FILE_SIZE = 64 << 20                             # bytes in any one file written
READ = 0b1101                                    # Landlock: execute, read files, read folders
ALL = (1 << 13) - 1                              # Landlock ABI 1: every file-system right


def flatten(x, key=""):
    """Nested dicts, tuples and lists of arrays as {"key/part": array}: what the grader compares.
    A Generator is left out (its draws show in the outputs); anything else not numeric is
    kept as its type's name."""
    if isinstance(x, (dict, tuple, list)):
        parts = x.items() if isinstance(x, dict) else enumerate(x)
        return {k: v for part, y in parts for k, v in flatten(y, f"{key}/{part}").items()}
    if isinstance(x, np.random.Generator):
        return {}
    a = np.asarray(x)
    return {key: np.array(f"a {type(x).__name__}") if a.dtype.hasobject else a}


def call(function, args, key):
    """function(*args), flattened as {key/out/...}, and the inputs after the call as
    {key/args/...}: each input array as the caller holds it (so updating in place is seen,
    and rebinding a dict's entry is not mistaken for it), other values as the dicts hold them."""
    before = flatten(args, f"{key}/args")
    out = flatten(function(*args), f"{key}/out")
    return {**out, **flatten(args, f"{key}/args"), **{k: v for k, v in before.items() if v.ndim}}


def landlock_abi():
    """The kernel's Landlock version: 0 where it has none (not Linux, or before 5.13)."""
    if not sys.platform.startswith("linux"):
        return 0
    import ctypes
    return max(0, ctypes.CDLL(None).syscall(444, None, 0, 1))    # ..._CREATE_RULESET_VERSION


def landlock(readable, writable):
    """From now on this process and every process it starts may read only under `readable`,
    write only under `writable` and (Linux >= 6.7) open no TCP connection (Linux >= 5.13; the
    syscalls are 444-446 on every architecture). Returns False where the kernel has none."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    attr = struct.pack("=QQ", ALL, 0b11) if landlock_abi() >= 4 else struct.pack("=Q", ALL)
    ruleset = libc.syscall(444, attr, len(attr), 0)               # landlock_create_ruleset
    if ruleset < 0:
        return False
    for paths, rights in ((readable, READ), (writable, ALL)):
        for path in paths:
            fd = os.open(path, os.O_PATH)
            libc.syscall(445, ruleset, 1, struct.pack("=Qi", rights, fd), 0)  # path beneath
            os.close(fd)
    libc.prctl(38, 1, 0, 0, 0)                   # PR_SET_NO_NEW_PRIVS, which Landlock needs
    return libc.syscall(446, ruleset, 0) == 0    # landlock_restrict_self


def main(scratch):
    with open(os.path.join(scratch, "job.pkl"), "rb") as f:
        job = pickle.load(f)                     # {copy, module, function, cases, readable}
    if sys.platform != "win32":
        import resource
        for limit, value in ((resource.RLIMIT_AS, MEMORY), (resource.RLIMIT_FSIZE, FILE_SIZE),
                             (resource.RLIMIT_CPU, job["cpu_seconds"]),
                             (resource.RLIMIT_NPROC, 0)):      # starts no process (not as root)
            try:
                resource.setrlimit(limit, (value, value))
            except (ValueError, OSError):        # a limit this OS does not offer (macOS: AS)
                pass
    if sys.platform.startswith("linux"):
        landlock([job["copy"], *job["readable"]], [scratch])
    sys.path.insert(0, job["copy"])
    results = {}
    try:
        function = getattr(__import__(job["module"], fromlist=["_"]), job["function"])
        for i, args in enumerate(job["cases"]):
            results.update(call(function, args, i))
    except BaseException as e:                   # noqa: BLE001 (the grader says what it was)
        message = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        in_copy = [f"{os.path.relpath(f.filename, job['copy'])}:{f.lineno}"  # minialign/x.py:52
                   for f in traceback.extract_tb(e.__traceback__)
                   if os.path.abspath(f.filename).startswith(job["copy"] + os.sep)]
        results = {"error": np.array(message + (f" (at {in_copy[-1]})" if in_copy else ""))}
    np.savez(os.path.join(scratch, "out.npz"), **results)
    os._exit(0)                                  # no atexit handler of the student's runs


if __name__ == "__main__":
    main(sys.argv[1])
