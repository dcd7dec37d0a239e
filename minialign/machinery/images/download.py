"""Fetching files over HTTPS: resumable, verified, retried (standard library only).

    download(url, dest)              one file: bytes go to dest + ".part", resumed with a Range
                                     request after a cut, checked (size, sha256), then renamed
    refuse_http(flag, url, allow)    the commands' rule: no plain http:// URL without --allow-http
    (photos.fetch_images uses it for the subset's photos, many at a time)

urllib checks an https:// server's certificate and host name against the system's CA
certificates (ssl.create_default_context), so a failed check is an error, never a warning.
It also follows redirects silently, to http:// as readily as to https://, so every hop is
checked here (_HttpsRedirects): from an https:// URL, a redirect to anything but https:// is
refused, in one line naming both URLs and --allow-http, before its bytes are asked for; with
allow_http a redirect to http:// is followed and said (reporter.redirected).

A file at `dest` is always complete: a transfer writes only the ".part" file beside it, which is
flushed to disk and renamed onto `dest` once its size and checksum match. A cut transfer keeps
its bytes in the ".part" file, and the next try (or the next run) asks the server for the rest
("Range: bytes=N-"). Connection errors, cut transfers, HTTP 5xx and 429 are retried after
backoff * 2**k seconds (k = 0, 1, ...); any other HTTP 4xx fails at once. Every error is one line
that starts with the URL (or the image record) and says what to do.
"""
import http.client
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tqdm import tqdm

from .embeddings import sha256_file
from ..run.files import FileError, fsync_dir

PART_SUFFIX = ".part"                 # dest + PART_SUFFIX holds the bytes of an unfinished download
CHUNK_BYTES = 64 * 1024               # bytes read from the socket (and written) at a time
USER_AGENT = "minialign-download/1"   # some servers refuse requests without a User-Agent
PLAIN_PROGRESS_LINES = 10             # without a terminal: about one line per 10%
MB = 1e6                              # progress lines count decimal megabytes
PLAIN_UNKNOWN_TOTAL_BYTES = 8 << 20   # ... or one per 8 MiB when the server gives no length


class DownloadError(ConnectionError):
    """A download that failed: one line starting with the URL. .url; .tries: the requests made;
    .reason: the last problem ("Connection refused", "HTTP 503 Service Unavailable", ...)."""

    def __init__(self, message, url, tries, reason):
        super().__init__(message)
        self.url, self.tries, self.reason = url, tries, reason


class _Transient(Exception):
    """A try that failed in a way worth retrying (reason: a short phrase)."""


class _Fatal(Exception):
    """A try that failed in a way a retry cannot fix (HTTP 4xx other than 429, a server
    certificate that does not verify)."""


class _Refused(Exception):
    """A redirect that would leave HTTPS (the message says where to, and --allow-http)."""


