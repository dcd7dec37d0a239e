"""One BLAS thread for the BLAS libraries that read their thread count only once, when numpy
loads them (Accelerate on macOS, MKL, BLIS): `python -m minialign` calls one_blas_thread before
anything imports numpy, so this module imports nothing of numpy's. OpenBLAS (numpy's wheels
on Linux, Windows and Intel Macs) is set by its own call instead (machine.use_cores), which
also works after numpy is loaded."""

# the variable each BLAS reads, by a word of the name numpy's build record gives it
ONE_THREAD_ENV = {"accelerate": "VECLIB_MAXIMUM_THREADS", "mkl": "MKL_NUM_THREADS",
                  "blis": "BLIS_NUM_THREADS"}
OWN_THREADS = ("export",)   # commands that run PyTorch, whose MKL and OpenMP threads they keep


def one_blas_thread(environ, argv):
    """Set each ONE_THREAD_ENV variable that is not set yet to "1" in `environ` (a value the
    user set is kept), unless the command argv[0] is one of OWN_THREADS. Returns the names set."""
    if argv[:1] and argv[0] in OWN_THREADS:
        return []
    missing = [name for name in ONE_THREAD_ENV.values() if name not in environ]
    environ.update({name: "1" for name in missing})
    return missing
