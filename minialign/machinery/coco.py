"""`python -m minialign data`: under --root, COCO 2017's captions (from the sha256-checked zip),
the subset captions_train2017_subset10000_seed0.json, BERT's vocabulary (sha256) and the subset's
photos train2017/*.jpg (checked by size and a full decode). Each file is complete or absent
(NAME.part, resumed by Range, renamed once checked); every hop is HTTPS."""
import http.client
import json
import os
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from ..tokenizer import clean_caption
from .runs import atomic_write, lock, read_json, sha256_file

ANNOTATIONS_URL = "https://images.cocodataset.org/annotations/annotations_trainval2017.zip"
ANNOTATIONS_ZIP = "annotations_trainval2017.zip"    # under root, deleted once extracted
ANNOTATIONS_SHA256 = "113a836d90195ee1f884e704da6304dfaaecff1f023f49b6ca93c4aaae470268"
MEMBERS = {"train": "annotations/captions_train2017.json",
           "val": "annotations/captions_val2017.json"}
VOCAB_NAME = "bert-base-uncased-vocab.txt"
VOCAB_REVISION = "86b5e0934494bd15c9632b12f734a8a67f723594"    # google-bert/bert-base-uncased
VOCAB_URL = (f"https://huggingface.co/google-bert/bert-base-uncased/resolve/{VOCAB_REVISION}/"
             f"vocab.txt")
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"  # 30,522 lines
IMAGES_URL = "https://images.cocodataset.org/"    # photos: IMAGES_URL/train2017/FILE_NAME
MIN_CAPTIONS = 5          # a subset photo has >= 5 captions (every train2017 photo has 5-7)
SUBSET_RULE = (f"photos with >= {MIN_CAPTIONS} captions, >= 2 of them distinct after "
               "minialign.data's cleaning, sorted by id; the first num_photos of "
               "np.random.default_rng(seed).permutation of them, sorted by id")
PLAIN_HTTP = "plain HTTP refused (unauthenticated: the bytes can be changed on the way)"


def refuse_http(url, flag=""):
    """ValueError, one line, unless url is https://."""
    if not url.lower().startswith("https://"):
        raise ValueError(f"{flag + ' ' if flag else ''}{url}: {PLAIN_HTTP}; use an https:// URL")


