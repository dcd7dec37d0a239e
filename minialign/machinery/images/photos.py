"""The subset's photos from their coco_url: many at a time, each verified, resumable.

    fetch_images(records, out_dir)   COCO image records -> out_dir/file_name, `workers` downloads
                                     at a time (download.fetch: resumed, retried, atomic) over
                                     HTTPS (photo_url), each checked against width x height,
                                     then decoded with Pillow

The photos come from the internet, so decoding them is guarded: Pillow's decompression-bomb
check stays on (Image.MAX_IMAGE_PIXELS is never changed here: a header claiming more than twice
that many pixels is refused by Image.open), and the header's size must be the record's width x
height BEFORE any pixel is decoded. A photo that does not verify is deleted and fetched once
more; one that fails again, or cannot be fetched, is reported by its image id. A rerun verifies
what is present (or trusts out_dir/.verified.tsv for files of unchanged size) and fetches only
the rest.
"""
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from .download import MB, PLAIN_PROGRESS_LINES, DownloadError, fetch
from ..run.files import append_line

MANIFEST = ".verified.tsv"            # out_dir/MANIFEST: "file_name<TAB>bytes" of verified images
RECORD_KEYS = ("id", "file_name", "coco_url", "width", "height")  # of a COCO "images" entry
# COCO's JSON gives each photo an http:// coco_url on COCO's own host; photos are fetched from
# IMAGES_URL + the rest of it instead (--images-url: e.g. the S3 alias of the same bucket)
COCO_IMAGE_HOSTS = ("http://images.cocodataset.org/", "https://images.cocodataset.org/")
IMAGES_URL = "https://images.cocodataset.org/"
FETCHES = 2                           # a photo that does not verify is fetched once more


def photo_url(coco_url, images_url=None, allow_http=False):
    """Where a photo is fetched from: a coco_url on COCO's host becomes images_url (None:
    IMAGES_URL) + the rest of it, http://images.cocodataset.org/train2017/x.jpg ->
    https://images.cocodataset.org/train2017/x.jpg, with one "/" between them whether or not
    images_url ends in one; any other http:// URL becomes https://, unless allow_http (then it
    is used as written)."""
    for host in COCO_IMAGE_HOSTS:
        if coco_url.startswith(host):
            return (images_url or IMAGES_URL).rstrip("/") + "/" + coco_url[len(host):]
    if coco_url.lower().startswith("http://") and not allow_http:
        return "https://" + coco_url[len("http://"):]
    return coco_url


