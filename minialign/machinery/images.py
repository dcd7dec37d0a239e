"""Image scores of a run, computed when asked and never stored: its saved caption embeddings
(captions/<split>_step*.npz) against ONE image-embeddings file.

The embeddings file (export.py and synthetic.py write it; np.load(path, allow_pickle=False)):
    image_ids   (N,)        integer, unique: the photos' image ids
    embeddings  (N, D_img)  float, finite: row i is photo image_ids[i]
    meta        ()          optional unicode JSON object (model, revision, count = N, dim, ...)
Captions are joined to images by image id; slot s of a split holds each photo's s-th caption.
On the N photos having every slot, means over slots: mutual_knn (mutual kNN@K with the images)
and R@1, R@5, R@10 (test: caption -> image after the rotation fitted on the train photos' slot-0
captions). paraphrase_R@1: slot 0 finds slot 1 of its photo; std, effective_rank, collapsed:
metrics.collapse_stats of slot 0. chance: mutual kNN K / (N - 1), R@k k / N, paraphrase 1 / P.
"""
import json
import sys
import zipfile
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path

import numpy as np

from ..metrics import (DEFAULT_KS, MUTUAL_KNN_K, collapse_stats, fit_procrustes, knn_indices,
                       paraphrase_r_at_1, rotated_recall)
from .runs import md_table, caption_files, load_caption_slots, read_json

K = MUTUAL_KNN_K
IMAGE_KEYS = ("mutual_knn",) + tuple(f"R@{k}" for k in DEFAULT_KS)


@dataclass(frozen=True, eq=False)
class Embeddings:
    """One embeddings file, rows sorted by image id; the arrays are read-only."""
    path: Path
    image_ids: np.ndarray    # (N,) int64, ascending, unique
    embeddings: np.ndarray   # (N, D_img) float32, finite
    meta: dict               # {} when the file has none
    knn_masks: dict = field(default_factory=dict, repr=False)   # {ids.tobytes(): knn_mask}


def load_embeddings(path):
    """Read and check an embeddings file; FileNotFoundError / ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such embeddings file (`make embeddings` exports "
                                f"COCO's; `python -m minialign synthetic` writes a world's)")
    if not zipfile.is_zipfile(path):        # np.load would talk about pickles
        raise ValueError(f"{path}: not an .npz (zip) archive; corrupt, truncated, or not an "
                         f"embeddings file")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        meta = json.loads(str(arrays.get("meta", "{}")))
    except json.JSONDecodeError:
        meta = None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path}: cannot read the .npz (corrupt or truncated?): {err}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: meta must be a 0-d string holding a JSON object")
    ids, emb = arrays.get("image_ids"), arrays.get("embeddings")
    if (ids is None or emb is None or ids.ndim != 1 or ids.dtype.kind not in "iu" or emb.ndim != 2
            or emb.dtype.kind != "f" or len(emb) != len(ids)
            or (meta.get("count", len(emb)), meta.get("dim", emb.shape[1])) != emb.shape):
        got = ", ".join(f"{k} {a.shape} {a.dtype}" for k, a in arrays.items() if k != "meta")
        raise ValueError(f"{path}: expected image_ids (N,) integer, embeddings (N, D) float and "
                         f"meta's count = N, dim = D if any; got {got}, meta's count = "
                         f"{meta.get('count')}, dim = {meta.get('dim')}")
    bad = ~np.isfinite(emb).all(axis=1)
    if bad.any():
        raise ValueError(f"{path}: {bad.sum()} of {len(emb)} embedding rows hold NaN or Inf "
                         f"(image ids {ids[bad][:5].tolist()} ...)")
    ids, order, counts = np.unique(ids, return_index=True, return_counts=True)   # ids sorted
    if (counts > 1).any():
        raise ValueError(f"{path}: image ids occur more than once (e.g. "
                         f"{ids[counts > 1][:5].tolist()})")
    ids, emb = ids.astype(np.int64), emb[order].astype(np.float32)
    ids.setflags(write=False)
    emb.setflags(write=False)
    return Embeddings(path, ids, emb, meta)


def positions(haystack, needles):
    """The index (N,) int64 of each of needles (N,) in haystack (P,) of unique ids, or -1."""
    index = {h: i for i, h in enumerate(haystack.tolist())}
    return np.array([index.get(n, -1) for n in needles.tolist()], dtype=np.int64)


def images_of(emb, ids, where):
    """The rows (N, D_img) of image ids `ids` (N,); ValueError naming the file if any is absent."""
    rows = positions(emb.image_ids, ids)
    if (rows < 0).any():
        raise ValueError(f"{emb.path}: {(rows < 0).sum()} of the {len(ids)} photos of {where} "
                         f"have no embedding (e.g. image ids {ids[rows < 0][:5].tolist()}); "
                         f"the file was made from another captions file")
    return emb.embeddings[rows]


def knn_mask(x):
    """(N, N) bool: row i marks metrics.knn_indices(x, K)[i], the K rows of x (N, D) nearest
    to row i, as metrics.mutual_knn builds it."""
    mask = np.zeros((len(x), len(x)), dtype=bool)
    mask[np.arange(len(x))[:, None], knn_indices(x, K)] = True
    return mask


def mean_mutual_knn(ids, z_slots, emb, where):
    """Mean over slots of mutual kNN@K of captions z (N, D) with the images of `ids` (N,)."""
    if (key := ids.tobytes()) not in emb.knn_masks:
        emb.knn_masks[key] = knn_mask(images_of(emb, ids, where))
    return float(np.mean([np.mean(np.sum(knn_mask(z) & emb.knn_masks[key], axis=1) / K)
                          for z in z_slots]))


def slot_rows(slots):
    """The photos having every saved slot: ids (N,) ascending and each slot's z (N, D)."""
    ids = reduce(np.intersect1d, [ids for ids, _ in slots])                   # (N,) sorted
    return ids, [z[positions(slot_ids, ids)] for slot_ids, z in slots]


