"""COCO 2017 on disk: the caption annotations, the replication's subset, its images.

    python -m minialign data [--root coco] [--num-photos 10000] [--seed 0] [--no-images]
                             [--annotations-url URL] [--images-url URL] [--allow-http]

The replication trains and evaluates on 10,000 photos of COCO train2017 (split 8000 / 1000 /
1000 by data.split_photos) and needs a DINOv2 embedding of exactly those photos. So one file,
the subset, is the photo list of every later step (train, replicate, export):

    coco/annotations/captions_train2017.json, captions_val2017.json, MANIFEST.sha256
    coco/captions_train2017_subset10000_seed0.json   the subset (COCO captions format)
    coco/train2017/000000000009.jpg ...               the subset's photos, and no others

Every step is skipped when its output is already complete, and writes atomically (a
temporary name, then a rename), so Ctrl-C at any point and a rerun lose nothing.

What is trusted: the zip is checked whole (size, then sha256, against the published values)
before anything is extracted, so both captions files are the official ones; every download is
HTTPS at every hop (a plain http:// URL or a redirect to one only with --allow-http, and the
zip's checksum is checked either way); each photo must decode, under Pillow's
decompression-bomb guard, to the width x height that the checked captions file gives it
(photos.py).
"""
import json
import os
import shutil
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .embeddings import sha256_file
from ..run.dirlock import DirLock
from ..run.files import atomic_write_bytes, fsync_dir, read_json
from ..run.monitor import has_word
from ...tokenizer import clean_caption

ANNOTATIONS_URL = "https://images.cocodataset.org/annotations/annotations_trainval2017.zip"
ANNOTATIONS_ZIP = "annotations_trainval2017.zip"     # saved under --root, deleted once extracted
# The official zip, as public projects pin it (torchvision's COCO dataset records the same sha256;
# md5 f4bbac642086de4f52a3fdda2de5fa2c). Tests patch these two to a small zip of their own.
ANNOTATIONS_SIZE = 252_907_541                       # bytes (~241 MiB)
ANNOTATIONS_SHA256 = "113a836d90195ee1f884e704da6304dfaaecff1f023f49b6ca93c4aaae470268"
TRAIN_CAPTIONS = "annotations/captions_train2017.json"  # the two zip members we extract
VAL_CAPTIONS = "annotations/captions_val2017.json"
MANIFEST = "MANIFEST.sha256"      # "sha256  name" lines, as `sha256sum` prints them
TMP_PREFIX = ".annotations.tmp-"  # extraction folder, renamed to annotations/ when verified
COPY_CHUNK_BYTES = 1 << 20        # bytes per read when extracting
MIN_CAPTIONS = 5                  # a subset photo has >= 5 captions (train2017 photos: 5-7)
SUBSET_FORMAT = 1                 # info["minialign_subset"]["format"] written and read here
SUBSET_RULE = (f"photos with >= {MIN_CAPTIONS} captions, >= 2 of them distinct after "
               "minialign.data's cleaning, sorted by id; the first num_photos of "
               "np.random.default_rng(seed).permutation of them, sorted by id")
NUM_EXAMPLES = 10                 # ids quoted in a message


