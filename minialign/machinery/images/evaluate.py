"""`python -m minialign evaluate`: score saved runs against frozen image embeddings, and say
where the embeddings come from when they are missing.

    python -m minialign evaluate --run DIR [--run DIR ...] [--embeddings PATH] [--json]
                                 [--rescore] [--wait]

The scoring of one run is scoring.py's (what is computed, on which photos); this module is the
command around it: the runs checked, locked and scored, the summary table, and the one line
that says how to make a missing embeddings file. Without --embeddings nothing is scored or
written, which is not an error: the text-side metrics, and the image scores the runs already
hold with the file they were computed with (recorded.py); an --embeddings path that
does not exist is an error that names it and the export command that creates it.

With --embeddings, every run is locked (run/runlock.py) before it is read and stays locked
until its scores are written: a run still training, or being scored by another command, is
refused in one line (--wait: waited for). Scores a run already holds from ANOTHER embeddings
file are replaced only with --rescore (else one line naming both files, before any work);
scores of an earlier checkpoint of the run (it trained further since: run/scores.py) are
stale and replaced, saying so.
"""
import json
import sys
from pathlib import Path

from .embeddings import describe_join, load_embeddings, model_label, sha256_file
# scoring's names, also as evaluate.X (the scoring was this module's before #28)
from .scoring import (K, RECALL_KS, evaluate_run, evaluate_split,  # noqa: F401
                      load_caption_slots, score_run, score_test, slot_summary,
                      write_image_alignment)
from .recorded import other_file_warning, recorded, recorded_lines, shown_alignments
from ..run.rundir import check_run_dir, read_metrics, read_run_config
from ..run.runlock import hold
from ..run.scores import file_label, score_state, scored_with, stale_phrase

DEFAULT_EMBEDDINGS = "embeddings/coco_train2017_subset10000_seed0_dinov2-base.npz"  # make embeddings
DEFAULT_SUBSET = "captions_train2017_subset10000_seed0.json"     # make data's file, its captions
EXPORT_COMMAND = ("python -m minialign export --captions {captions} --images {images} "
                  "--model facebook/dinov2-base --out {out}")
SYNTHETIC_FILES = ("captions_synthetic.json", "embeddings_synthetic.npz")  # synthetic.*_NAME


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


def missing_embeddings_note(captions, found=()):
    """What to print when --embeddings was omitted for runs trained on `captions`: text-side
    metrics, not an error. found: recorded.recorded(runs); a run holding image scores is
    told which file (and step) they were computed with and how to see or refresh them; for
    runs without scores, which file would add the image side and how to make it, never a
    file whose sha256 differs from a recorded one without saying it needs --rescore."""
    lines = recorded_lines(found)
    unscored = [str(r) for r, _, rec, _ in found if not rec]
    if unscored or not found:
        path = expected_embeddings(captions)
        how = (f"{path} exists: rerun with --embeddings {path}." if Path(path).is_file()
               else how_to_export(path, captions))
        other = other_file_warning(path, found)
        how = f"{how[:-1]}; but {other}." if other else how
        which = f" of {', '.join(unscored)}" if lines else ""
        lines.append(f"image alignment{which} not computed: it needs the frozen DINOv2 image "
                     f"embeddings of the run's photos ({captions}) and --embeddings was not "
                     f"given. {how} Shown above: the text-side metrics only.")
    return "\n".join(lines)


