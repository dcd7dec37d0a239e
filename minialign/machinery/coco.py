"""`python -m minialign data`: COCO 2017 captions, the replication's subset, BERT's vocabulary,
the subset's photos, all under one folder (--root, default coco/):

    coco/annotations/captions_train2017.json, captions_val2017.json   from the checked zip
    coco/captions_train2017_subset10000_seed0.json   the subset: the photo list of every later
                                                     step (data.split_photos: 8000/1000/1000)
    coco/bert-base-uncased-vocab.txt                 for --tokenizer wordpiece
    coco/train2017/000000000009.jpg ...              the subset's photos, and no others

Every file is complete or absent: a download goes to NAME.part (resumed with a Range request
after a cut), renamed onto NAME once checked (the zip and the vocabulary by their published
sha256, a photo by its record's width x height and a full decode); other files go through a
temporary name. So Ctrl-C and a rerun lose nothing, and a step whose file is there is skipped.
Every hop is HTTPS: an http:// URL, or a redirect to one, is refused unless allow_http.
"""
import http.client
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from ..tokenizer import clean_caption
from .runs import atomic_write, lock, read_json, sha256_file

ANNOTATIONS_URL = "https://images.cocodataset.org/annotations/annotations_trainval2017.zip"
ANNOTATIONS_ZIP = "annotations_trainval2017.zip"    # under root, deleted once extracted
# the official zip (252,907,541 bytes) as public projects pin it (torchvision records the same)
ANNOTATIONS_SHA256 = "113a836d90195ee1f884e704da6304dfaaecff1f023f49b6ca93c4aaae470268"
MEMBERS = {"train": "annotations/captions_train2017.json",
           "val": "annotations/captions_val2017.json"}
VOCAB_NAME = "bert-base-uncased-vocab.txt"
VOCAB_REVISION = "86b5e0934494bd15c9632b12f734a8a67f723594"    # google-bert/bert-base-uncased
VOCAB_URL = (f"https://huggingface.co/google-bert/bert-base-uncased/resolve/{VOCAB_REVISION}/"
             f"vocab.txt")
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"  # 30,522 lines
# COCO's JSON gives each photo an http:// coco_url on COCO's host; it is fetched from
# images_url + the rest of it (e.g. the S3 alias https://s3.amazonaws.com/images.cocodataset.org/)
IMAGES_URL = "https://images.cocodataset.org/"
COCO_HOSTS = ("http://images.cocodataset.org/", "https://images.cocodataset.org/")
MIN_CAPTIONS = 5          # a subset photo has >= 5 captions (every train2017 photo has 5-7)
SUBSET_RULE = (f"photos with >= {MIN_CAPTIONS} captions, >= 2 of them distinct after "
               "minialign.data's cleaning, sorted by id; the first num_photos of "
               "np.random.default_rng(seed).permutation of them, sorted by id")
CHUNK = 64 * 1024         # bytes read from the socket at a time


class DownloadError(ConnectionError):
    """A download that failed every try, or that a retry cannot fix: one line, the URL first."""


class _Retry(Exception):
    """One try failed in a way worth trying again; the message says how."""


def refuse_http(url, allow_http, flag=""):
    """ValueError if url is plain http:// and not allow_http: anyone on the way can change it."""
    if url.lower().startswith("http://") and not allow_http:
        raise ValueError(f"{flag + ' ' if flag else ''}{url}: plain HTTP refused (unauthenticated: "
                         f"the bytes can be changed on the way); use an https:// URL, or pass "
                         f"--allow-http")


