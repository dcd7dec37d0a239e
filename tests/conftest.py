"""Shared markers, the ../shared paths, a small captions file, and the local HTTP(S) server."""
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from minialign import model

POSIX_SIGNALS = pytest.mark.skipif(os.name == "nt", reason="sends POSIX signals, which Windows "
                                                           "does not have")
NEEDS_FAST_PATH = NEEDS_SOLUTIONS = pytest.mark.skipif(
    model.fast is None, reason="a student copy has no fast path and no solutions")
ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"                                   # beside the checkout
REAL_CAPTIONS = SHARED / "coco" / "captions_val2017.json"
BERT_VOCAB = SHARED / "tokenizers" / "bert-base-uncased-vocab.txt"


def shared(path):
    """path under ../shared, or a skip that says why."""
    if not path.is_file():
        pytest.skip(f"{path} not found (../shared is absent)")
    return path


def pytest_terminal_summary(terminalreporter, config):
    """After the exercise tests (`make grade` in a student copy): a row per exercise, "passed",
    "failed", "not started" (a test reached its stub) or "needs M" (exercise M's stub first)."""
    if not all("test_exercises" in arg for arg in config.args):
        return                                                    # the whole suite: no rows
    titles = dict(m.split(": ", 1) for m in config.getini("markers") if m.startswith("exercise"))
    rows = {}
    for outcome in ("passed", "failed", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            mark = next((k for k in report.keywords if k in titles), None)
            stub = re.search(r"NotImplementedError: exercise (\d+):", str(report.longrepr))
            if mark and rows.get(mark, "passed") == "passed":
                rows[mark] = ("passed" if outcome == "passed" else "failed" if not stub else
                              "not started" if stub[1] == mark[8:] else f"needs {stub[1]}")
    for mark in sorted(rows, key=lambda m: int(m[8:])):
        terminalreporter.write_line(f"{mark[8:]:>3}  {titles[mark]:<42} {rows[mark]}")


@pytest.fixture
def real_captions_path():
    return shared(REAL_CAPTIONS)


WORDS = (("red", "blue", "green", "yellow", "black", "white"),     # a colour, a thing, a place
         ("dog", "cat", "car", "bike", "horse", "bus", "kite", "boat"),
         ("park", "street", "beach", "kitchen", "field"))
TEMPLATES = ("a {c} {t} in the {p}", "there is a {c} {t} at the {p}", "the {p} with a {c} {t}",
             "A {t} , {c} , in a {p} .", "one {c} {t} near the {p}")


def write_captions(path, n_photos=120, seed=0):
    """A COCO captions JSON of n_photos made-up photos, five captions each sharing a colour, a
    thing and a place: small enough to train on in a second."""
    rng = np.random.default_rng(seed)
    scenes = [[w[rng.integers(len(w))] for w in WORDS] for _ in range(n_photos)]
    Path(path).write_text(json.dumps({"annotations": [
        {"id": 10 * p + k, "image_id": 3 * p + 7, "caption": t.format(c=c, t=th, p=pl)}
        for p, (c, th, pl) in enumerate(scenes) for k, t in enumerate(TEMPLATES)]}))
    return Path(path)


@pytest.fixture(scope="session")
def captions(tmp_path_factory):
    """The path of write_captions' file (120 photos: 72 train, 24 val, 24 test)."""
    return write_captions(tmp_path_factory.mktemp("captions") / "captions.json")


@pytest.fixture
def server():
    """A local HTTP server (tests/localhttp.py: .files, .url, .requests, .redirects)."""
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
    """`server` over HTTPS: trusted by a client only if SSL_CERT_FILE is tls_cert[0]."""
    from localhttp import serve
    with serve(tls_cert) as srv:
        yield srv
