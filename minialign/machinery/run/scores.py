"""What a run's image scores were computed with, and whether they still hold.

A run's image scores (metrics.json["image_alignment"], written by images/scoring.py) record
both halves of what they were computed from:

    "embeddings"  the image embeddings file: path as given, sha256 of its bytes, model,
                  revision, photos and width (embeddings_record)
    "checkpoint"  the state of the run they scored: its last saved step, every saved step,
                  the sha256 of the caption embeddings saved at that step (what the weights of
                  that step put out on the run's photos: what the scores read), and at the
                  final step the sha256 of model.npz, the weights themselves
                  (checkpoint_record)

A score is valid for that (checkpoint, embeddings) pair only. A run that trained further
after it was scored (stopped, evaluated, resumed) has other caption files: its scores are
"stale" (score_state), and replicate, evaluate and report score it again instead of trusting
them. Scores written before this record existed hold no "checkpoint": they count as current
while they cover exactly the steps the run has saved.
"""
import hashlib
from pathlib import Path

from .files import sha256_file
from .rundir import CAPTIONS_DIR, MODEL, caption_files, read_metrics

_DIGESTS = {}      # (path, size, mtime_ns) -> sha256: a grid checks its runs again and again


def file_digest(path):
    """sha256_file(path), remembered while the file's size and modification time stay."""
    stat = Path(path).stat()
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def saved_caption_files(run_dir):
    """rundir.caption_files, {} for a run that has no captions/ folder yet."""
    return caption_files(run_dir) if (Path(run_dir) / CAPTIONS_DIR).is_dir() else {}


def checkpoint_record(run_dir, files=None):
    """The state of the run that scores of it now would score: {"step": the last saved step,
    "steps": every saved step, "captions_sha256": one digest of that step's caption files,
    "model_sha256": model.npz's sha256 once the final step is saved, else None}.
    files: rundir.caption_files(run_dir) when already read. None when nothing is saved yet."""
    files = saved_caption_files(run_dir) if files is None else files
    if not files:
        return None
    step = max(files)
    digest = hashlib.sha256()
    for split in sorted(files[step]):
        digest.update(f"{split} {file_digest(files[step][split])}\n".encode())
    model = Path(run_dir) / MODEL
    final = "test" in files[step] and model.is_file()
    return {"step": step, "steps": list(files), "captions_sha256": digest.hexdigest(),
            "model_sha256": file_digest(model) if final else None}


def embeddings_record(emb):
    """Which image embeddings a score used: {"path" as given, "sha256", "model", "revision",
    "count", "dim"} of a loaded embeddings.ImageEmbeddings."""
    return {"path": str(emb.path), "sha256": sha256_file(emb.path), "model": emb.meta["model"],
            "revision": emb.meta.get("revision"), "count": int(emb.meta["count"]),
            "dim": int(emb.meta["dim"])}


def score_state(run_dir, metrics=None):
    """"none" (no image scores), "current" (they scored the run as it is now) or "stale"
    (the run has trained further, or was rewound, since). metrics: read_metrics(run_dir)."""
    alignment = (read_metrics(run_dir) if metrics is None else metrics).get("image_alignment")
    if not alignment:
        return "none"
    files = saved_caption_files(run_dir)
    scored = alignment.get("checkpoint")
    if scored is None:                          # written before the record: its steps alone
        same = [e["step"] for e in alignment.get("steps", [])] == list(files)
        return "current" if same else "stale"
    try:
        return "current" if scored == checkpoint_record(run_dir, files) else "stale"
    except FileNotFoundError:                   # a file the run is rewinding away right now
        return "stale"


def current_alignment(run_dir, metrics=None):
    """metrics.json["image_alignment"] when it scored the run as it is now (score_state),
    else None: stale scores are never read."""
    metrics = read_metrics(run_dir) if metrics is None else metrics
    return metrics["image_alignment"] if score_state(run_dir, metrics) == "current" else None


def scored_with(metrics):
    """The "embeddings" record of a run's image scores, current or not; {} without scores."""
    return (metrics.get("image_alignment") or {}).get("embeddings") or {}


def file_label(record):
    """An embeddings record as one phrase: "PATH (sha256 0123456789ab...)"."""
    return f"{record.get('path')} (sha256 {(record.get('sha256') or '?')[:12]}...)"


def stale_phrase(run_dir, metrics):
    """Why a run's scores are stale, one phrase: the step they scored, the step it is at."""
    alignment = metrics["image_alignment"]
    scored = (alignment.get("checkpoint") or {}).get("step",
                                                     alignment["steps"][-1]["step"])
    now = checkpoint_record(run_dir)
    return (f"its image scores are of step {scored}; the run is now at step "
            f"{now['step'] if now else 0}")