def check_embeddings_path(path, captions):
    """An explicitly given --embeddings must exist: FileNotFoundError naming it, with the
    export command that creates it, instead of silently falling back to text-only output."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"--embeddings {path}: no such file. "
                                f"{how_to_export(path, captions)}")


def other_file_runs(runs, sha256):
    """{file_label of another embeddings file: [run dirs]} for the runs whose image scores
    (current or stale) were computed with a file other than the one of `sha256`."""
    found = {}
    for run_dir in runs:
        record = scored_with(read_metrics(run_dir))
        if record and record.get("sha256") != sha256:
            found.setdefault(file_label(record), []).append(str(run_dir))
    return found


def refuse_other_file(found, path, sha256, command="evaluate"):
    """ValueError, one line: which runs hold scores of which other file, and the flag that
    replaces them (found: other_file_runs)."""
    held = "; ".join(f"{', '.join(runs)}: scored with {label}" for label, runs in found.items())
    return ValueError(f"{held}; --embeddings {file_label({'path': path, 'sha256': sha256})} is "
                      f"another file: pass --rescore to replace those scores with this file's "
                      f"(`python -m minialign {command} ... --rescore`), or give the file they "
                      f"were scored with")


def replacing_lines(runs, sha256):
    """What scoring `runs` now replaces, one line per run that holds scores: stale ones (the
    run trained further since) and another file's (--rescore)."""
    lines = []
    for run_dir in runs:
        metrics = read_metrics(run_dir)
        record = scored_with(metrics)
        if record and record.get("sha256") != sha256:
            lines.append(f"{run_dir}: replacing its image scores computed with "
                         f"{file_label(record)} (--rescore)")
        elif record and score_state(run_dir, metrics) == "stale":
            lines.append(f"{run_dir}: {stale_phrase(run_dir, metrics)}: scored again")
    return lines


def score_and_write(runs, emb, rescore, wait):
    """Lock `runs`, check them (metrics.json readable, no other file's scores unless
    rescore), score every one, then write every one; returns the results. Nothing is written
    unless every run scored."""
    sha256 = sha256_file(emb.path)
    with hold(runs, wait=wait, tag="[evaluate]"):
        for run_dir in runs:                                 # a bad metrics.json: before work
            read_metrics(run_dir)
        found = other_file_runs(runs, sha256)
        if found and not rescore:
            raise refuse_other_file(found, emb.path, sha256)
        said = replacing_lines(runs, sha256)
        results = [evaluate_run(r, emb, write=False, every_photo=True) for r in runs]
        for run_dir, result in zip(runs, results):          # every run scored: now write
            write_image_alignment(run_dir, result)
    for line in said:
        print(line, file=sys.stderr, flush=True)
    return results


def evaluate_runs(run_dirs, embeddings=None, as_json=False, rescore=False, wait=False):
    """`python -m minialign evaluate`: evaluate every run directory of run_dirs (embeddings:
    the .npz path, or None for the text side only), store image alignment in each metrics.json
    (score_and_write: under each run's lock; wait: for a run another command holds; rescore:
    replace scores of another embeddings file), print a summary (as_json: as JSON).
    Returns the printed summary dict. Raises FileNotFoundError for a run directory or an
    --embeddings file that does not exist, ValueError for a bad run, a corrupt or mismatched
    embeddings file (one missing any val or test photo of a run) or scores of another file
    without rescore, dirlock.DirLockedError for a run another command is writing; omitting
    --embeddings only limits the output to the text side."""
    runs = [check_run_dir(r) for r in run_dirs]              # bad input fails before any work
    configs = [read_run_config(r) for r in runs]              # each config.json, checked
    config = configs[0]
    captions = config.get("captions") or "<captions>"       # for the export command we print
    emb = note = None
    shown = {}
    if embeddings is not None:
        check_embeddings_path(embeddings, captions)
        emb = load_embeddings(embeddings)
        results = score_and_write(runs, emb, rescore, wait)
    else:
        found = recorded(runs)                              # scores the runs already hold
        note = missing_embeddings_note(captions, found)
        shown = shown_alignments(found)
        results = [{**shown[r["run"]], "run": r["run"]} if r["run"] in shown else r
                   for r in (evaluate_run(r, None, write=False) for r in runs)]  # reads only
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
    if shown:
        print("image scores: as recorded in the runs' metrics.json, not recomputed")
    print(format_table(rows, image=emb is not None or bool(shown)))
    if note:
        print(note)
    return summary
