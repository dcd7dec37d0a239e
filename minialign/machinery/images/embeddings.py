"""The frozen image-embeddings file: one .npz written once by export.py, read by every run.

Format (see embeddings/README.md), read with np.load(path, allow_pickle=False):
    image_ids   (N,)          int64    COCO image ids, unique
    embeddings  (N, D_img)    float32  row i is the DINOv2 embedding of photo image_ids[i]
    meta        ()            unicode  a JSON object: model, revision, preprocessing, pooling,
                                       dtype, count (= N), dim (= D_img), captions_sha256, ...
A file made by another tool with only image_ids (any integer dtype) and embeddings (float16,
32 or 64) is read too, with a note on stderr: its meta is then NO_META (model unknown).
Numpy only: this module never imports torch or transformers.
"""
from __future__ import annotations

import json
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..run.files import atomic_savez, sha256_file

ARRAY_KEYS = ("image_ids", "embeddings", "meta")  # the three arrays of a file save_embeddings wrote
REQUIRED_KEYS = ("image_ids", "embeddings")       # what a file from another tool must hold
NO_META_MODEL = "unknown (no meta in file)"       # meta["model"] of a file without meta
NO_REVISION = "revision not recorded"             # said of a file whose meta has no revision
# meta keys the caller of save_embeddings must give; count, dim and dtype are filled in here
CALLER_META_KEYS = ("model", "preprocessing", "pooling", "captions_sha256")
META_KEYS = CALLER_META_KEYS + ("dtype", "count", "dim")  # meta keys every file must hold
EMBEDDING_DTYPE = np.float32   # stored dtype of the embeddings
NUM_EXAMPLES = 5               # ids quoted in error messages and join reports


@dataclass(frozen=True)
class ImageEmbeddings:
    """One loaded embeddings file. The arrays are read-only views of what was stored."""
    path: Path
    image_ids: np.ndarray   # (N,) int64, unique
    embeddings: np.ndarray  # (N, D_img) float32, finite
    meta: dict              # the parsed JSON; meta["count"] == N, meta["dim"] == D_img


def examples(values, n=NUM_EXAMPLES):
    """The first n values as plain Python ints, for messages and JSON reports."""
    return [int(v) for v in list(values)[:n]]


def check_arrays(image_ids, embeddings, where):
    """Shared checks of save and load; `where` (a file name) starts every message.
    image_ids: (N,) integer; embeddings: (N, D) float. Raises ValueError on wrong rank or
    dtype, a row count mismatch, non-finite rows, or duplicate ids."""
    if image_ids.ndim != 1 or image_ids.dtype.kind not in "iu":
        raise ValueError(f"{where}: image_ids must be a 1-D integer array, "
                         f"got shape {image_ids.shape} dtype {image_ids.dtype}")
    if embeddings.ndim != 2:
        raise ValueError(f"{where}: embeddings must be 2-D (N, D), got shape {embeddings.shape}")
    if embeddings.dtype.kind != "f":
        raise ValueError(f"{where}: embeddings must be floating point, got dtype {embeddings.dtype}")
    if embeddings.shape[0] != image_ids.shape[0]:
        raise ValueError(f"{where}: {image_ids.shape[0]} image_ids but "
                         f"{embeddings.shape[0]} embedding rows")
    bad_rows = ~np.isfinite(embeddings).all(axis=1)                       # (N,) bool
    if bad_rows.any():
        raise ValueError(f"{where}: {int(bad_rows.sum())} of {embeddings.shape[0]} embedding "
                         f"rows hold NaN or Inf (image ids {examples(image_ids[bad_rows])} ...)")
    unique_ids, counts = np.unique(image_ids, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"{where}: {int((counts > 1).sum())} image ids occur more than once "
                         f"(e.g. {examples(unique_ids[counts > 1])})")


