"""`evaluate` without --embeddings: the image scores the runs' metrics.json already hold.

Nothing is scored or written here. A run scored before (by `evaluate --embeddings`,
`replicate` or `report`) records which file its scores were computed with and at which step
(run/scores.py); without --embeddings, evaluate shows those scores when they still hold and
all come from one file (a table never mixes two files), and says how to see or refresh them.
A file is suggested only when it is the one recorded (same sha256); another file is named
with the --rescore it would need.
"""
from pathlib import Path

from ..run.rundir import read_metrics
from ..run.scores import file_digest, file_label, score_state, scored_with, stale_phrase


def recorded(runs):
    """[(run_dir, metrics, record, state)] for every run: its image scores' embeddings record
    ({} without scores) and score_state ("none", "current" or "stale")."""
    out = []
    for run_dir in runs:
        metrics = read_metrics(run_dir)
        out.append((run_dir, metrics, scored_with(metrics), score_state(run_dir, metrics)))
    return out


def holds(record):
    """True when the path the scores record still holds the very file (same sha256)."""
    path = Path(record.get("path") or "")
    return path.is_file() and file_digest(path) == record.get("sha256")


def how_to_see(record):
    """How to see or refresh scores computed with `record`'s file, one phrase."""
    if holds(record):
        return f"rerun with --embeddings {record['path']} to see or refresh them"
    return (f"{record.get('path')} no longer holds that file (another sha256, or none): give "
            f"the file they were scored with, or another with --rescore")


def shown_alignments(found):
    """{run_dir: its metrics.json["image_alignment"]} to show as they are: the current scores
    of the runs, when every run's current scores come from one file; else {} (never two
    files in one table)."""
    current = {str(r): m["image_alignment"] for r, m, _, state in found if state == "current"}
    files = {rec.get("sha256") for _, _, rec, state in found if state == "current"}
    return current if len(files) == 1 else {}


def recorded_lines(found):
    """One line per run holding image scores: which file (path, sha256), which step, stale or
    not, and how to see or refresh them."""
    lines = []
    for run_dir, metrics, record, state in found:
        if not record:
            continue
        alignment = metrics["image_alignment"]
        step = (alignment.get("checkpoint") or {}).get("step", alignment["steps"][-1]["step"])
        stale = "" if state == "current" else f" (stale: {stale_phrase(run_dir, metrics)})"
        lines.append(f"{run_dir}: image scores in metrics.json were computed with "
                     f"{file_label(record)} at step {step}{stale}; {how_to_see(record)}.")
    return lines


def other_file_warning(path, found):
    """None when `path` (the file a note would suggest) is absent or is the file every scored
    run recorded; else one phrase saying scoring with it needs --rescore for those runs."""
    records = [rec for _, _, rec, _ in found if rec]
    if not records or not Path(path).is_file():
        return None
    digest = file_digest(path)
    other = sorted({str(r) for r, _, rec, _ in found if rec and rec.get("sha256") != digest})
    if not other:
        return None
    return (f"{path} (sha256 {digest[:12]}...) is not the file {', '.join(other)} "
            f"{'was' if len(other) == 1 else 'were'} scored with: scoring with it needs "
            f"--rescore")
