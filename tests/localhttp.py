"""A local HTTP(S) server on 127.0.0.1 for the download tests (no internet needed).

Paths are test knobs: /files/NAME serves .files[NAME] (a Range request gets 206 and the rest),
/cut-once/NAME sends half of it then closes on its first request, /cut-always/NAME always does,
/flaky/NAME answers 500 twice then serves; a path in .redirects answers 302 to its URL; anything
else is 404. .requests records (path, Range header).
"""
import contextlib
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        srv = self.server
        with srv.lock:
            srv.requests.append((self.path, self.headers.get("Range")))
            seen = sum(path == self.path for path, _ in srv.requests)
        if self.path in srv.redirects:
            return self.reply(302, b"", {"Location": srv.redirects[self.path]})
        knob, _, name = self.path.strip("/").partition("/")
        data = srv.files.get(name)
        if data is None or knob not in ("files", "cut-once", "cut-always", "flaky"):
            return self.reply(404, b"not found")
        if knob == "flaky" and seen <= 2:
            return self.reply(500, b"try later")
        start = int(self.headers.get("Range", "bytes=0-")[6:].rstrip("-"))
        if start >= len(data) > 0:
            return self.reply(416, b"", {"Content-Range": f"bytes */{len(data)}"})
        extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
        cut = knob == "cut-always" or (knob == "cut-once" and seen == 1)
        self.reply(206 if start else 200, data[start:], extra,
                   send=(len(data) - start) // 2 if cut else None)

    def reply(self, status, body, headers=None, send=None):
        """Headers promising len(body) bytes, then the first `send` of them (all: None)."""
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body[:send])               # HTTP/1.0: then the connection closes


@contextlib.contextmanager
def serve(cert=None):
    """A server on a free port: .url, .files {name: bytes}, .requests, .redirects {path: URL}.
    cert: (certificate file, key file) to serve HTTPS."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.files, srv.requests, srv.redirects, srv.lock = {}, [], {}, threading.Lock()
    srv.url = f"http{'s' if cert else ''}://127.0.0.1:{srv.server_address[1]}"
    if cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*cert)
        srv.socket = context.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def self_signed_cert(folder):
    """(certificate, key) files for 127.0.0.1 made by the `openssl` command, or None if it
    cannot. A client trusts it only when told to (SSL_CERT_FILE)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                       capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return cert, key