class _HttpsRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handler with every hop's scheme checked before it is followed: once
    on https://, only https:// (any scheme urllib follows, if allow_http), as _Refused."""

    def __init__(self, allow_http, reporter):
        self.allow_http, self.reporter = allow_http, reporter

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        scheme = urllib.parse.urlsplit(newurl).scheme.lower()
        was_https = urllib.parse.urlsplit(req.full_url).scheme.lower() == "https"
        if was_https and scheme != "https":
            if not (self.allow_http and scheme == "http"):
                fp.close()
                raise _Refused(f"redirected ({code}) to {newurl}: plain HTTP refused "
                               f"(unauthenticated: the bytes can be changed on the way); pass "
                               f"--allow-http to follow it")
            self.reporter.redirected(f"{req.full_url}: redirected ({code}) to {newurl}, plain "
                                     f"HTTP, followed (--allow-http)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


# ---------------------------------------------------------------- one file
def refuse_http(flag, url, allow_http):
    """Raise ValueError naming the flag and the URL if url is plain http:// and not allow_http:
    over HTTP anyone on the path can change the bytes unnoticed."""
    if url and url.lower().startswith("http://") and not allow_http:
        raise ValueError(f"{flag} {url}: plain HTTP refused (unauthenticated: the bytes can be "
                         f"changed on the way); use an https:// URL, or pass --allow-http")


def download(url, dest, expected_size=None, expected_sha256=None, retries=4, backoff=1.0,
             timeout=60, progress=None, allow_http=False):
    """Download `url` to `dest` (a path) and return dest as a Path.

    If dest exists and matches expected_size (bytes) and expected_sha256 (hex), whichever are
    given, it is returned at once without network access. Otherwise the bytes go to dest.part,
    resuming an earlier try's .part; a complete, matching .part is fsynced and renamed onto dest.
    retries: tries after the first; the k-th retry waits backoff * 2**(k-1) seconds. timeout:
    seconds for connecting and for each read. progress: True for a tqdm bar on stderr, False for
    plain lines on stderr (about one per 10%, retries noted), None: a bar if stderr is a terminal.
    allow_http: follow a redirect from https:// to http:// (said on stderr); without it such a
    redirect is a DownloadError at once, nothing written. (An http:// url is the caller's
    choice: the commands refuse one without --allow-http, refuse_http.)
    Raises DownloadError (a ConnectionError) after the last retry or on an HTTP 4xx other than
    429 or a refused redirect, keeping the .part; ValueError on a size or sha256 mismatch, after
    deleting the .part."""
    dest = Path(dest)
    reporter = _ByteProgress(dest.name, sys.stderr.isatty() if progress is None else progress)
    try:
        return fetch(url, dest, expected_size, expected_sha256, retries, backoff, timeout,
                     reporter, allow_http=allow_http)[0]
    finally:
        reporter.close()


def fetch(url, dest, expected_size, expected_sha256, retries, backoff, timeout, reporter,
          allow_http=False):
    """download() with a reporter (start(have, total), add(n), note(line), redirected(line)).
    Returns (dest, Content-Type of the last response or None, whether anything was fetched)."""
    part = dest.with_name(dest.name + PART_SUFFIX)
    if dest.is_file() and _mismatch(dest, expected_size, expected_sha256) is None:
        return dest, None, False
    dest.parent.mkdir(parents=True, exist_ok=True)
    if expected_size is not None and part.is_file() and part.stat().st_size > expected_size:
        part.unlink()                                   # longer than the file: cannot be resumed
    reason = None
    for attempt in range(retries + 1):
        if attempt:
            wait = backoff * 2 ** (attempt - 1)
            reporter.note(f"{url}: {reason}; retry {attempt}/{retries} in {wait:.1f} s")
            time.sleep(wait)
        try:
            content_type = _get(url, part, timeout, reporter, expected_size, allow_http)
            break
        except _Transient as err:
            reason = str(err)
        except _Fatal as err:
            raise DownloadError(f"{url}: cannot download ({err}); check the URL (not "
                                f"retried)", url, attempt + 1, str(err)) from None
        except _Refused as err:
            raise DownloadError(f"{url}: {err}", url, attempt + 1, str(err)) from None
    else:
        have = part.stat().st_size if part.is_file() else 0
        kept = (f"the partial file {part} ({have} bytes) is kept, rerun to resume" if have
                else "no bytes were received, rerun to try again")
        raise DownloadError(f"{url}: cannot download ({reason}) after {retries + 1} tries; "
                            f"{kept}", url, retries + 1, reason)
    problem = _mismatch(part, expected_size, expected_sha256)
    if problem is not None:
        part.unlink()
        raise ValueError(f"{url}: downloaded {problem}; removed, rerun to download again")
    os.replace(part, dest)                              # _get fsynced the bytes already
    fsync_dir(dest.parent)
    return dest, content_type, True


def _mismatch(path, expected_size, expected_sha256):
    """None if the file at `path` has the expected size and sha256 (those not None), else a
    phrase saying what differs, for "{url}: downloaded {phrase}"."""
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        return (f"{size} bytes, expected {expected_size} (a cut transfer or a changed file "
                f"upstream)")
    if expected_sha256 is not None:
        digest = sha256_file(path)
        if digest != expected_sha256.lower():
            return (f"{size} bytes with sha256 {digest}, expected {expected_sha256} (damaged "
                    f"download or a changed file upstream)")
    return None


def _get(url, part, timeout, reporter, expected_size=None, allow_http=False):
    """One GET of `url` that appends to `part` (resuming its bytes) and fsyncs it. Returns the
    Content-Type. Raises _Transient (retry), _Fatal (do not) or _Refused (a redirect leaving
    HTTPS, before anything is written); a transfer that ends before the server's length (or
    expected_size, when the server gives none) is a _Transient cut."""
    have = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": USER_AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        opener = urllib.request.build_opener(_HttpsRedirects(allow_http, reporter))
        response = opener.open(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as err:
        err.close()
        if err.code == 416 and have:                    # the .part is complete, or too long
            if _content_range(err.headers.get("Content-Range"))[2] == have:
                return None
            part.unlink()
            return _get(url, part, timeout, reporter, expected_size, allow_http)  # no Range
        reason = f"HTTP {err.code} {err.reason}"
        raise (_Transient if err.code >= 500 or err.code == 429 else _Fatal)(reason) from None
    except (OSError, http.client.HTTPException) as err:   # URLError is an OSError
        cause = getattr(err, "reason", err)
        if isinstance(cause, ssl.SSLCertVerificationError):
            raise _Fatal(f"the server's TLS certificate does not verify: "
                         f"{cause.verify_message}") from None
        raise _Transient(_reason(err)) from None
    with response:
        if response.status == 206:
            start, _, total = _content_range(response.headers.get("Content-Range"))
            if start != have:
                part.unlink()
                raise _Transient(f"the server resumed at byte {start}, not {have}")
        else:                                           # 200: the whole file (Range ignored)
            have = 0
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else expected_size
        received = have
        reporter.start(have, total)
        try:                                            # OSErrors here are the local disk's
            with open(part, "ab" if have else "wb") as f:
                while chunk := _read(response):
                    f.write(chunk)
                    received += len(chunk)
                    reporter.add(len(chunk))
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            raise FileError(err.errno, f"{part}: cannot write ({err.strerror or err}); the bytes "
                            f"so far are kept, free space and rerun to resume") from None
        if total is not None and received < total:      # http.client returns b"" at a cut
            raise _Transient(f"transfer cut short at {received} of {total} bytes")
        return response.headers.get_content_type()


def _read(response):
    """The next CHUNK_BYTES (or fewer; b"" at the end) of a response; _Transient on a cut."""
    try:
        return response.read(CHUNK_BYTES)
    except (OSError, http.client.HTTPException) as err:
        raise _Transient(_reason(err)) from None


def _content_range(value):
    """(first byte, last byte, total bytes) of a Content-Range header ("bytes 0-9/10" or
    "bytes */10"); None for each part that is absent or "*"."""
    match = re.fullmatch(r"\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*", value or "")
    if match is None:
        return None, None, None
    return tuple(int(g) if g and g != "*" else None for g in match.groups())


def _reason(err):
    """A short phrase for a network error: "Connection refused", "timed out", ..."""
    err = getattr(err, "reason", err)                   # URLError wraps the socket's error
    if isinstance(err, http.client.IncompleteRead):
        return f"transfer cut short ({len(err.partial)} bytes of this read received)"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


class _ByteProgress:
    """download()'s progress: a tqdm bar of bytes, or plain stderr lines without "\\r"."""

    def __init__(self, desc, use_bar):
        self.desc, self.use_bar, self.bar = desc, use_bar, None

    def start(self, have, total):
        if self.use_bar and self.bar is None:
            self.bar = tqdm(total=total, initial=have, unit="B", unit_scale=True,
                            unit_divisor=1024, desc=self.desc)
        elif self.bar is not None:
            self.bar.reset(total=total)
            self.bar.update(have)
        self.done, self.total, self.began, self.t0 = have, total, have, time.perf_counter()

    def add(self, n):
        before, self.done = self.done, self.done + n
        if self.bar is not None:
            self.bar.update(n)
            return
        step = self.total / PLAIN_PROGRESS_LINES if self.total else PLAIN_UNKNOWN_TOTAL_BYTES
        if self.done // step > before // step or self.done == self.total:
            seconds = max(time.perf_counter() - self.t0, 1e-9)
            rate = (self.done - self.began) / seconds / MB
            of = (f"/{self.total / MB:.1f} MB ({100 * self.done // self.total}%)" if self.total
                  else " MB")
            print(f"{self.desc}: {self.done / MB:.1f}{of}, {rate:.1f} MB/s", file=sys.stderr)

    def note(self, line):
        (self.bar.write if self.bar is not None else print)(line, file=sys.stderr)

    redirected = note                                  # a followed http:// redirect, said

    def close(self):
        if self.bar is not None:
            self.bar.close()