def score_split(slots, emb=None, train_slots=None, where="the split"):
    """The scores of one split's load_caption_slots (module docstring); "mutual_knn" if emb (else
    the text side only), "R@k" if train_slots (the train file's, same step)."""
    (ids0, z0), (ids1, z1) = slots[0], slots[1]
    z1 = z1[positions(ids1, ids0)]                  # every photo has slots 0 and 1
    out = {"photos": len(z0), "paraphrase_R@1": paraphrase_r_at_1(z0, z1),
           **{k: v for k, v in collapse_stats(z0).items() if k != "collapse_std_threshold"},
           "chance": {"paraphrase_R@1": 1.0 / len(z0)}}
    if emb is None:
        return out
    if emb.embeddings.shape[1] < z0.shape[1]:
        raise ValueError(f"{emb.path}: image embeddings are {emb.embeddings.shape[1]}-d, "
                         f"narrower than the {z0.shape[1]}-d captions of {where}")
    ids, z_slots = slot_rows(slots)
    if len(ids) <= K:
        raise ValueError(f"{where}: {len(ids)} photos have every caption slot; mutual kNN@{K} "
                         f"needs at least {K + 1}")
    out["mutual_knn"] = mean_mutual_knn(ids, z_slots, emb, where)
    out["chance"]["mutual_knn"] = K / (len(ids) - 1)
    if train_slots is not None:
        train_ids, train_z = train_slots[0]
        rotation = fit_procrustes(train_z, images_of(emb, train_ids, f"{where} (train)"))
        img = images_of(emb, ids, where)                                      # (N, D_img)
        recalls = [rotated_recall(rotation, z, img) for z in z_slots]
        for k in DEFAULT_KS:
            out[f"R@{k}"] = float(np.mean([r[f"R@{k}"] for r in recalls]))
            out["chance"][f"R@{k}"] = k / len(ids)
    return out


def score_run(run_dir, emb=None, step=None):
    """{"step", "val": score_split, and "test" (with R@k) if saved at `step`} at `step` (default:
    the last); emb: as score_split."""
    files = {split: caption_files(run_dir, split) for split in ("val", "test", "train")}
    if not files["val"]:
        raise ValueError(f"{run_dir}: not a run directory (no captions/val_step*.npz)")
    step = max(files["val"]) if step is None else step
    if step not in files["val"]:
        raise ValueError(f"{run_dir}: no captions saved at step {step} (steps "
                         f"{list(files['val'])})")
    out = {"step": step, "val": score_split(load_caption_slots(files["val"][step]), emb,
                                            where=f"{run_dir} val")}
    if step in files["test"]:
        train = load_caption_slots(files["train"][step]) if emb is not None else None
        out["test"] = score_split(load_caption_slots(files["test"][step]), emb, train,
                                  where=f"{run_dir} test")
    return out


def curve(run_dir, emb):
    """{"step": [...], "mutual_knn": [...]}: val mutual kNN@K at every step that saved val."""
    files = caption_files(run_dir, "val")
    return {"step": list(files), "mutual_knn": [
        mean_mutual_knn(*slot_rows(load_caption_slots(path)), emb, f"{run_dir} val")
        for path in files.values()]}


def run_evaluate(runs, embeddings=None):
    """`python -m minialign evaluate`: each run's last scores as a table (text side only without
    embeddings), every input read before anything is printed. Returns the rows."""
    emb = None if embeddings is None else load_embeddings(embeddings)
    rows = []
    for run_dir in runs:
        scores = score_run(run_dir, emb)
        config = read_json(Path(run_dir) / "config.json").get("config", {})
        split = "test" if "test" in scores else "val"
        rows.append({"run": str(run_dir), "objective": config.get("objective", "?"),
                     "seed": config.get("seed", "?"), "step": scores["step"], "split": split,
                     **{k: v for k, v in scores[split].items() if k != "chance"},
                     **{f"{k}_chance": v for k, v in scores[split]["chance"].items()}})
    columns = ["run", "objective", "seed", "step", "split"] + (
        ["paraphrase_R@1", "paraphrase_R@1_chance", "std", "effective_rank"] if emb is None else
        ["mutual_knn", "mutual_knn_chance", "R@1", "R@1_chance", "paraphrase_R@1",
         "paraphrase_R@1_chance"])
    if emb is not None:
        made = emb.meta.get("model", "model not recorded") + (
            f" at revision {emb.meta['revision']}" if emb.meta.get("revision") else "")
        print(f"image embeddings {emb.path} ({made}); mutual kNN@{K}; means over caption "
              f"slots; R@1: caption -> image after a rotation fitted on the train photos")
    cells = [[f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k, "-"))
              for k in columns] for r in rows]
    print("\n".join(md_table(columns, cells, "llrrl" + "r" * (len(columns) - 5))))
    if emb is None:
        print("text side only: give --embeddings FILE for mutual kNN and R@k", file=sys.stderr)
    return rows