class _HttpsOnly(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, each hop checked before it is followed: from https:// only to
    https:// (urllib itself would follow a redirect to http:// silently)."""

    def __init__(self, allow_http):
        self.allow_http = allow_http

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if req.full_url.lower().startswith("https://") and \
                not newurl.lower().startswith("https://"):
            if not self.allow_http:
                fp.close()
                raise DownloadError(f"{req.full_url}: redirected ({code}) to {newurl}: plain "
                                    f"HTTP refused (unauthenticated: the bytes can be changed "
                                    f"on the way); pass --allow-http to follow it")
            print(f"{req.full_url}: redirected ({code}) to {newurl}, plain HTTP, followed "
                  f"(--allow-http)", file=sys.stderr)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def download(url, dest, sha256=None, check=None, allow_http=False, retries=4, backoff=1.0,
             timeout=60, progress=False):
    """Fetch url to dest (returned as a Path); a dest already there is kept if it has this
    sha256 (or none is asked for). The bytes go to dest.part, resumed with "Range: bytes=N-"
    after a cut, and are renamed onto dest once they have the sha256 (hex) and pass
    check(path, content_type) -> None, or a phrase saying what is wrong.
    Cuts, connection errors, timeouts (timeout seconds), HTTP 5xx and 429 are tried again up to
    `retries` times, waiting backoff * 2**k s; anything else fails at once. Raises DownloadError
    (the .part kept, to resume) or ValueError (a failed check: the .part deleted), one line
    starting with the url; a plain http:// url without allow_http is a ValueError."""
    refuse_http(url, allow_http)
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    if dest.is_file() and (sha256 is None or sha256_file(dest) == sha256):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(retries + 1):
        try:
            content_type = _get(url, part, allow_http, timeout, progress)
            break
        except _Retry as err:
            if attempt == retries:
                have = part.stat().st_size if part.is_file() else 0
                raise DownloadError(f"{url}: cannot download ({err}) after {retries + 1} tries; "
                                    f"{have} bytes kept in {part}, rerun to resume") from None
            wait = backoff * 2 ** attempt
            print(f"{url}: {err}; retry {attempt + 1}/{retries} in {wait:.1f} s", file=sys.stderr)
            time.sleep(wait)
    size = part.stat().st_size
    found = sha256_file(part) if sha256 else None
    problem = (f"sha256 {found}, expected {sha256} (a damaged download or another file)"
               if found != sha256 else check(part, content_type) if check else None)
    if problem:
        part.unlink()
        raise ValueError(f"{url}: downloaded {size} bytes with {problem}; deleted, rerun to "
                         f"download again")
    os.replace(part, dest)
    return dest


def _get(url, part, allow_http, timeout, progress):
    """One GET appending to part (from its end) and fsyncing it; the Content-Type."""
    have = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": "minialign/1", **({"Range": f"bytes={have}-"} if have else {})}
    try:
        response = urllib.request.build_opener(_HttpsOnly(allow_http)).open(
            urllib.request.Request(url, headers=headers), timeout=timeout)
    except DownloadError:
        raise
    except urllib.error.HTTPError as err:
        err.close()
        if err.code == 416 and have:          # nothing after byte `have`: part is whole (or
            return None                       # longer, which the sha256 check refuses)
        if err.code >= 500 or err.code == 429:
            raise _Retry(f"HTTP {err.code} {err.reason}") from None
        raise DownloadError(f"{url}: HTTP {err.code} {err.reason}; check the URL") from None
    except (OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise DownloadError(f"{url}: the server's TLS certificate does not verify "
                                f"({reason.verify_message})") from None
        raise _Retry(_reason(reason)) from None
    with response:
        if response.status == 206 and not response.headers.get(
                "Content-Range", "").startswith(f"bytes {have}-"):
            part.unlink()
            raise _Retry("the server resumed at another byte")
        have = have if response.status == 206 else 0      # a 200 is the whole file
        length = response.headers.get("Content-Length", "")
        total = have + int(length) if length.isdigit() else None
        with open(part, "ab" if have else "wb") as f, tqdm(
                total=total, initial=have, unit="B", unit_scale=True, desc=part.name[:-5],
                disable=not progress) as bar:
            while True:
                try:
                    chunk = response.read(CHUNK)
                except (OSError, http.client.HTTPException) as err:
                    raise _Retry(_reason(err)) from None
                if not chunk:
                    break
                f.write(chunk)
                bar.update(len(chunk))
            f.flush()
            os.fsync(f.fileno())
        if total is not None and part.stat().st_size < total:
            raise _Retry(f"transfer cut short at {part.stat().st_size} of {total} bytes")
        return response.headers.get_content_type()


def _reason(err):
    """A short phrase for a network error: "Connection refused", "timed out", ..."""
    return getattr(err, "strerror", None) or str(err) or type(err).__name__


# ---------------------------------------------------------------- the captions and the subset
def get_annotations(root, url=ANNOTATIONS_URL, allow_http=False, progress=False):
    """{"train", "val"}: root/annotations/captions_{train,val}2017.json, extracted from the
    zip at url once it has ANNOTATIONS_SHA256 (then deleted); skipped when both are there."""
    folder = Path(root) / "annotations"
    paths = {split: folder / Path(member).name for split, member in MEMBERS.items()}
    if all(p.is_file() for p in paths.values()):
        print(f"{folder}: captions present, skipped", flush=True)
        return paths
    zip_path = download(url, Path(root) / ANNOTATIONS_ZIP, sha256=ANNOTATIONS_SHA256,
                        allow_http=allow_http, progress=progress)
    with zipfile.ZipFile(zip_path) as zf:
        for split, path in paths.items():
            atomic_write(path, zf.read(MEMBERS[split]))
    zip_path.unlink()
    print(f"{folder}: captions extracted from {zip_path} (sha256 {ANNOTATIONS_SHA256[:12]}..., "
          f"as published); deleted the zip", flush=True)
    return paths


def choose_subset(coco, num_photos, seed, where):
    """A seeded subset of a COCO captions dict, as a COCO captions dict. Eligible: photos with
    >= MIN_CAPTIONS captions, >= 2 distinct after cleaning (so data.py keeps each). Chosen:
    the first num_photos of default_rng(seed).permutation of the id-sorted eligible photos,
    sorted by id, with all their fields and their annotations in file order."""
    by_photo = {}
    for ann in coco["annotations"]:
        by_photo.setdefault(ann["image_id"], []).append(ann["caption"])

    def eligible(image):
        captions = by_photo.get(image["id"], [])
        cleaned = {c for c in map(clean_caption, captions) if any(ch.isalnum() for ch in c)}
        return len(captions) >= MIN_CAPTIONS and len(cleaned) >= 2
    photos = sorted(filter(eligible, coco["images"]), key=lambda image: image["id"])
    if not 1 <= num_photos <= len(photos):
        raise ValueError(f"{where}: cannot choose {num_photos} photos, only {len(photos)} of its "
                         f"{len(coco['images'])} photos have >= {MIN_CAPTIONS} captions, >= 2 "
                         f"distinct; pass --num-photos {len(photos)} or fewer")
    order = np.random.default_rng(seed).permutation(len(photos))[:num_photos]  # (num_photos,)
    images = [photos[i] for i in np.sort(order)]
    chosen = {image["id"] for image in images}
    info = dict(coco.get("info") or {})
    info["minialign_subset"] = {"num_photos": num_photos, "seed": seed,
                                "eligible_photos": len(photos), "rule": SUBSET_RULE, "format": 1}
    return {"info": info, "licenses": coco.get("licenses", []), "images": images,
            "annotations": [a for a in coco["annotations"] if a["image_id"] in chosen]}


def write_subset(captions, out, num_photos, seed):
    """choose_subset of a COCO captions JSON, written to out (its bytes depend only on the
    source's bytes, num_photos and seed); info["minialign_subset"] also names the source file
    and its sha256. Returns out as a Path."""
    coco = read_json(captions)
    if not isinstance(coco, dict) or not all(isinstance(coco.get(k), list)
                                             for k in ("images", "annotations")):
        raise ValueError(f"{captions}: not COCO captions format (no 'images' and 'annotations' "
                         f"lists)")
    subset = choose_subset(coco, num_photos, seed, where=captions)
    subset["info"]["minialign_subset"].update(source_file=Path(captions).name,
                                              source_sha256=sha256_file(captions))
    atomic_write(out, json.dumps(subset, ensure_ascii=False).encode("utf-8"))
    return Path(out)


# ---------------------------------------------------------------- the photos
def photo_url(coco_url, images_url=IMAGES_URL, allow_http=False):
    """Where a photo is fetched: a coco_url on COCO's host is images_url + its path (one "/"
    between them); any other http:// URL becomes https:// unless allow_http."""
    for host in COCO_HOSTS:
        if coco_url.startswith(host):
            return images_url.rstrip("/") + "/" + coco_url[len(host):]
    if coco_url.lower().startswith("http://") and not allow_http:
        return "https://" + coco_url[len("http://"):]
    return coco_url


def photo_check(width, height):
    """download()'s check of a photo: its header says width x height (looked at before any
    pixel is decoded; Pillow's decompression-bomb guard stays on), then it decodes fully."""
    def check(path, content_type):
        try:
            with Image.open(path) as image:
                if image.size != (width, height):
                    return f"size {image.size[0]}x{image.size[1]}, expected {width}x{height}"
                image.load()
        except Exception as err:                   # Pillow raises many types on bad bytes
            if content_type and not content_type.startswith("image/"):
                return f"not an image (the server sent {content_type})"
            return f"not a readable image ({type(err).__name__}: {err})"
    return check


def fetch_photos(subset, out_dir, workers=8, images_url=IMAGES_URL, allow_http=False,
                 progress=False):
    """The subset file's photos into out_dir/file_name, `workers` downloads at a time; returns
    (fetched, present). Raises OSError naming the ids that failed, once the others are done."""
    records = read_json(subset)["images"]
    for r in records:
        if Path(r["file_name"]).name != r["file_name"] or r["file_name"].startswith("."):
            raise ValueError(f"{subset}: photo {r['id']}: file_name {r['file_name']!r} is not "
                             f"a plain file name")

    def one(r):
        path = Path(out_dir) / r["file_name"]
        if path.is_file():
            return "present"
        try:
            download(photo_url(r["coco_url"], images_url, allow_http), path,
                     check=photo_check(r["width"], r["height"]), allow_http=allow_http)
        except (OSError, ValueError) as err:
            return f"photo {r['id']}: {err}"
        return "fetched"
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        done = list(tqdm(pool.map(one, records), total=len(records), unit="photo",
                         desc="photos", disable=not progress))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)     # Ctrl-C: start no new download
    failed = {r["id"]: why for r, why in zip(records, done) if why not in ("fetched", "present")}
    if failed:
        ids = sorted(failed)
        raise OSError(f"{out_dir}: {len(ids)} photos could not be fetched: ids {ids[:10]}"
                      f"{' ...' if len(ids) > 10 else ''} ({failed[ids[0]]}); rerun "
                      f"`make data` to retry")
    return done.count("fetched"), done.count("present")


# ---------------------------------------------------------------- the command
def run_data(root="coco", num_photos=10000, seed=0, images=True, workers=8,
             annotations_url=ANNOTATIONS_URL, images_url=IMAGES_URL, vocab_url=VOCAB_URL,
             allow_http=False, force=False, progress=None):
    """`python -m minialign data`: captions -> subset (written once; force: again) -> BERT's
    vocabulary -> the subset's photos (if images). One process at a time per root (its OS
    lock). progress: tqdm bars (None: if stderr is a terminal)."""
    for flag, url in (("--annotations-url", annotations_url), ("--images-url", images_url),
                      ("--vocab-url", vocab_url)):
        refuse_http(url, allow_http, flag)
    root = Path(root)
    progress = sys.stderr.isatty() if progress is None else progress
    if allow_http:
        print("--allow-http: plain http:// URLs and redirects to them are followed (the zip and "
              "the vocabulary are still checked by sha256, each photo by its size)", flush=True)
    with lock(root):
        paths = get_annotations(root, annotations_url, allow_http, progress)
        subset = root / f"captions_train2017_subset{num_photos}_seed{seed}.json"
        if subset.is_file() and not force:
            print(f"{subset}: present, skipped (--force writes it again)", flush=True)
        else:
            info = read_json(write_subset(paths["train"], subset, num_photos, seed))["info"]
            print(f"{subset}: wrote {num_photos} of {info['minialign_subset']['eligible_photos']}"
                  f" eligible photos (seed {seed})", flush=True)
        made = [paths["train"], paths["val"], subset,
                download(vocab_url, root / VOCAB_NAME, sha256=VOCAB_SHA256,
                         allow_http=allow_http, progress=progress)]
        if images:
            fetched, present = fetch_photos(subset, root / "train2017", workers, images_url,
                                            allow_http, progress)
            print(f"{root / 'train2017'}: {fetched} photos fetched, {present} already present",
                  flush=True)
            made.append(root / "train2017")
    print("ready: " + ", ".join(str(p) for p in made))
    print("next: `make embeddings` (the DINOv2 embeddings of the subset's photos, once), then "
          "`make replicate`" if images else "next: `make replicate IMAGE_EVAL=off` (text "
          "only), or rerun with --images and `make embeddings`")
