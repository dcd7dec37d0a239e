"""A grid's image embeddings: loaded and checked against the captions before any training, and
which runs still need scoring against them.

    load_image_embeddings(args)   the file, or None with --image-eval off; refused in one line
                                  when absent or missing a val or test photo
    check_scored_with(args, emb)  runs scored with ANOTHER file are refused before training,
                                  unless --rescore (add_rescore_arg)
    needs_evaluation(run_dir, emb)  never scored, another file, or stale (run/scores.py)
"""
from pathlib import Path

from ... import train
from ..images import evaluate
from ..images.embeddings import (check_split_coverage, describe_join, join_on_ids, load_embeddings,
                                 sha256_file)
from ..run.monitor import load_coco_captions, split_photos
from ..run.rundir import is_diverged, read_metrics
from ..run.scores import score_state, scored_with, stale_phrase


def needs_evaluation(run_dir, emb):
    """Whether a run has no current scores against these image embeddings: never scored,
    scored with another file, or stale (it trained further since: scores.score_state)."""
    if emb is None or is_diverged(run_dir):
        return False
    metrics = read_metrics(run_dir)
    return (scored_with(metrics).get("sha256") != emb["sha256"]
            or score_state(run_dir, metrics) != "current")


def say_if_stale(run_dir, tag):
    """One line when a run about to be scored holds stale scores (it trained further since)."""
    metrics = read_metrics(run_dir)
    if score_state(run_dir, metrics) == "stale":
        print(f"{tag} {run_dir}: {stale_phrase(run_dir, metrics)}: scoring it again", flush=True)


def add_rescore_arg(p):
    p.add_argument("--rescore", action="store_true",
                   help="score again the runs that hold image scores of ANOTHER embeddings "
                        "file (without it: refused before training, naming both files)")


def check_scored_with(args, emb):
    """Before a grid trains: ValueError (one line, evaluate.refuse_other_file) when runs in
    args.out/runs hold image scores of another embeddings file, unless args.rescore (the
    grid then scores them again against this one)."""
    if emb is None or args.rescore:
        return
    runs = sorted(p for p in (Path(args.out) / "runs").glob("*") if p.is_dir())
    found = evaluate.other_file_runs(runs, sha256_file(emb.path))
    if found:
        raise evaluate.refuse_other_file(found, emb.path, sha256_file(emb.path),
                                         getattr(args, "command", "replicate"))


def missing_embeddings_message(path, captions):
    """Why replicate stops before training when the embeddings file is absent, and what to
    do, on one line."""
    return (f"{path} does not exist: image alignment (mutual-kNN, R@1) needs these image "
            f"embeddings. {evaluate.how_to_export(path, captions)} Or train text-only now with "
            f"--image-eval off (make: IMAGE_EVAL=off) and rerun with the file later: finished "
            f"runs are scored without retraining.")


def load_image_embeddings(args):
    """The embeddings to score against, None with --image-eval off; checked against the
    captions before any training. Raises FileNotFoundError (with what to do) when absent,
    ValueError (embeddings.check_split_coverage) when a val or test photo has no embedding."""
    tag = f"[{getattr(args, 'command', 'replicate')}]"             # replicate or scaling
    if args.image_eval == "off":
        print(f"{tag} image evaluation off: mutual-kNN and R@1 will read 'pending'",
              flush=True)
        return None
    if not Path(args.embeddings).is_file():
        raise FileNotFoundError(missing_embeddings_message(args.embeddings, args.captions))
    emb = load_embeddings(args.embeddings)
    image_ids = load_coco_captions(args.captions).image_ids                 # (P,)
    split = split_photos(image_ids, train.TrainConfig().split_seed)         # as train.prepare
    check_split_coverage(emb, args.captions, {name: image_ids[split[name]]
                                              for name in ("val", "test")})
    print(f"{tag} " + describe_join(join_on_ids(image_ids, emb)[2]), flush=True)
    return emb
