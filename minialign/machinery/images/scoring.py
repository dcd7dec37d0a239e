"""Scoring one run: its saved caption embeddings x frozen image embeddings (evaluate.py is
the command around it).

Training writes caption embeddings of the val photos at every evaluation step, and of the
val, test and train photos at the final step, into DIR/captions/<split>_step<step>.npz
(rundir.save_caption_embeddings). This module scores them against the frozen DINOv2 image
embeddings of the same photos (embeddings.py), so training never reads the image file and a
new metric never needs a new training run. For each saved step:

  val  (every step):  mutual kNN@K between captions and images (Huh et al. 2024)
  test (final step):  mutual kNN@K, and caption -> image R@1/5/10 after an orthogonal
                      Procrustes rotation (Schoenemann 1966) fitted on the TRAIN photos
  both:               text-side metrics recomputed from the saved float16 embeddings
                      (paraphrase R@1, collapse std, effective rank; monitor.text_metrics)

Caption slots: every photo has >= 2 captions, slot s = its s-th caption. Image metrics are
computed once per slot, on the photos that have ALL saved slots and an image embedding (the
same N photos for every slot, so one chance level), and reported as {"mean" over slots,
"slot0", "per_slot"} (slot_summary). The rotation W is fitted once per step on ONE
caption per train photo, its slot-0 caption, against that photo's image embedding, and the
same W maps every test slot: the test rows also hold one caption per photo, and the spread
over slots then measures caption wording only, not different fits.

Results go into DIR/metrics.json under "image_alignment", with what they were computed from
(run/scores.py: the embeddings file and the run's checkpoint), written under the run's lock
(score_run; run/runlock.py) from the file's current contents.
"""
from functools import reduce
import sys

import numpy as np

from .embeddings import check_split_coverage, join_on_ids
from ...metrics import DEFAULT_KS, MUTUAL_KNN_K, fit_procrustes, mutual_knn, rotated_recall
from ..run.monitor import text_metrics
from ..run.rundir import (IMAGE_SCORES, caption_files, check_run_dir, load_caption_slots,
                          read_run_config, update_metrics)
from ..run.runlock import hold
from ..run.scores import checkpoint_record, embeddings_record

K = MUTUAL_KNN_K          # neighbours in mutual kNN (10, as in the replication)
RECALL_KS = DEFAULT_KS    # caption -> image R@1, R@5, R@10


def rows_of(ids, wanted):
    """Index of each id of `wanted` (N,) in `ids` (P,): ids[rows_of(ids, wanted)] == wanted."""
    row = {image_id: r for r, image_id in enumerate(ids.tolist())}
    return np.array([row[image_id] for image_id in wanted.tolist()], dtype=np.int64)  # (N,)


def slot_summary(per_slot):
    """One metric's values per caption slot -> {"mean" over slots, "slot0", "per_slot"}."""
    per_slot = [float(v) for v in per_slot]
    return {"mean": float(np.mean(per_slot)), "slot0": per_slot[0], "per_slot": per_slot}


def joined_slots(slots, emb, where):
    """Caption and image rows of the photos that have every slot AND an image embedding.
    slots: [(image_ids (P_s,), z (P_s, D))]; emb: ImageEmbeddings; where: names the split.
    Returns z_slots [(N, D) per slot], img (N, D_img) float32 and a count dict; row i of
    each is the photo with the i-th smallest image id. Raises ValueError if N <= K."""
    with_all_slots = reduce(np.intersect1d, [ids for ids, _ in slots])   # (P_all,) sorted
    cap_idx, emb_idx, _ = join_on_ids(with_all_slots, emb)
    ids = with_all_slots[cap_idx]                                         # (N,)
    if len(ids) <= K:
        raise ValueError(f"{emb.path}: only {len(ids)} of the {len(slots[0][0])} photos of "
                         f"{where} have an embedding; mutual kNN@{K} needs at least {K + 1}")
    z_slots = [z[rows_of(slot_ids, ids)] for slot_ids, z in slots]        # S x (N, D)
    img = emb.embeddings[emb_idx]                                         # (N, D_img)
    counts = {"photos": len(ids), "split_photos": len(slots[0][0]),
              "without_all_slots": len(slots[0][0]) - len(with_all_slots),
              "without_embedding": len(with_all_slots) - len(ids)}
    return z_slots, img, counts


def score_test(z_slots, img, train_slots, emb, where):
    """Caption -> image R@k on the test photos after a rotation fitted on the train photos.
    z_slots: S x (N, D) test captions, img (N, D_img) their images; train_slots as saved.
    W is fitted once, on (slot-0 caption, image) pairs of the train photos
    (metrics.fit_procrustes), and maps every test slot (metrics.rotated_recall).
    Returns {"R@k": {"mean", "slot0", "per_slot"}} (slot_summary)
    and the number of train photos in the fit."""
    train_ids, train_z = train_slots[0]                                   # (P_train,), (P_train, D)
    cap_idx, emb_idx, _ = join_on_ids(train_ids, emb)
    if len(cap_idx) <= train_z.shape[1]:
        print(f"warning: {where}: rotation fitted on {len(cap_idx)} train photos, no more than "
              f"the {train_z.shape[1]} caption dimensions; W is underdetermined", file=sys.stderr)
    rotation = fit_procrustes(train_z[cap_idx], emb.embeddings[emb_idx])  # W, train means
    recalls = [rotated_recall(rotation, z, img, ks=RECALL_KS) for z in z_slots]  # S x {"R@k"}
    return {f"R@{k}": slot_summary(r[f"R@{k}"] for r in recalls) for k in RECALL_KS}, len(cap_idx)