def fetch_images(records, out_dir, workers=8, retries=4, backoff=1.0, timeout=60, progress=None,
                 images_url=None, allow_http=False):
    """Download COCO images to out_dir/file_name, `workers` at a time, and verify each one.

    records: COCO "images" entries, dicts with id, file_name, coco_url, width, height (pixels);
    each is fetched from photo_url(coco_url, images_url, allow_http). An image passes if its
    size is (width, height) and Pillow decodes it fully; one that fails is deleted and fetched
    once more, then reported. Images already in out_dir are verified instead of downloaded, and
    recorded in out_dir/.verified.tsv ("file_name<TAB>bytes") as they pass, so that a rerun
    does not decode them again while their size is unchanged. Downloads use download() (resumed,
    atomic); retries, backoff and timeout are its. progress: a tqdm bar over images (True),
    plain stderr lines with count, failures and MB/s (False), or None: a bar on a terminal.
    allow_http: also follow redirects from https:// to http:// (download.fetch refuses them
    otherwise: that photo fails, its reason naming both URLs and --allow-http).
    Returns {"fetched": int, "already_present": int, "failed": {image id: reason},
    "redirected_to_http": photos that were fetched through a followed http:// redirect}; single
    images never raise. Raises ValueError, naming the record, for a record without a field,
    a file_name that is not a plain file name, or two records with one file_name."""
    _check_records(records)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = out_dir / MANIFEST
    verified = _read_manifest(manifest)
    counter = _ByteCounter()
    result = {"fetched": 0, "already_present": 0, "failed": {}}
    use_bar = sys.stderr.isatty() if progress is None else progress
    t0 = time.perf_counter()

    def one(record):
        url = photo_url(record["coco_url"], images_url, allow_http)
        return _fetch_one(record, url, out_dir, verified, (retries, backoff, timeout, allow_http),
                          counter)

    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        with open(manifest, "ab") as log, tqdm(total=len(records), unit="img",
                                                desc="fetch_images", disable=not use_bar) as bar:
            if log.tell() and not manifest.read_bytes().endswith(b"\n"):
                log.write(b"\n")                        # a line cut by a killed run stays apart
            futures = {pool.submit(one, record): record for record in records}
            for done, future in enumerate(as_completed(futures), 1):
                status, detail = future.result()
                if status == "failed":
                    result["failed"][futures[future]["id"]] = detail
                else:
                    result[status] += 1
                    if detail is not None:
                        append_line(log, detail)
                rate = counter.total / max(time.perf_counter() - t0, 1e-9) / MB
                bar.set_postfix_str(f"{len(result['failed'])} failed, {rate:.1f} MB/s",
                                    refresh=False)
                bar.update(1)
                tenths = [k * PLAIN_PROGRESS_LINES // len(records) for k in (done - 1, done)]
                if not use_bar and (done == 1 or tenths[1] > tenths[0]):   # first, each ~10%
                    print(f"fetch_images: {done}/{len(records)} images "
                          f"({100 * done // len(records)}%), {len(result['failed'])} failed, "
                          f"{rate:.1f} MB/s", file=sys.stderr)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # Ctrl-C: start no new download
    result["redirected_to_http"] = counter.redirects
    return result


def _fetch_one(record, url, out_dir, verified, options, counter):
    """One image: verify the file if present, else download it from url and verify it, twice
    at most (FETCHES). Returns ("fetched" | "already_present", a manifest line or None) or
    ("failed", reason); a refused photo's reason starts with its id."""
    path = out_dir / record["file_name"]
    width, height = record["width"], record["height"]
    if path.is_file():
        size = path.stat().st_size
        if verified.get(path.name) == size:
            return "already_present", None
        if _check_image(path, width, height, None) is None:
            return "already_present", f"{path.name}\t{size}"
        path.unlink()                                   # damaged: download it again
    retries, backoff, timeout, allow_http = options
    for _ in range(FETCHES):
        try:
            _, content_type, _ = fetch(url, path, None, None, retries, backoff, timeout, counter,
                                       allow_http=allow_http)
        except (DownloadError, ValueError) as err:
            return "failed", str(err)
        problem = _check_image(path, width, height, content_type)
        if problem is None:
            return "fetched", f"{path.name}\t{path.stat().st_size}"
        path.unlink()
    return "failed", f"photo {record['id']}: {problem}; refused ({FETCHES} fetches)"


def _check_image(path, width, height, content_type):
    """None if the image at `path` is width x height and Pillow decodes all of it, else the
    reason ("not an image: the server sent text/html", "size 640x480, expected 500x375").
    The size comes from the header, checked before any pixel is decoded; Image.open itself
    refuses a header beyond the decompression-bomb limit (DecompressionBombError)."""
    try:
        with Image.open(path) as image:
            if image.size != (width, height):
                return f"size {image.size[0]}x{image.size[1]}, expected {width}x{height}"
            image.load()
    except Exception as err:                            # Pillow raises many types on bad bytes
        if content_type and not content_type.startswith("image/"):
            return f"not an image: the server sent {content_type}"
        return f"not a readable image ({type(err).__name__}: {err})"
    return None


def _check_records(records):
    """Raise ValueError naming the first bad record (see fetch_images)."""
    owner = {}
    for index, record in enumerate(records):
        if not isinstance(record, dict) or "id" not in record:
            raise ValueError(f"image record #{index}: has no id (a COCO image record is a dict "
                             f"with {', '.join(RECORD_KEYS)})")
        name = f"image record {record['id']!r}"
        missing = [key for key in RECORD_KEYS if key not in record]
        if missing:
            raise ValueError(f"{name}: missing {', '.join(missing)} (a COCO image record has "
                             f"{', '.join(RECORD_KEYS)})")
        file_name = record["file_name"]
        if (not isinstance(file_name, str) or Path(file_name).name != file_name
                or file_name.startswith(".")):
            raise ValueError(f"{name}: file_name {file_name!r} is not a plain file name")
        if file_name in owner:
            raise ValueError(f"{name}: file_name {file_name} is also that of image record "
                             f"{owner[file_name]!r}")
        owner[file_name] = record["id"]


def _read_manifest(path):
    """{file_name: bytes} from out_dir/.verified.tsv ({} if absent); bad lines are skipped."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return {}
    lines = (line.partition("\t") for line in text.splitlines())
    return {name: int(size) for name, tab, size in lines if tab and size.isdigit()}


class _ByteCounter:
    """fetch_images' reporter for download: counts the bytes of all threads and the followed
    http:// redirects (said once, in fetch_subset_images' last line), prints nothing."""

    def __init__(self):
        self.total, self.redirects, self.lock = 0, 0, threading.Lock()

    def start(self, have, total):
        pass

    def add(self, n):
        with self.lock:
            self.total += n

    def note(self, line):
        pass

    def redirected(self, line):
        with self.lock:
            self.redirects += 1