def save_embeddings(path, image_ids, embeddings, meta, force=False):
    """Write an embeddings file atomically: a temporary file in the same folder, then
    os.replace, so `path` is either absent, its old self, or complete.
    image_ids: (N,) integer, unique; embeddings: (N, D) floating, finite, stored as float32.
    meta: JSON-serialisable dict with at least CALLER_META_KEYS; "dtype", "count" and "dim"
    are filled in from the arrays (a given value that disagrees is an error).
    Returns the Path written. Raises FileExistsError if path exists and not force,
    ValueError for bad arrays or meta (nothing is written then)."""
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(f"{path} already exists; pass force=True (--force) to replace it")
    image_ids, embeddings = np.asarray(image_ids), np.asarray(embeddings)
    check_arrays(image_ids, embeddings, where=str(path))
    if image_ids.shape[0] == 0:
        raise ValueError(f"{path}: no embeddings to save")
    missing = [k for k in CALLER_META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"{path}: meta lacks {missing}")
    shape_meta = {"dtype": np.dtype(EMBEDDING_DTYPE).name,
                  "count": int(embeddings.shape[0]), "dim": int(embeddings.shape[1])}
    for key, value in shape_meta.items():
        if key in meta and meta[key] != value:
            raise ValueError(f"{path}: meta[{key!r}] = {meta[key]!r} but the arrays give {value!r}")
    try:
        meta_json = json.dumps({**meta, **shape_meta}, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: meta is not JSON-serialisable: {err}") from err
    arrays = {"image_ids": image_ids.astype(np.int64),                    # (N,)
              "embeddings": embeddings.astype(EMBEDDING_DTYPE),           # (N, D)
              "meta": np.array(meta_json)}                                # () unicode
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_savez(path, arrays)
    return path


def read_npz(path):
    """The arrays of ARRAY_KEYS in an .npz as a dict ("meta" only if the file has it);
    ValueError naming the file if it is not a zip archive (corrupt, truncated, a plain .npy),
    an entry is unreadable or holds pickled objects, or one of REQUIRED_KEYS is missing."""
    if not zipfile.is_zipfile(path):  # checked first: np.load would talk about pickles
        raise ValueError(f"{path}: not an .npz (zip) archive; corrupt, truncated, "
                         f"or not an embeddings file")
    unreadable = (OSError, ValueError, EOFError, zipfile.BadZipFile)
    try:
        with np.load(path, allow_pickle=False) as npz:
            names = sorted(npz.files)
            arrays = {k: npz[k] for k in ARRAY_KEYS if k in names}
    except unreadable as err:
        raise ValueError(f"{path}: cannot read the .npz (corrupt or truncated?): {err}") from err
    missing = [k for k in REQUIRED_KEYS if k not in arrays]
    if missing:
        raise ValueError(f"{path}: lacks arrays {missing} (has {names})")
    return arrays


def parse_meta(meta_array, path):
    """The JSON object in a 0-d unicode array; ValueError naming the file otherwise."""
    if meta_array.ndim != 0 or meta_array.dtype.kind != "U":
        raise ValueError(f"{path}: meta must be a 0-d unicode array, "
                         f"got shape {meta_array.shape} dtype {meta_array.dtype}")
    try:
        meta = json.loads(str(meta_array))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: meta is not valid JSON: {err}") from err
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: meta must be a JSON object, got {type(meta).__name__}")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"{path}: meta lacks {missing}")
    return meta


def load_embeddings(path):
    """Read and check an embeddings file. Returns ImageEmbeddings with image_ids (N,) int64
    and embeddings (N, D_img) float32, both read-only.
    A file without the meta entry (another tool's np.savez) is accepted with a note on
    stderr; its meta is {"model": NO_META_MODEL, dtype, count, dim, the rest None}.
    Raises FileNotFoundError if path is absent; ValueError naming the file if it is not an
    .npz, lacks image_ids or embeddings, has a meta that is malformed or lacks keys, has
    wrong ranks or a non-float dtype, NaN/Inf rows, duplicate ids, or a count, dim or dtype
    that disagrees with meta."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such embeddings file (embeddings/README.md "
                                f"says how to make it)")
    arrays = read_npz(path)
    image_ids, embeddings = arrays["image_ids"], arrays["embeddings"]
    if "meta" in arrays:
        meta = parse_meta(arrays["meta"], path)
    check_arrays(image_ids, embeddings, where=str(path))
    if "meta" not in arrays:                     # made by another tool: say what is unknown
        meta = {"model": NO_META_MODEL, "revision": None, "preprocessing": None, "pooling": None,
                "captions_sha256": None, "dtype": embeddings.dtype.name,
                "count": int(embeddings.shape[0]), "dim": int(embeddings.shape[1])}
        print(f"note: {path}: has no meta entry (model, preprocessing unknown); using its "
              f"{meta['count']} x {meta['dim']} {meta['dtype']} embeddings as float32",
              file=sys.stderr)
    stored = {"dtype": embeddings.dtype.name, "count": embeddings.shape[0],
              "dim": embeddings.shape[1]}
    for key, value in stored.items():
        if meta[key] != value:
            raise ValueError(f"{path}: meta says {key} = {meta[key]!r} but the stored "
                             f"embeddings have {key} = {value!r}")
    image_ids = image_ids.astype(np.int64)                                # (N,)
    embeddings = embeddings.astype(EMBEDDING_DTYPE)                       # (N, D_img)
    image_ids.setflags(write=False)
    embeddings.setflags(write=False)
    return ImageEmbeddings(path=path, image_ids=image_ids, embeddings=embeddings, meta=meta)


def model_label(model, revision):
    """The model and the revision of its weights, for a log line or results.md:
    "facebook/dinov2-base at revision f9e44c8...415" (in full), or "... (revision not
    recorded)" for a file exported without one (another tool's, or an older export); a
    synthetic world's file, which no weights made, is named alone."""
    if revision:
        return f"{model} at revision {revision}"
    return model if str(model).startswith("synthetic") else f"{model} ({NO_REVISION})"


