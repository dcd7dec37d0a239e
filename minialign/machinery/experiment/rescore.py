"""A results directory's image scores, made one table's worth: stale ones scored again, and one
embeddings file per table.

    rescore_stale(out)      `report`: every finished run whose image scores are stale (it
                            trained further after it was scored: run/scores.py) is scored
                            again against the file its scores name, when that file is at hand
                            with the same sha256; else its image columns read "pending" and
                            one line says how to rescore it
    check_one_file(out, runs)   a table never mixes scores of two embeddings files: one line
                            naming which runs used which file and the command that rescores
                            them all with one

The untrained-encoder, chance and ceiling rows are scored with the runs' one file
(report.collect passes it to baselines.load_baselines), so they always match the runs beside
them.
"""
from pathlib import Path

from ..images.embeddings import load_embeddings
from ..images.scoring import score_run
from ..run.files import sha256_file
from ..run.rundir import is_diverged, read_metrics
from ..run.scores import file_label, score_state, scored_with, stale_phrase


def embeddings_at_hand(record):
    """Why the embeddings file of an "embeddings" record cannot score now (absent, or other
    bytes at its path), or None when it can."""
    path = Path(record.get("path") or "")
    if not path.is_file():
        return f"{path} is not at hand"
    if sha256_file(path) != record.get("sha256"):
        return f"{path} now holds other bytes (sha256 {sha256_file(path)[:12]}...)"
    return None


def rescore_stale(out, wait=False, tag="[report]"):
    """Score again every finished run of out/runs whose image scores are stale, against the
    file they were computed with (score_run: under the run's lock; wait: for a run another
    command writes). A run whose file is not at hand keeps its stale scores unread (pending)
    and gets one line. Returns the run directories scored again."""
    scored = []
    for run_dir in sorted(p for p in (Path(out) / "runs").glob("*") if p.is_dir()):
        metrics = read_metrics(run_dir)
        if "final" not in metrics or is_diverged(run_dir) \
                or score_state(run_dir, metrics) != "stale":
            continue
        record, why = scored_with(metrics), stale_phrase(run_dir, metrics)
        problem = embeddings_at_hand(record)
        if problem:
            print(f"{tag} {run_dir}: {why}, and {problem}: its image columns read pending; "
                  f"rescore it with `python -m minialign evaluate --run {run_dir} "
                  f"--embeddings FILE`", flush=True)
            continue
        print(f"{tag} {run_dir}: {why}: scoring it again against {file_label(record)}",
              flush=True)
        score_run(run_dir, load_embeddings(record["path"]), wait=wait, tag=tag)
        scored.append(run_dir)
    return scored


def check_one_file(out, runs):
    """ValueError, one line, when the image scores of `runs` (report.run_numbers dicts, each
    with "embeddings_file" {"path", "sha256"} once scored) come from more than one embeddings
    file: which runs used which file, and the command that rescores the others against the
    file most of them used."""
    by_file = {}
    for run in runs:
        if run.get("embeddings_file"):
            by_file.setdefault(run["embeddings_file"]["sha256"], []).append(run)
    if len(by_file) < 2:
        return
    groups = sorted(by_file.values(), key=len, reverse=True)
    used = "; ".join(f"{file_label(group[0]['embeddings_file'])}: "
                     f"{', '.join(r['name'] for r in group)}" for group in groups)
    others = " ".join(f"--run {Path(out) / 'runs' / r['name']}" for g in groups[1:] for r in g)
    raise ValueError(f"{out}: its runs were scored against {len(groups)} image embeddings "
                     f"files, and one table needs one ({used}); rescore them all with one: "
                     f"`python -m minialign evaluate --rescore --embeddings "
                     f"{groups[0][0]['embeddings_file']['path']} {others}`, then report again")
