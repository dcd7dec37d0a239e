"""Evaluation decoupled from training: saved caption embeddings x frozen image embeddings.

    python -m minialign evaluate --run DIR [--run DIR ...] [--embeddings PATH] [--json]

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

Results go into DIR/metrics.json under "image_alignment" (written atomically). Without
--embeddings only the text-side metrics are printed, which is not an error; an --embeddings
path that does not exist is an error that names it and the export command that creates it.
"""
import json
import sys
from functools import reduce
from pathlib import Path

import numpy as np

from .embeddings import (check_split_coverage, describe_join, join_on_ids, load_embeddings,
                         model_label, sha256_file)
from ...metrics import DEFAULT_KS, MUTUAL_KNN_K, fit_procrustes, mutual_knn, rotated_recall
from ..run.monitor import text_metrics
from ..run.rundir import (caption_files, check_run_dir, load_caption_slots, read_metrics,
                          read_run_config, update_metrics)

K = MUTUAL_KNN_K          # neighbours in mutual kNN (10, as in the replication)
RECALL_KS = DEFAULT_KS    # caption -> image R@1, R@5, R@10
DEFAULT_EMBEDDINGS = "embeddings/coco_train2017_subset10000_seed0_dinov2-base.npz"  # make embeddings
DEFAULT_SUBSET = "captions_train2017_subset10000_seed0.json"     # make data's file, its captions
EXPORT_COMMAND = ("python -m minialign export --captions {captions} --images {images} "
                  "--model facebook/dinov2-base --out {out}")
SYNTHETIC_FILES = ("captions_synthetic.json", "embeddings_synthetic.npz")  # synthetic.*_NAME


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
    "steps": [{"step", "val": {...}, "test": {...} at the final step}]}.
    every_photo: refuse embeddings that miss any val or test photo of the run
    (embeddings.check_split_coverage) instead of scoring the photos they have.
    Raises ValueError naming run_dir or a file for a bad run, a bad saved file, or image
    embeddings that miss the run's photos or are narrower than the captions."""
    run_dir = check_run_dir(run_dir)
    config = read_run_config(run_dir)
    files = caption_files(run_dir)
    loaded = {path: load_caption_slots(path) for by_split in files.values()
              for path in by_split.values()}
    result = {"run": str(run_dir), "objective": config["objective"], "seed": config["seed"],
              "k": K, "embeddings": None, "join": None, "chance": None,
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
        result["embeddings"] = {"path": str(emb.path), "sha256": sha256_file(emb.path),
                                "model": emb.meta["model"],
                                "revision": emb.meta.get("revision"),
                                "count": int(emb.meta["count"]),
                                "dim": int(emb.meta["dim"])}
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
    """Set metrics.json["image_alignment"] = result less "run" (rundir.update_metrics)."""
    update_metrics(run_dir, "image_alignment", {k: v for k, v in result.items() if k != "run"})


def summary_row(result):
    """One run's headline numbers, from its last step with test metrics (else its last step).
    Image metrics are means over caption slots; paraphrase R@1 is the test split's."""
    entry = next((e for e in reversed(result["steps"]) if "test" in e), result["steps"][-1])
    split = "test" if "test" in entry else "val"
    text = entry[split]["text"]
    row = {"run": result["run"], "objective": result["objective"], "seed": result["seed"],
           "step": entry["step"], "split": split, "paraphrase_R@1": text["paraphrase_R@1"],
           "paraphrase_chance": text["chance"], "std": text["std"],
           "effective_rank": text["effective_rank"]}
    if result["embeddings"] is not None and split == "test":
        test, chance = entry["test"], result["chance"]["test"]
        row.update({"mutual_knn": test["mutual_knn"]["mean"], "mutual_knn_chance":
                    chance["mutual_knn"], "photos": chance["photos"]})
        for k in RECALL_KS:
            row.update({f"R@{k}": test[f"R@{k}"]["mean"], f"R@{k}_chance": chance[f"R@{k}"]})
    return row


def format_table(rows, image):
    """Fixed-width text table: one line per run; "-" where a run has no test step yet."""
    if image:
        cols = [("mutual_knn", f"mkNN@{K}"), ("mutual_knn_chance", "chance"), ("R@1", "R@1"),
                ("R@1_chance", "chance"), ("paraphrase_R@1", "para R@1"),
                ("paraphrase_chance", "chance")]
    else:
        cols = [("paraphrase_R@1", "para R@1"), ("paraphrase_chance", "chance"),
                ("std", "std"), ("effective_rank", "eff rank")]
    header = ["run", "objective", "seed", "step", "split"] + [name for _, name in cols]
    lines = [[r["run"], r["objective"], str(r["seed"]), str(r["step"]), r["split"]]
             + [f"{r[key]:.3f}" if key in r else "-" for key, _ in cols] for r in rows]
    widths = [max(len(line[i]) for line in [header] + lines) for i in range(len(header))]

    def fmt(line):  # run and objective left-aligned, numbers right-aligned
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(line, widths)))
    return "\n".join([fmt(header)] + [fmt(line) for line in lines])