def join_on_ids(caption_image_ids, emb):
    """Pair captions with embedding rows by COCO image id.
    caption_image_ids: (M,) integer, the image id of each caption (repeats allowed).
    emb: ImageEmbeddings. Returns caption_index (K,) int64 ascending and emb_index (K,) int64
    with caption_image_ids[caption_index] == emb.image_ids[emb_index], plus a report dict:
    matched_captions (K), matched_images, caption_ids_only / embedding_ids_only (distinct ids
    found on one side only) with up to NUM_EXAMPLES sorted *_examples each, and file.
    Raises ValueError naming the file if no id matches."""
    caption_image_ids = np.asarray(caption_image_ids)
    if caption_image_ids.ndim != 1 or caption_image_ids.dtype.kind not in "iu":
        raise ValueError(f"caption_image_ids must be a 1-D integer array, got shape "
                         f"{caption_image_ids.shape} dtype {caption_image_ids.dtype}")
    ids = caption_image_ids.tolist()                                      # M Python ints
    row_of_id = {image_id: row for row, image_id in enumerate(emb.image_ids.tolist())}
    caption_index = [i for i, image_id in enumerate(ids) if image_id in row_of_id]
    emb_index = [row_of_id[ids[i]] for i in caption_index]
    caption_ids, emb_ids = set(ids), set(row_of_id)
    caption_only, emb_only = sorted(caption_ids - emb_ids), sorted(emb_ids - caption_ids)
    report = {"file": str(emb.path),
              "matched_captions": len(caption_index),
              "matched_images": len(caption_ids & emb_ids),
              "caption_ids_only": len(caption_only),
              "caption_ids_only_examples": examples(caption_only),
              "embedding_ids_only": len(emb_only),
              "embedding_ids_only_examples": examples(emb_only)}
    if not caption_index:
        raise ValueError(f"{emb.path}: none of the {len(caption_ids)} caption image ids "
                         f"(e.g. {examples(sorted(caption_ids))}) is among its "
                         f"{len(emb_ids)} image ids (e.g. {examples(sorted(emb_ids))}); "
                         f"were the embeddings exported from another COCO split?")
    return (np.array(caption_index, dtype=np.int64),                      # (K,)
            np.array(emb_index, dtype=np.int64),                          # (K,)
            report)


def describe_join(report):
    """One line for a log: how many captions and photos joined, and what was left out."""
    left = [f"{report[key]} {what}" + (f" (e.g. {report[key + '_examples']})" if report[key] else "")
            for key, what in (("caption_ids_only", "captioned photos have no embedding"),
                              ("embedding_ids_only", "embedded photos have no caption"))]
    return (f"{report['file']}: {report['matched_captions']} captions of "
            f"{report['matched_images']} photos joined; " + ", ".join(left))


def check_split_coverage(emb, captions, split_ids, flag="--captions"):
    """Refuse embeddings that miss photos of a run's val or test split, before any work.
    emb: ImageEmbeddings; captions: the run's captions JSON path; split_ids: {"val": (P_val,),
    "test": (P_test,)} integer image ids (data.split_photos of those captions); flag: how the
    message names the captions ("--captions", or "the run's captions").
    Raises ValueError, one line starting with emb.path: which captions file the embeddings
    were made from (meta captions_file, captions_sha256), how many photos of each split have
    no embedding, and the command that makes the right file (`make embeddings`)."""
    missing = {name: int(np.isin(ids, emb.image_ids, invert=True).sum())
               for name, ids in split_ids.items()}
    if not any(missing.values()):
        return
    counts = " and ".join(f"{n} of the {len(split_ids[name])} {name} photos"
                          for name, n in sorted(missing.items(), key=lambda kv: kv[0] != "test")
                          if n)
    made_sha, sha = emb.meta.get("captions_sha256"), None
    if Path(captions).is_file():
        sha = sha256_file(captions)
    theirs = f"{flag} {captions} (sha256 {sha[:12] + '...' if sha else 'unknown: file not found'})"
    if not emb.meta.get("captions_file") and not made_sha:
        made = "made from an unknown captions file, and for"
    elif made_sha == sha:
        made = (f"made from this same captions file but only from some of its photos "
                f"(num_photos {emb.meta.get('num_photos')}), so for")
    else:
        made = (f"made from {emb.meta.get('captions_file') or 'a captions file'} (sha256 "
                f"{(made_sha or 'unknown')[:12]}...), but")
        theirs += " is another file:"
    raise ValueError(f"{emb.path}: {made} {theirs} {counts} have no embedding; export the "
                     f"embeddings from {captions} (`make embeddings`)")