def evaluate_split(slots, emb, train_slots, where):
    """All metrics of one saved split file. slots: the split's captions (load_caption_slots);
    emb: ImageEmbeddings or None (text side only); train_slots: the train captions of the same
    step for the test split's rotation, else None. Returns {"text": {...}, and with emb
    "photos": {...}, "mutual_knn": {"mean", "slot0", "per_slot"}, and with train_slots "R@k"}."""
    out = {"text": text_metrics(dict(enumerate(slots)))}   # slots 0 and 1 hold every photo
    if emb is None:
        return out
    z_slots, img, out["photos"] = joined_slots(slots, emb, where)
    out["mutual_knn"] = slot_summary(mutual_knn(z, img, k=K) for z in z_slots)
    if train_slots is not None:
        recalls, out["photos"]["train_fit"] = score_test(z_slots, img, train_slots, emb, where)
        out.update(recalls)
    return out


def chance_levels(steps):
    """Chance of each image metric, from the last step holding each split (N = photos scored):
    mutual kNN@K ~ K / (N - 1), R@k = k / N."""
    chance = {}
    for entry in steps:
        for split in ("val", "test"):
            if "photos" in entry.get(split, {}):
                n = entry[split]["photos"]["photos"]
                chance[split] = {"photos": n, "mutual_knn": K / (n - 1)}
                if "R@1" in entry[split]:
                    chance[split].update({f"R@{k}": k / n for k in RECALL_KS})
    return chance


def split_photo_ids(files, loaded):
    """{"val": ids, "test": ids}: the slot-0 image ids (every photo has a slot 0) of the last
    saved file of each split, i.e. all photos of the run's val and test splits."""
    ids = {}
    for by_split in files.values():
        ids.update({split: loaded[by_split[split]][0][0] for split in ("val", "test")
                    if split in by_split})
    return ids


def evaluate_run(run_dir, emb, write=True, every_photo=False):
    """Score every saved step of one run. run_dir: a training run directory; emb: loaded
    ImageEmbeddings, or None for the text-side metrics only. With emb and write, the result
    (less "run") is stored in run_dir/metrics.json under "image_alignment".
    Returns {"run", "objective", "seed", "k", "embeddings", "join", "chance", "fit",
    "steps": [{"step", "val": {...}, "test": {...} at the final step}], and with emb
    "checkpoint"}: "embeddings" and "checkpoint" say what the scores were computed from
    (scores.embeddings_record, scores.checkpoint_record). Write only under the run's lock
    (score_run holds it). every_photo: refuse embeddings that miss any val or test photo of
    the run (embeddings.check_split_coverage) instead of scoring the photos they have.
    Raises ValueError naming run_dir or a file for a bad run, a bad saved file, or image
    embeddings that miss the run's photos or are narrower than the captions."""
    run_dir = check_run_dir(run_dir)
    config = read_run_config(run_dir)
    files = caption_files(run_dir)
    loaded = {path: load_caption_slots(path) for by_split in files.values()
              for path in by_split.values()}
    result = {"run": str(run_dir), "objective": config["objective"], "seed": config["seed"],
              "k": K, "embeddings": None, "checkpoint": None, "join": None, "chance": None,
              "fit": "W fitted per step on the slot-0 caption of each train photo vs its image "
                     "embedding; the same W maps every test slot", "steps": []}
    if emb is not None:
        width = next(iter(loaded.values()))[0][1].shape[1]
        if emb.embeddings.shape[1] < width:
            raise ValueError(f"{emb.path}: image embeddings are {emb.embeddings.shape[1]}-d, "
                             f"narrower than the {width}-d captions of {run_dir}")
        if every_photo:
            check_split_coverage(emb, config.get("captions") or "(not recorded)",
                                 split_photo_ids(files, loaded), flag="the run's captions")
        run_ids = np.unique(np.concatenate([ids for slots in loaded.values() for ids, _ in slots]))
        try:
            result["join"] = join_on_ids(run_ids, emb)[2]
        except ValueError as err:
            raise ValueError(f"{run_dir}: {err}") from None
        result["embeddings"] = embeddings_record(emb)
        result["checkpoint"] = checkpoint_record(run_dir, files)     # what was scored
    for step, by_split in files.items():
        entry = {"step": step}
        for split in ("val", "test"):
            if split in by_split:
                if split == "test" and "train" not in by_split:
                    raise ValueError(f"{run_dir}: step {step} has test but no train captions")
                train_slots = loaded[by_split["train"]] if split == "test" else None
                entry[split] = evaluate_split(loaded[by_split[split]], emb, train_slots,
                                              f"{run_dir} {split} step {step}")
        result["steps"].append(entry)
    if emb is not None:
        result["chance"] = chance_levels(result["steps"])
        if write:
            write_image_alignment(run_dir, result)
    return result


def write_image_alignment(run_dir, result):
    """Set metrics.json["image_alignment"] = result less "run" (rundir.update_metrics: from
    the file's current contents). Call it only while holding the run's lock."""
    update_metrics(run_dir, IMAGE_SCORES, {k: v for k, v in result.items() if k != "run"})


def score_run(run_dir, emb, wait=True, tag="[replicate]"):
    """Score one run against `emb` and store the scores, holding the run's lock (waiting for
    it: another writer, e.g. an `evaluate`, finishes within seconds). Returns the result."""
    with hold([run_dir], wait=wait, tag=tag):
        return evaluate_run(run_dir, emb)