def expected_embeddings(captions):
    """The image embeddings file of the photos of `captions`, named as the README names them:
    DIR/captions_synthetic.json -> DIR/embeddings_synthetic.npz (`python -m minialign
    synthetic` writes both); [DIR/]captions_X.json -> embeddings/coco_X_dinov2-base.npz (make
    data's subset: DEFAULT_EMBEDDINGS; val2017: embeddings/coco_val2017_dinov2-base.npz)."""
    path = Path(captions)
    if path.name == SYNTHETIC_FILES[0]:
        return str(path.with_name(SYNTHETIC_FILES[1]))
    return f"embeddings/coco_{path.stem.removeprefix('captions_')}_dinov2-base.npz"


def images_of(captions):
    """Where the photos of `captions` are, as the README puts them: a train2017 subset's in
    train2017/ beside it (make data), val2017's in coco/val2017 (the by-hand recipe)."""
    name = Path(captions).name
    if "train2017" in name:
        return str(Path(captions).parent / "train2017")
    return "coco/val2017" if "val2017" in name else "<COCO images dir>"


def how_to_export(path, captions):
    """The one-time command that creates the image embeddings file `path` of the photos of
    `captions`, and what to do next, on one line: for a synthetic world its own embeddings
    file (written with its captions; no DINOv2 export, it has no photos), `make embeddings`
    for make data's subset, else the export command."""
    if Path(captions).name == SYNTHETIC_FILES[0]:
        world = expected_embeddings(captions)
        made = f"`python -m minialign synthetic --out {Path(captions).parent}`"
        if path != world:
            return (f"A SYNTHETIC world's image embeddings are {world}, written with its "
                    f"captions by {made}: rerun with --embeddings {world}.")
        how = f"The SYNTHETIC world's embeddings are written with its captions: {made}; "
    elif path == DEFAULT_EMBEDDINGS and Path(captions).name == DEFAULT_SUBSET:
        how = ("Create it once with `make embeddings` (after `make data` and `make "
               "install-export`; see embeddings/README.md), ")
    else:
        command = EXPORT_COMMAND.format(captions=captions, images=images_of(captions), out=path)
        how = (f"Create it once with `{command}` (COCO images + the [export] extra; see "
               f"embeddings/README.md), ")
    return f"{how}then rerun with --embeddings {path}."


def missing_embeddings_note(captions):
    """What to print when --embeddings was omitted for a run trained on `captions`: text-side
    metrics only, not an error; which file would add the image side, and how to make it."""
    path = expected_embeddings(captions)
    how = (f"{path} exists: rerun with --embeddings {path}." if Path(path).is_file()
           else how_to_export(path, captions))
    return (f"image alignment not computed: it needs the frozen DINOv2 image embeddings of the "
            f"run's photos ({captions}) and --embeddings was not given. {how} "
            f"Shown above: the text-side metrics only.")


def check_embeddings_path(path, captions):
    """An explicitly given --embeddings must exist: FileNotFoundError naming it, with the
    export command that creates it, instead of silently falling back to text-only output."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"--embeddings {path}: no such file. "
                                f"{how_to_export(path, captions)}")


def evaluate_runs(run_dirs, embeddings=None, as_json=False):
    """`python -m minialign evaluate`: evaluate every run directory of run_dirs (embeddings:
    the .npz path, or None for the text side only), store image alignment in each metrics.json,
    print a summary (as_json: as JSON).
    Returns the printed summary dict. Raises FileNotFoundError for a run directory or an
    --embeddings file that does not exist, ValueError for a bad run or a corrupt or
    mismatched embeddings file (one missing any val or test photo of a run); omitting
    --embeddings only limits the output to the text side."""
    runs = [check_run_dir(r) for r in run_dirs]              # bad input fails before any work
    configs = [read_run_config(r) for r in runs]              # each config.json, checked
    config = configs[0]
    captions = config.get("captions") or "<captions>"       # for the export command we print
    emb = note = None
    if embeddings is not None:
        check_embeddings_path(embeddings, captions)
        emb = load_embeddings(embeddings)
    else:
        note = missing_embeddings_note(captions)
    if emb is not None:                                      # a bad metrics.json: before work
        for run_dir in runs:
            read_metrics(run_dir)
    results = [evaluate_run(r, emb, write=False, every_photo=True) for r in runs]
    if emb is not None:                                      # every run scored: now write
        for run_dir, result in zip(runs, results):
            write_image_alignment(run_dir, result)
    rows = [summary_row(r) for r in results]
    summary = {"embeddings": results[0]["embeddings"], "k": K, "runs": rows,
               "join": [r["join"] for r in results], "note": note}
    if as_json:
        print(json.dumps(summary, indent=2))
        if note:
            print(note, file=sys.stderr)
        return summary
    if emb is not None:
        for result in results:
            print(f"{result['run']}: {describe_join(result['join'])}")
        made_by = model_label(emb.meta["model"], emb.meta.get("revision"))
        print(f"image embeddings {emb.path} ({made_by}, sha256 "
              f"{results[0]['embeddings']['sha256'][:12]}...); test metrics are means over "
              f"caption slots, R@1 after a Procrustes rotation fitted on the train photos; "
              f"chance: mkNN@{K} = {K}/(N-1), R@1 = 1/N")
    print(format_table(rows, image=emb is not None))
    if note:
        print(note)
    return summary
