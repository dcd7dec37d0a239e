import os
import sys
from pathlib import Path

import pytest

from minialign.machinery import fastpath
from minialign.machinery.run.blasenv import one_blas_thread

# Before any test imports numpy: its BLAS on one thread, as `python -m minialign` sets it
# (blasenv.py), so a bit-identity test of the same code on 1, 2 or 3 pool threads holds on
# Accelerate, MKL and BLIS too (OpenBLAS: machine.use_cores).
one_blas_thread(os.environ, [])

# a test that signals another process as a terminal, `kill` or `timeout` does (SIGINT, SIGTERM
# to a process or its group): Windows has no such signals (docs/platforms.md)
POSIX_SIGNALS = pytest.mark.skipif(os.name == "nt", reason="sends POSIX signals, which Windows "
                                                           "does not have")
# a test of the fast path (minialign/machinery/fastpath/), or of numbers recorded on it: a
# student copy has none (docs/course.md, "What the student copy holds")
NEEDS_FAST_PATH = pytest.mark.skipif(not fastpath.PRESENT, reason="a student copy has no fast "
                                     "path (docs/course.md, What the student copy holds)")
SHARED_COCO = Path(__file__).resolve().parents[1].parent / "shared" / "coco"  # beside the checkout
REAL_CAPTIONS = SHARED_COCO / "captions_val2017.json"


@pytest.fixture
def real_captions_path():
    """The real COCO val2017 captions beside the checkout, or a skip that says why."""
    if not REAL_CAPTIONS.exists():
        pytest.skip(f"real COCO captions not found at {REAL_CAPTIONS} (../shared is absent)")
    return REAL_CAPTIONS


@pytest.fixture
def server():
    """A local HTTP server (tests/localhttp.py): .files {name: bytes} to serve, .url, .requests
    [(path, Range header)], .max_active, .delay."""
    from localhttp import serve
    with serve() as srv:
        yield srv


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory):
    """A self-signed (certificate, key) for 127.0.0.1, or a skip that says why."""
    from localhttp import self_signed_cert
    cert = self_signed_cert(tmp_path_factory.mktemp("tls"))
    if cert is None:
        pytest.skip("cannot make a self-signed certificate (no working `openssl` command)")
    return cert


@pytest.fixture
def tls_server(tls_cert):
    """The `server` fixture over HTTPS (.url https://127.0.0.1:PORT); clients do not trust
    its certificate unless a test sets SSL_CERT_FILE to tls_cert[0]."""
    from localhttp import serve
    with serve(tls_cert) as srv:
        yield srv


def pytest_terminal_summary(terminalreporter):
    """Which comparison the reference tests made (exact or to a tolerance), when they ran."""
    reference = sys.modules.get("test_reference")
    if reference is not None and terminalreporter.stats.get("passed", []) + \
            terminalreporter.stats.get("failed", []):
        terminalreporter.write_line(reference.comparison()[1])
