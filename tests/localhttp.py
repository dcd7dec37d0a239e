"""A local HTTP server on 127.0.0.1 for the download tests (no internet needed).

The server's paths are test knobs: /files/NAME serves a file (with Range -> 206), /cut-once/NAME
sends half of it then closes on the first request only, /cut-always/NAME always does, /flaky/NAME
answers 500 twice then serves, /stall-once/NAME says nothing for 0.5 s on the first request,
/norange/NAME ignores Range (200), /html/NAME is an HTML error page with status 200,
/other-once/NAME serves NAME.other on the first request and NAME after, a path in .redirects
answers 302 with that Location, anything else is 404.
Every request is recorded with its Range header. tests/conftest.py's `server` fixture starts
one per test; `tls_server` one over HTTPS, with a self-signed certificate made for the test.
"""
import contextlib
import hashlib
import io
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image

TINY_BACKOFF = 0.01   # seconds: retries in tests wait 0.01, 0.02, 0.04, ...
STALL_SECONDS = 0.5   # /stall-once/ answers this late, after a client timeout of 0.2 s


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):          # keep pytest's output clean
        pass

    def do_GET(self):
        server = self.server
        with server.lock:
            server.requests.append((self.path, self.headers.get("Range")))
            server.active += 1
            server.max_active = max(server.max_active, server.active)
            seen = sum(path == self.path for path, _ in server.requests)
        try:
            time.sleep(server.delay)
            self.answer(seen)
        finally:
            with server.lock:
                server.active -= 1

    def answer(self, seen):
        if self.path in self.server.redirects:
            return self.reply(302, b"moved", "text/plain",
                              {"Location": self.server.redirects[self.path]})
        knob, _, name = self.path.strip("/").partition("/")
        data = self.server.files.get(name)
        if knob == "other-once" and seen == 1:
            data = self.server.files.get(name + ".other")
        if data is None or knob not in ("files", "cut-once", "cut-always", "flaky", "norange",
                                        "html", "stall-once", "other-once"):
            return self.reply(404, b"not found", "text/plain")
        if knob == "html":
            return self.reply(200, b"<html><body>Service unavailable</body></html>", "text/html")
        if knob == "stall-once" and seen == 1:
            time.sleep(STALL_SECONDS)                   # the client has given up by now
            return None
        if knob == "flaky" and seen <= 2:
            return self.reply(500, b"try later", "text/plain")
        start = 0
        ranged = self.headers.get("Range")
        if ranged and knob != "norange":
            start = int(ranged.removeprefix("bytes=").rstrip("-"))
            if start >= len(data):
                return self.reply(416, b"", "text/plain",
                                  {"Content-Range": f"bytes */{len(data)}"})
        body = data[start:]
        extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
        if knob == "cut-always" or (knob == "cut-once" and seen == 1):
            return self.reply(206 if start else 200, body, "application/octet-stream", extra,
                              send=len(body) // 2)
        self.reply(206 if start else 200, body, "image/jpeg", extra)

    def reply(self, status, body, content_type, headers=(), send=None):
        """Send status and headers promising len(body) bytes, then the first `send` of them."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in dict(headers).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body[:send])
        self.close_connection = True


@contextlib.contextmanager
def serve(cert=None):
    """A ThreadingHTTPServer on a free port: .files {name: bytes}, .requests [(path, Range)],
    .redirects {path: URL to answer 302 with}, .max_active (most requests in flight at once),
    .delay (seconds before each answer).
    cert: (certificate file, key file) to serve HTTPS instead of HTTP."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.files, srv.requests, srv.redirects, srv.lock = {}, [], {}, threading.Lock()
    srv.active = srv.max_active = 0
    srv.delay = 0.0
    srv.url = f"http{'s' if cert else ''}://127.0.0.1:{srv.server_address[1]}"
    srv.cert = cert[0] if cert else None              # for SSL_CERT_FILE
    if cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*cert)
        srv.socket = context.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join()


def self_signed_cert(folder):
    """(certificate, key) files for 127.0.0.1, made by the `openssl` command; None if it fails
    (no openssl). A client trusts it only when told to (SSL_CERT_FILE)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                       capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return cert, key


def random_bytes(n, seed=0):
    return np.random.default_rng(seed).bytes(n)


def jpeg_bytes(width, height, seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def sha256(data):
    return hashlib.sha256(data).hexdigest()
