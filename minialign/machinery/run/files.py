"""Files that survive Ctrl-C, a full disk and a second process: the one owner of writing and
reading minialign's result files.

    atomic_write(path)      every writer: a temporary file beside `path`, fsync, os.replace
    read_json / load_npz    every reader of a file minialign wrote: one-line errors naming it

A reader of `path` sees its old bytes or its new bytes, never a mix: the new bytes go to a
temporary file in the same folder (same file system, so the rename is atomic), are flushed to
disk, and only then renamed onto `path`. On any failure (KeyboardInterrupt, a full disk) the
temporary file is removed and `path` is left as it was. A process killed outright (SIGKILL,
power loss) can leave a temporary file behind; its name starts with "." and ends with TMP_SUFFIX,
and `remove_stale_temporaries` deletes such files under a held dirlock.DirLock (one process
per run directory: dirlock.py).
"""
import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

TMP_SUFFIX = ".minialign-tmp"        # temporary files are ".<name>.<random>" + TMP_SUFFIX
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)  # fixed zip timestamp: the same arrays give the same bytes
HASH_CHUNK_BYTES = 1 << 20           # sha256_file reads 1 MiB at a time


# ---------------------------------------------------------------- writing
class FileError(OSError):
    """An OSError whose message is one line starting with the file's path (str() gives that
    line without Python's "[Errno N]" prefix); .errno is kept (ENOSPC for a full disk)."""

    def __str__(self):
        return self.strerror


@contextlib.contextmanager
def atomic_write(path):
    """Context manager yielding a binary file; on a clean exit its bytes replace `path`
    atomically (write, flush, fsync, os.replace, fsync of the folder). On any exception the
    temporary file is removed, `path` is untouched, and an OSError is re-raised as OSError with
    the same errno and a message that starts with `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)                        # mkstemp creates 0600; a result is public
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and not str(err).startswith(str(path)):
            raise FileError(err.errno, f"{path}: cannot write ({err.strerror or err}); "
                                     f"the previous version, if any, is kept") from err
        raise
    fsync_dir(path.parent)


def fsync_dir(directory):
    """Make a rename inside `directory` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path, data):
    """Write `data` (bytes) to `path` atomically (atomic_write)."""
    with atomic_write(path) as f:
        f.write(data)


def atomic_write_json(path, obj):
    """Write `obj` as indented JSON to `path` atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def write_npz(file, arrays):
    """{name: array} as an uncompressed .npz (what np.savez writes, readable by np.load) into an
    open binary file, with a fixed timestamp in every zip entry so that the same arrays give
    the same bytes (np.savez stamps the current time). No pickles: object arrays are refused."""
    with zipfile.ZipFile(file, mode="w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=ZIP_DATE_TIME)
            with zf.open(info, mode="w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.asanyarray(array), allow_pickle=False)


def atomic_savez(path, arrays):
    """Write {name: array} as an .npz (write_npz) to `path` atomically."""
    with atomic_write(path) as f:
        write_npz(f, arrays)


def append_line(f, line):
    """Append one line of text (a log row) to a file opened "ab" and flush it. A row cut short
    by Ctrl-C or a full disk is cut away on resume (checkpoint.rewind_run_dir); an OSError is
    re-raised with the file's name in front."""
    try:
        f.write((line + "\n").encode())
        f.flush()
    except OSError as err:
        raise FileError(err.errno, f"{f.name}: cannot write ({err.strerror or err})") from err


def remove_stale_temporaries(directory):
    """Delete the temporary files a killed writer left in `directory` (and its subfolders).
    Call it only while holding the directory's DirLock. Returns how many were removed."""
    stale = [p for p in Path(directory).rglob(f".*{TMP_SUFFIX}") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


# ---------------------------------------------------------------- reading
def sha256_file(path):
    """Hex sha256 of a file's bytes (what `sha256sum` prints), read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def json_text(path, data, kind="JSON file"):
    """The text of a JSON file's bytes `data`, in any encoding JSON allows, as editors save it:
    UTF-8 (RFC 8259), with or without a byte-order mark (Notepad's "UTF-8 with BOM"), UTF-16
    LE or BE (Notepad's "Unicode") or UTF-32, with or without one; json.detect_encoding tells
    which, as json.loads does for bytes. Line endings and the rest are the parser's (any JSON
    whitespace). Raises ValueError, one line naming `path`, for bytes that are none of these:
    a Latin-1 / cp1252 ("ANSI") file is refused rather than guessed, since the same bytes read
    as another 8-bit code page would be other captions."""
    encoding = json.detect_encoding(data)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as err:
        name = encoding.upper().replace("-SIG", "")
        hint = ("saved as Latin-1 / cp1252 / 'ANSI'? save it as UTF-8" if name == "UTF-8" else
                "cut short or damaged?")
        raise ValueError(f"{path}: not a {kind}: byte 0x{data[err.start]:02x} at offset "
                         f"{err.start} is not {name} ({hint})") from None


def read_json(path, kind="JSON file"):
    """The parsed JSON object in `path`. Raises FileNotFoundError or ValueError with one line
    that starts with the path: missing, a folder, empty, truncated, not UTF-8/16/32 (json_text),
    not JSON, or not a JSON object. kind names what the file should be, for the message."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory, expected a {kind}")
    try:
        text = json_text(path, path.read_bytes(), kind)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (expected a {kind})") from None
    if not text.strip():
        raise ValueError(f"{path}: empty, expected a {kind} (interrupted by an older "
                         f"minialign, or truncated?)")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a valid {kind} (truncated or edited? {err})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: not a {kind} (a JSON {type(obj).__name__}, not an object)")
    return obj


def load_npz(path, kind=".npz file"):
    """Every array of an .npz as a dict {name: ndarray}. Raises FileNotFoundError or ValueError
    with one line that starts with the path: missing, not a zip archive (empty, truncated, a
    plain .npy), an unreadable entry, or pickled objects (never loaded)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (expected a {kind})")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not a readable {kind} (empty, truncated or not an .npz)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path}: not a readable {kind} (truncated or corrupt: {err})") from None


def read_coco_json(path):
    """A COCO captions JSON file (monitor.load_coco_captions), parsed, its top level and every
    annotation checked ({"image_id": int, "id": int, "caption": str, ...}); errors name the file."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory; expected the COCO captions JSON file "
                                "inside it (e.g. captions_val2017.json)")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    text = json_text(path, path.read_bytes(), "COCO captions JSON file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise ValueError(f"{path}: not COCO captions format (no 'annotations' list at the top)")
    if not isinstance(data.get("images", []), list):
        raise ValueError(f"{path}: not COCO captions format ('images' is not a list)")
    for i, ann in enumerate(data["annotations"]):
        check_annotation(path, i, ann)
    return data


def check_annotation(path, i, ann):
    if not isinstance(ann, dict):
        raise ValueError(f"{path}: not COCO captions format (annotation {i} is not an object)")
    for key in ("image_id", "id", "caption"):
        if key not in ann:
            raise ValueError(f"{path}: not COCO captions format (annotation {i} has no '{key}')")
    for key in ("image_id", "id"):
        if not isinstance(ann[key], int) or isinstance(ann[key], bool):
            raise ValueError(f"{path}: annotation {i} has a non-integer '{key}': {ann[key]!r}")
    if not isinstance(ann["caption"], str):
        raise ValueError(f"{path}: annotation {i} (id {ann['id']}) caption is not a string: "
                         f"{ann['caption']!r}")