# ---------------------------------------------------------------- the annotations
def manifest_problems(folder):
    """What is wrong with `folder` against its MANIFEST.sha256: a list of one-phrase problems
    ("captions_train2017.json missing", "... damaged (sha256 differs)"), [] if every listed
    file matches, ["no MANIFEST.sha256"] if there is none."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return [f"no {MANIFEST}"]
    problems = []
    for line in filter(str.strip, (folder / MANIFEST).read_text().splitlines()):
        digest, _, name = line.strip().partition("  ")
        if not name:
            problems.append(f"{MANIFEST} unreadable")
        elif not (folder / name).is_file():
            problems.append(f"{name} missing")
        elif sha256_file(folder / name) != digest:
            problems.append(f"{name} damaged (sha256 differs from {MANIFEST})")
    return problems


def write_manifest(folder, names):
    """folder/MANIFEST.sha256 with one "sha256  name" line per file name."""
    lines = "".join(f"{sha256_file(Path(folder) / n)}  {n}\n" for n in names)
    atomic_write_bytes(Path(folder) / MANIFEST, lines.encode())


def check_zip(zip_path, size, sha256):
    """Raise ValueError, one line naming the zip with the expected and the found digest, if
    the file at zip_path is not `size` bytes with sha256 `sha256` (the published values)."""
    found_size = Path(zip_path).stat().st_size
    found = sha256_file(zip_path) if found_size == size else None
    if found != sha256:
        what = f"sha256 {found}" if found else f"{found_size} bytes"
        raise ValueError(f"{zip_path}: {what}, expected {size} bytes with sha256 {sha256} "
                         f"(COCO's published {ANNOTATIONS_ZIP}); a damaged download or another "
                         f"file at --annotations-url")


def extract_captions(zip_path, folder):
    """Extract only the two captions JSON files of a checked zip (check_zip) into `folder`,
    then write folder/MANIFEST.sha256 of both. Raises ValueError, one line naming the zip,
    for an unreadable archive or a missing member."""
    try:
        with zipfile.ZipFile(zip_path) as zf:
            for member in (TRAIN_CAPTIONS, VAL_CAPTIONS):
                with zf.open(member) as src, open(Path(folder) / Path(member).name, "wb") as dst:
                    shutil.copyfileobj(src, dst, COPY_CHUNK_BYTES)
    except (zipfile.BadZipFile, EOFError, zlib.error) as err:
        raise ValueError(f"{zip_path}: not a readable zip archive ({err})") from None
    except KeyError:
        raise ValueError(f"{zip_path}: holds no {member}; not the COCO 2017 annotations") from None
    write_manifest(folder, [Path(m).name for m in (TRAIN_CAPTIONS, VAL_CAPTIONS)])


def get_annotations(root="coco", url=ANNOTATIONS_URL, progress=None, zip_size=None,
                    zip_sha256=None, allow_http=False):
    """COCO 2017 captions in root/annotations/: download once, verify, extract, keep.
    Skipped (no network) when root/annotations/MANIFEST.sha256 matches every file; a damaged
    or missing file is named and the folder extracted again (so is a folder without a
    manifest: files unzipped by hand cannot be checked, the zip can). Otherwise downloads url
    to root/annotations_trainval2017.zip (machinery.download.download: resumes a partial
    .part, and a zip already there of the right size is not fetched again), checks it whole
    (check_zip) BEFORE extracting anything, extracts the two captions files into a fresh
    folder root/.annotations.tmp-<random> and renames it to root/annotations (never
    half-extracted), then deletes the zip.
    zip_size, zip_sha256: the expected zip (None: ANNOTATIONS_SIZE, ANNOTATIONS_SHA256).
    allow_http: follow a redirect from https:// to http:// (refused otherwise, nothing kept).
    Returns {"train": path, "val": path}. Raises ValueError (another or damaged zip: deleted,
    nothing extracted, so a rerun downloads it again) or OSError (network, disk), one line."""
    zip_size, zip_sha256 = zip_size or ANNOTATIONS_SIZE, zip_sha256 or ANNOTATIONS_SHA256
    root, final = Path(root), Path(root) / "annotations"
    paths = {"train": final / Path(TRAIN_CAPTIONS).name, "val": final / Path(VAL_CAPTIONS).name}
    for stale in root.glob(TMP_PREFIX + "*"):       # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    if final.is_dir():
        problems = manifest_problems(final)
        if not problems:
            print(f"{final}: complete ({MANIFEST} matches), skipped", flush=True)
            return paths
        print(f"{final}: {'; '.join(problems)}; extracting the captions again from the "
              f"checked zip", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    zip_path = root / ANNOTATIONS_ZIP
    from . import download                           # lazily: only this step needs the network
    download.download(url, zip_path, expected_size=zip_size, progress=progress,
                      allow_http=allow_http)
    try:
        check_zip(zip_path, zip_size, zip_sha256)
    except ValueError as err:
        zip_path.unlink(missing_ok=True)
        raise ValueError(f"{err}; deleted it, nothing extracted (rerun to download it "
                         f"again)") from None
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=root))
    try:
        try:
            extract_captions(zip_path, tmp)
        except ValueError as err:
            zip_path.unlink(missing_ok=True)
            raise ValueError(f"{err}; deleted it, rerun `make data` to download it "
                             f"again") from None
        if final.exists():                           # a damaged one: keep files not ours
            for extra in final.iterdir():
                if not (tmp / extra.name).exists():
                    os.replace(extra, tmp / extra.name)
            os.replace(final, tmp.with_name(tmp.name + "-old"))
        os.replace(tmp, final)
        fsync_dir(root)
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-old")):
            shutil.rmtree(leftover, ignore_errors=True)
    zip_path.unlink()
    print(f"{final}: extracted from {zip_path} (sha256 {zip_sha256[:12]}..., as published); "
          f"deleted the zip", flush=True)
    return paths


# ---------------------------------------------------------------- the subset
def subset_path(root="coco", num_photos=10000, seed=0):
    """Default subset file: root/captions_train2017_subset{num_photos}_seed{seed}.json."""
    return Path(root) / f"captions_train2017_subset{num_photos}_seed{seed}.json"


def eligible_photos(coco):
    """The "images" records of a parsed COCO captions dict that have >= MIN_CAPTIONS
    annotations, at least 2 of them distinct after cleaning (tokenizer.clean_caption, with a
    word), so that monitor.load_coco_captions keeps each of them. Sorted by id."""
    by_photo = {}
    for ann in coco["annotations"]:
        by_photo.setdefault(ann["image_id"], []).append(ann["caption"])

    def two_distinct(captions):          # cleans only until two distinct captions are seen
        seen = set()
        for caption in map(clean_caption, captions):
            if has_word(caption):
                seen.add(caption)
                if len(seen) == 2:
                    return True
        return False
    return sorted((img for img in coco["images"] if len(by_photo.get(img["id"], ())) >=
                   MIN_CAPTIONS and two_distinct(by_photo[img["id"]])), key=lambda img: img["id"])


def choose_subset(coco, num_photos=10000, seed=0, where="captions file"):
    """A seeded subset of a parsed COCO captions dict, as a COCO captions dict.
    Eligible: the photos with at least MIN_CAPTIONS = 5 captions (eligible_photos; every
    train2017 photo has 5-7). Chosen: the first num_photos of
    np.random.default_rng(seed).permutation of the id-sorted eligible photos, sorted by id.
    Returns {"info": coco's info + "minialign_subset": {num_photos, seed, eligible_photos,
    rule, format}, "licenses", "images": the chosen records (all their fields), "annotations":
    theirs, in file order}. Raises ValueError naming `where` if num_photos > eligible photos."""
    eligible = eligible_photos(coco)
    if not 1 <= num_photos <= len(eligible):
        raise ValueError(f"{where}: cannot choose {num_photos} photos, only {len(eligible)} "
                         f"of its {len(coco['images'])} photos have >= {MIN_CAPTIONS} captions; "
                         f"pass --num-photos {len(eligible)} or fewer")
    order = np.random.default_rng(seed).permutation(len(eligible))[:num_photos]  # (num_photos,)
    images = [eligible[i] for i in np.sort(order)]
    chosen = {img["id"] for img in images}
    info = dict(coco.get("info") or {})
    info["minialign_subset"] = {"num_photos": num_photos, "seed": seed,
                                "eligible_photos": len(eligible), "rule": SUBSET_RULE,
                                "format": SUBSET_FORMAT}
    return {"info": info, "licenses": coco.get("licenses", []), "images": images,
            "annotations": [a for a in coco["annotations"] if a["image_id"] in chosen]}


def write_subset(captions_path, out_path, num_photos=10000, seed=0):
    """Write the subset (choose_subset) of a COCO captions JSON to out_path, atomically.
    info["minialign_subset"] also records source_file (its name) and source_sha256. The
    bytes depend only on the source file's bytes, num_photos and seed (keys in COCO's order).
    Returns out_path. Raises FileNotFoundError / ValueError naming the file that is missing,
    not COCO captions JSON, or has too few eligible photos."""
    coco = read_json(captions_path, "COCO captions JSON")
    if not isinstance(coco.get("images"), list) or not isinstance(coco.get("annotations"), list):
        raise ValueError(f"{captions_path}: not COCO captions format (no 'images' and "
                         f"'annotations' lists)")
    subset = choose_subset(coco, num_photos, seed, where=str(captions_path))
    subset["info"]["minialign_subset"].update(source_file=Path(captions_path).name,
                                              source_sha256=sha256_file(captions_path))
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_path, json.dumps(subset, ensure_ascii=False).encode("utf-8"))
    return Path(out_path)


def read_subset_info(path):
    """info["minialign_subset"] of a subset file, or None for any other captions JSON.
    Raises FileNotFoundError / ValueError (one line naming it) if it is missing or not JSON."""
    info = read_json(path, "COCO captions JSON").get("info")
    return info.get("minialign_subset") if isinstance(info, dict) else None


def ensure_subset(captions_path, out_path, num_photos, seed, force=False):
    """write_subset unless out_path already holds this very subset (same num_photos, seed and
    source sha256): then it is skipped. Another subset at out_path is refused (ValueError,
    one line) unless force. Returns out_path."""
    if Path(out_path).exists():
        info = read_subset_info(out_path) or {}
        want = {"num_photos": num_photos, "seed": seed,
                "source_sha256": sha256_file(captions_path)}
        found = {key: info.get(key) for key in want}
        if found == want:
            print(f"{out_path}: subset complete ({num_photos} photos, seed {seed}), skipped",
                  flush=True)
            return Path(out_path)
        if not force:
            raise ValueError(f"{out_path}: holds another subset ({found}, wanted {want}); "
                             f"pass --force to replace it")
    write_subset(captions_path, out_path, num_photos, seed)
    info = read_subset_info(out_path)
    print(f"{out_path}: wrote {num_photos} of {info['eligible_photos']} eligible photos "
          f"(seed {seed})", flush=True)
    return Path(out_path)


# ---------------------------------------------------------------- the images, and the command
def fetch_subset_images(subset, images_dir, workers=8, progress=None, images_url=None,
                        allow_http=False):
    """Download the subset file's photos into images_dir (photos.fetch_images: over HTTPS
    from images_url, None: photos.IMAGES_URL, unless allow_http).
    Raises OSError, one line naming the ids that failed and why, if any photo failed."""
    from . import photos                             # lazily: only this step needs the network
    records = read_json(subset, "COCO captions JSON")["images"]
    result = photos.fetch_images(records, images_dir, workers=workers, progress=progress,
                                 images_url=images_url, allow_http=allow_http)
    failed = result["failed"]
    if failed:
        ids = sorted(failed)
        reasons = sorted(set(failed.values()))
        raise OSError(f"{len(ids)} photos could not be fetched: ids {ids[:NUM_EXAMPLES]}"
                      f"{' ...' if len(ids) > NUM_EXAMPLES else ''} ({'; '.join(reasons[:3])}); "
                      f"rerun `make data` to retry")
    redirected = result.get("redirected_to_http", 0)
    print(f"{images_dir}: {result['fetched']} photos fetched, {result['already_present']} "
          f"already present" + (f" ({redirected} through a redirect to plain http://, followed: "
                                f"--allow-http)" if redirected else ""), flush=True)


def run_data(root, num_photos, seed, images, workers, annotations_url, force,
             images_url=None, allow_http=False, vocab_url=None):
    """`python -m minialign data`: annotations -> subset -> BERT's vocabulary (bert_vocab) ->
    the subset's images; prints what to run next. An http:// --annotations-url, --images-url
    or --vocab-url is refused before anything is written unless allow_http, which is then
    repeated in one line. One process at a time per --root (dirlock.DirLock)."""
    from .bert_vocab import VOCAB_URL, get_vocab
    from .download import refuse_http
    vocab_url = vocab_url or VOCAB_URL
    refuse_http("--annotations-url", annotations_url, allow_http)
    refuse_http("--images-url", images_url, allow_http)
    refuse_http("--vocab-url", vocab_url, allow_http)
    if allow_http:
        print("--allow-http: plain http:// URLs are used as given, and redirects to them "
              "followed (the zip is still checked against its published sha256 "
              f"{ANNOTATIONS_SHA256[:12]}..., each photo against its width x height)", flush=True)
    with DirLock(root):
        paths = get_annotations(root, annotations_url, allow_http=allow_http)
        subset = ensure_subset(paths["train"], subset_path(root, num_photos, seed),
                               num_photos, seed, force)
        made = [paths["train"], paths["val"], subset, get_vocab(root, vocab_url, allow_http)]
        if images:
            fetch_subset_images(subset, root / "train2017", workers, images_url=images_url,
                                allow_http=allow_http)
            made.append(root / "train2017")
    print("ready: " + ", ".join(str(p) for p in made))
    print("next: `make embeddings` (the DINOv2 embeddings of the subset's photos, once), "
          "then `make replicate`" if images else
          "next: `make replicate IMAGE_EVAL=off` (text only), or rerun with --images and "
          "`make embeddings`")