class _HttpsOnly(urllib.request.HTTPRedirectHandler):
    """Redirects to anything but https:// refused (urllib would follow one to http:// silently)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if not newurl.lower().startswith("https://"):
            fp.close()
            raise ValueError(f"{req.full_url}: redirected ({code}) to {newurl}: {PLAIN_HTTP}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def download(url, dest, sha256=None, check=None, retries=4, backoff=1.0, timeout=60,
             progress=False):
    """Fetch url to dest (kept if there with this sha256) via dest.part, renamed once it has the
    sha256 and check(path) returns None (else a phrase). Cuts, timeouts, 5xx, 429: retried after
    backoff * 2**k s. ConnectionError (.part kept) or ValueError (.part deleted), url first."""
    refuse_http(url)
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    if dest.is_file() and (sha256 is None or sha256_file(dest) == sha256):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(retries + 1):
        if (err := _get(url, part, timeout, progress)) is None:
            break
        if attempt == retries:
            have = part.stat().st_size if part.is_file() else 0
            raise ConnectionError(f"{url}: cannot download ({err}) after {retries + 1} tries; "
                                f"{have} bytes kept in {part}, rerun to resume")
        wait = backoff * 2 ** attempt
        print(f"{url}: {err}; retry {attempt + 1}/{retries} in {wait:.1f} s", file=sys.stderr)
        time.sleep(wait)
    found = sha256_file(part) if sha256 else None
    problem = (f"sha256 {found}, expected {sha256} (a damaged download or another file)"
               if found != sha256 else check(part) if check else None)
    if problem:
        size = part.stat().st_size
        part.unlink()
        raise ValueError(f"{url}: downloaded {size} bytes with {problem}; deleted, rerun to "
                         f"download again")
    os.replace(part, dest)
    return dest


def _get(url, part, timeout, progress):
    """One GET appending to part (from its end, "Range: bytes=N-") and fsyncing it. Returns
    None, or why it failed in a way worth trying again (a cut, a timeout, HTTP 5xx or 429)."""
    have = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": "minialign/1", **({"Range": f"bytes={have}-"} if have else {})}
    try:
        with urllib.request.build_opener(_HttpsOnly).open(
                urllib.request.Request(url, headers=headers), timeout=timeout) as response:
            if response.status == 206 and not response.headers.get(
                    "Content-Range", "").startswith(f"bytes {have}-"):
                part.unlink()
                return "the server resumed at another byte"
            have = have if response.status == 206 else 0      # a 200 is the whole file
            length = response.headers.get("Content-Length", "")
            total = have + int(length) if length.isdigit() else None
            with open(part, "ab" if have else "wb") as f, tqdm.wrapattr(
                    f, "write", total=total, initial=have, desc=part.name[:-5],
                    disable=not progress) as out:
                shutil.copyfileobj(response, out)
                f.flush()
                os.fsync(f.fileno())
    except urllib.error.HTTPError as err:
        err.close()
        if err.code == 416 and have:          # part is whole (or longer: the sha256 refuses it)
            return None
        if err.code >= 500 or err.code == 429:
            return f"HTTP {err.code} {err.reason}"
        raise ConnectionError(f"{url}: HTTP {err.code} {err.reason}; check the URL") from None
    except (OSError, http.client.HTTPException) as err:       # a cut, a timeout, ...
        reason = getattr(err, "reason", err)
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise ConnectionError(f"{url}: the server's TLS certificate does not verify "
                                f"({reason.verify_message})") from None
        return str(reason) or type(reason).__name__
    if total is not None and part.stat().st_size < total:
        return f"transfer cut short at {part.stat().st_size} of {total} bytes"


def choose_subset(captions, num_photos, seed):
    """The subset (SUBSET_RULE) of a COCO captions file as a COCO captions dict."""
    coco, by_photo = read_json(captions), {}
    for ann in coco["annotations"]:
        by_photo.setdefault(ann["image_id"], []).append(ann["caption"])

    def eligible(image):
        captions = by_photo.get(image["id"], [])
        cleaned = {c for c in map(clean_caption, captions) if any(ch.isalnum() for ch in c)}
        return len(captions) >= MIN_CAPTIONS and len(cleaned) >= 2
    photos = sorted(filter(eligible, coco["images"]), key=lambda image: image["id"])
    if not 1 <= num_photos <= len(photos):
        raise ValueError(f"{captions}: cannot choose {num_photos} photos, only {len(photos)} "
                         f"of its {len(coco['images'])} photos have >= {MIN_CAPTIONS} captions, "
                         f">= 2 distinct; pass --num-photos {len(photos)} or fewer")
    order = np.random.default_rng(seed).permutation(len(photos))[:num_photos]  # (num_photos,)
    images = [photos[i] for i in np.sort(order)]
    chosen = {image["id"] for image in images}
    info = {**(coco.get("info") or {}), "minialign_subset": {
        "num_photos": num_photos, "seed": seed, "eligible_photos": len(photos), "rule": SUBSET_RULE,
        "format": 1, "source_file": Path(captions).name, "source_sha256": sha256_file(captions)}}
    return {"info": info, "licenses": coco.get("licenses", []), "images": images,
            "annotations": [a for a in coco["annotations"] if a["image_id"] in chosen]}


def fetch_photos(subset, out_dir, workers, images_url, progress):
    """The subset file's photos into out_dir, `workers` at a time, each checked by its header's
    width x height (before decoding, Pillow's bomb guard on) and a full decode, then a line of
    counts; OSError naming the ids that failed, once the others are done."""
    records = read_json(subset)["images"]
    missing = [r for r in records if not (Path(out_dir) / r["file_name"]).is_file()]

    def check(r, path):                         # None, or why path is not r's photo
        try:
            with Image.open(path) as image:
                if image.size != (r["width"], r["height"]):
                    return "size {}x{}, expected {width}x{height}".format(*image.size, **r)
                image.load()
        except Exception as err:               # Pillow raises many types on bad bytes
            return f"not a readable image ({type(err).__name__}: {err})"

    def one(r):                                 # None, or why r could not be fetched
        try:
            download(f"{images_url.rstrip('/')}/train2017/{r['file_name']}",
                     Path(out_dir) / r["file_name"], check=partial(check, r))
        except (OSError, ValueError) as err:
            return f"photo {r['id']}: {err}"
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        done = list(tqdm(pool.map(one, missing), total=len(records), unit="photo", desc="photos",
                         initial=len(records) - len(missing), disable=not progress))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)     # Ctrl-C: start no new download
    failed = {r["id"]: why for r, why in zip(missing, done) if why}
    if failed:
        ids = sorted(failed)
        raise OSError(f"{out_dir}: {len(ids)} photos could not be fetched: ids {ids[:10]}"
                      f"{' ...' if len(ids) > 10 else ''} ({failed[ids[0]]}); rerun "
                      f"`make data` to retry")
    print(f"{out_dir}: {len(missing)} photos fetched, {len(records) - len(missing)} already "
          f"present", flush=True)


def run_data(root="coco", num_photos=10000, seed=0, images=True, workers=8,
             annotations_url=ANNOTATIONS_URL, images_url=IMAGES_URL, vocab_url=VOCAB_URL,
             force=False, progress=None):
    """Captions -> subset (written once; force: again) -> vocabulary -> photos (if images), one
    process per root (an OS lock). progress: tqdm bars (None: if stderr is a terminal)."""
    for flag, url in (("--annotations-url", annotations_url), ("--images-url", images_url),
                      ("--vocab-url", vocab_url)):
        refuse_http(url, flag)
    root = Path(root)
    progress = sys.stderr.isatty() if progress is None else progress
    with lock(root):
        paths = {split: root / member for split, member in MEMBERS.items()}   # root/annotations/
        if all(p.is_file() for p in paths.values()):
            print(f"{root / 'annotations'}: captions present, skipped", flush=True)
        else:
            zip_path = download(annotations_url, root / ANNOTATIONS_ZIP,
                                sha256=ANNOTATIONS_SHA256, progress=progress)
            with zipfile.ZipFile(zip_path) as zf:
                for split, path in paths.items():
                    atomic_write(path, zf.read(MEMBERS[split]))
            zip_path.unlink()
            print(f"{root / 'annotations'}: captions extracted from {zip_path} (sha256 checked), "
                  f"zip deleted", flush=True)
        subset = root / f"captions_train2017_subset{num_photos}_seed{seed}.json"
        if subset.is_file() and not force:
            print(f"{subset}: present, skipped (--force writes it again)", flush=True)
        else:
            chosen = choose_subset(paths["train"], num_photos, seed)
            atomic_write(subset, json.dumps(chosen, ensure_ascii=False).encode("utf-8"))
            print(f"{subset}: wrote {num_photos} of "
                  f"{chosen['info']['minialign_subset']['eligible_photos']} eligible photos "
                  f"(seed {seed})", flush=True)
        vocab = download(vocab_url, root / VOCAB_NAME, sha256=VOCAB_SHA256, progress=progress)
        made = [*paths.values(), subset, vocab]
        if images:
            fetch_photos(subset, root / "train2017", workers, images_url, progress)
            made.append(root / "train2017")
    print("ready: " + ", ".join(str(p) for p in made))
    print("next: `make embeddings` (the DINOv2 embeddings of the subset's photos, once), then "
          "`make replicate`" if images else "next: `make replicate IMAGE_EVAL=off` (text "
          "only), or rerun with --images and `make embeddings`")
