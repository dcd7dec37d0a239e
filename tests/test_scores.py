"""Issue 28.1 and 28.3 from the command line: every image score says what it was computed with
(embeddings file and the run's checkpoint), a score of another file is replaced only with
--rescore, a table never mixes two files, and one writer at a time per run.

A grid of two tiny runs (good_views, next_token, 4 steps of a D = 16 encoder) on a 120-scene
SYNTHETIC world; "B" is the world's embeddings file with another model name in its metadata:
the same vectors (the same scores) in another file (another sha256).
"""
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minialign.machinery import cli
from minialign.machinery.images import synthetic
from minialign.machinery.images.embeddings import load_embeddings, save_embeddings, sha256_file
from minialign.machinery.run import monitor, rundir, scores

RUNS = ("good_views-lr1.00e-03-seed0", "next_token-lr1.00e-03-seed0")
SIZE = ["--steps", "4", "--batch-photos", "8", "--eval-every", "2", "--warmup-steps", "1",
        "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--max-len", "64"]


def replicate_argv(world, out, embeddings=None, *more):
    return ["replicate", "--captions", str(world["captions"]), "--embeddings",
            str(embeddings or world["embeddings"]), "--out", str(out), "--objectives",
            "good_views", "next_token", "--seeds", "0", "--lr-search", "off", "--jobs", "1",
            "--no-estimate", *SIZE, *more]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The world, its embeddings A and B, and a grid scored against A (never written to)."""
    root = tmp_path_factory.mktemp("scores")
    captions, embeddings = synthetic.write_world(root, n_scenes=120, seed=0, world="v1")
    emb = load_embeddings(embeddings)
    other = save_embeddings(root / "b.npz", emb.image_ids, emb.embeddings,
                            {**emb.meta, "model": "another-model"})
    world = {"captions": captions, "embeddings": embeddings, "other": other,
             "grid": root / "grid"}
    assert cli.main(replicate_argv(world, world["grid"])) == 0
    return world


def grid_copy(world, tmp_path):
    return Path(shutil.copytree(world["grid"], tmp_path / "grid"))


def error_line(capsys):
    """The one stderr line of a refused command."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("minialign ")]
    return line


def test_every_score_records_its_embeddings_and_checkpoint(world):
    run = world["grid"] / "runs" / RUNS[0]
    scored = rundir.read_metrics(run)["image_alignment"]
    emb = load_embeddings(world["embeddings"])
    assert scored["embeddings"] == {"path": str(world["embeddings"]),
                                    "sha256": sha256_file(world["embeddings"]),
                                    "model": emb.meta["model"], "revision": None,
                                    "count": 120, "dim": emb.embeddings.shape[1]}
    checkpoint = scored["checkpoint"]
    assert checkpoint["step"] == 4 and checkpoint["steps"] == [0, 2, 4]
    assert checkpoint["model_sha256"] == sha256_file(run / rundir.MODEL)   # the final weights
    assert scores.score_state(run) == "current"


def test_evaluate_with_another_file_is_refused_then_replaced_with_rescore(world, tmp_path,
                                                                         capsys):
    run = grid_copy(world, tmp_path) / "runs" / RUNS[0]
    before = (run / rundir.METRICS).read_bytes()
    argv = ["evaluate", "--run", str(run), "--embeddings", str(world["other"])]
    assert cli.main(argv) == 2
    sha_a, sha_b = sha256_file(world["embeddings"])[:12], sha256_file(world["other"])[:12]
    assert error_line(capsys) == (
        f"minialign evaluate: error: {run}: scored with {world['embeddings']} (sha256 "
        f"{sha_a}...); --embeddings {world['other']} (sha256 {sha_b}...) is another file: pass "
        f"--rescore to replace those scores with this file's (`python -m minialign evaluate ... "
        f"--rescore`), or give the file they were scored with")
    assert (run / rundir.METRICS).read_bytes() == before                   # nothing written
    assert cli.main(argv + ["--rescore"]) == 0
    assert (f"{run}: replacing its image scores computed with {world['embeddings']} (sha256 "
            f"{sha_a}...) (--rescore)") in capsys.readouterr().err
    scored = rundir.read_metrics(run)["image_alignment"]
    assert scored["embeddings"]["path"] == str(world["other"])
    old = json.loads(before)["image_alignment"]
    assert scored["steps"] == old["steps"]            # the same vectors: the very same scores


def test_report_refuses_two_files_in_one_table_and_names_the_command(world, tmp_path, capsys):
    out = grid_copy(world, tmp_path)
    other = out / "runs" / RUNS[1]
    assert cli.main(["evaluate", "--run", str(other), "--embeddings", str(world["other"]),
                     "--rescore"]) == 0
    capsys.readouterr()
    table = (out / "results.md").read_bytes()
    assert cli.main(["report", str(out)]) == 2
    a = f"{world['embeddings']} (sha256 {sha256_file(world['embeddings'])[:12]}...)"
    b = f"{world['other']} (sha256 {sha256_file(world['other'])[:12]}...)"
    command = (f"python -m minialign evaluate --rescore --embeddings {world['embeddings']} "
               f"--run {other}")
    assert error_line(capsys) == (
        f"minialign report: error: {out}: its runs were scored against 2 image embeddings "
        f"files, and one table needs one ({a}: {RUNS[0]}; {b}: {RUNS[1]}); rescore them all "
        f"with one: `{command}`, then report again")
    assert (out / "results.md").read_bytes() == table                      # left as it was
    assert cli.main(command.split()[3:]) == 0                               # the line's command
    assert cli.main(["report", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["embeddings_models"] == [load_embeddings(world["embeddings"]).meta["model"]]
    baselines = json.loads((out / "baselines.json").read_text())         # untrained rows: A's
    assert baselines["key"]["embeddings_sha256"] == sha256_file(world["embeddings"])


def test_replicate_with_another_file_is_refused_before_training(world, tmp_path, capsys):
    out = grid_copy(world, tmp_path)
    assert cli.main(replicate_argv(world, out, world["other"])) == 2
    line = error_line(capsys)
    assert line.startswith(f"minialign replicate: error: {out / 'runs' / RUNS[0]}, "
                           f"{out / 'runs' / RUNS[1]}: scored with {world['embeddings']}")
    assert "(`python -m minialign replicate ... --rescore`)" in line
    assert cli.main(replicate_argv(world, out, world["other"], "--rescore")) == 0
    for name in RUNS:
        assert scores.scored_with(rundir.read_metrics(out / "runs" / name))["path"] == \
            str(world["other"])


def test_report_scores_a_stale_run_again_or_says_its_file_is_gone(world, tmp_path, capsys):
    """A finished run whose scores are of an earlier step (as a stop, evaluate, resume leaves
    it) is scored again by `report` against its file; with that file gone, one line and
    'pending', never the stale numbers."""
    out = grid_copy(world, tmp_path)
    run = out / "runs" / RUNS[0]
    metrics = rundir.read_metrics(run)
    current = json.loads(json.dumps(metrics["image_alignment"]))
    metrics["image_alignment"]["checkpoint"]["step"] = 2                # as if scored at step 2
    metrics["image_alignment"]["steps"] = metrics["image_alignment"]["steps"][:2]
    rundir.write_metrics(run, metrics)
    assert scores.score_state(run) == "stale"
    assert cli.main(["report", str(out)]) == 0
    said = capsys.readouterr().out
    assert (f"[report] {run}: its image scores are of step 2; the run is now at step 4: scoring "
            f"it again against {world['embeddings']}") in said
    assert rundir.read_metrics(run)["image_alignment"]["steps"] == current["steps"]
    rundir.write_metrics(run, {**metrics, "image_alignment": {
        **metrics["image_alignment"], "embeddings": {**current["embeddings"],
                                                     "path": str(tmp_path / "gone.npz")}}})
    assert cli.main(["report", str(out)]) == 0
    said = capsys.readouterr().out
    assert (f"[report] {run}: its image scores are of step 2; the run is now at step 4, and "
            f"{tmp_path / 'gone.npz'} is not at hand: its image columns read pending") in said
    assert "| good_views | pending | pending |" in (out / "results.md").read_text()


LOCK_HOLDER = """
import sys, time
from minialign.machinery.run.dirlock import DirLock
lock = DirLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold_lock(run, seconds):
    """A process holding the run's lock for `seconds` (as `train` does while it trains)."""
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(run), str(seconds)],
                              stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_evaluate_of_a_run_another_process_writes_is_refused_or_waits(world, tmp_path, capsys):
    run = grid_copy(world, tmp_path) / "runs" / RUNS[0]
    before = (run / rundir.METRICS).read_bytes()
    argv = ["evaluate", "--run", str(run), "--embeddings", str(world["embeddings"])]
    holder = hold_lock(run, 60)
    try:
        assert cli.main(argv) == 2
        line = error_line(capsys)
        assert line.startswith(f"minialign evaluate: error: {run}: in use by another minialign "
                               f"process (pid {holder.pid} on ")
        assert (run / rundir.METRICS).read_bytes() == before
    finally:
        holder.kill()
        holder.wait()
    holder = hold_lock(run, 1.5)
    t0 = time.monotonic()
    assert cli.main(argv + ["--wait"]) == 0              # waits for the holder, then scores
    assert time.monotonic() - t0 > 0.5 and holder.wait() == 0
    assert "in use by another minialign process" in capsys.readouterr().err
    assert scores.score_state(run) == "current"


def test_training_writes_metrics_from_the_file_keeping_image_scores(world, tmp_path,
                                                                    monkeypatch):
    """Training rewrites metrics.json from the file's current contents at every evaluation:
    image scores that reached the file mid-run (here written at step 2's evaluation, as an
    `evaluate` did before the run's lock kept it out) are still there when the run ends;
    before #28 training rewrote the file from memory and dropped them."""
    run, real_evaluate = tmp_path / "run", monitor.evaluate
    scored = rundir.read_metrics(world["grid"] / "runs" / RUNS[0])["image_alignment"]

    def evaluate(params, cfg, data, out, step, splits):
        if step == 2:
            rundir.update_metrics(out, rundir.IMAGE_SCORES, scored)
        return real_evaluate(params, cfg, data, out, step, splits)
    monkeypatch.setattr(monitor, "evaluate", evaluate)
    assert cli.main(["train", "--captions", str(world["captions"]), "--objective", "good_views",
                     "--out", str(run), *SIZE]) == 0
    saved = rundir.read_metrics(run)
    assert saved["image_alignment"] == scored and [e["step"] for e in saved["evals"]] == [0, 2, 4]
    # The grid's run of the same config saved the same bytes: its scores hold for this run too.
    assert scores.score_state(run) == "current"


def test_evaluate_without_embeddings_reads_the_recorded_scores_never_suggests_another(
        world, tmp_path, capsys):
    """A run scored with A, then rescored with B: `evaluate --run R` shows B's recorded scores
    and says so; A (the world's file, which it suggested before) is named only with the
    --rescore it needs. A run without scores still gets the not-computed note."""
    grid = grid_copy(world, tmp_path)
    run, bare = grid / "runs" / RUNS[0], grid / "runs" / RUNS[1]
    assert cli.main(["evaluate", "--run", str(run), "--embeddings", str(world["other"]),
                     "--rescore"]) == 0
    capsys.readouterr()
    before = (run / rundir.METRICS).read_bytes()
    assert cli.main(["evaluate", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    sha_b = sha256_file(world["other"])[:12]
    assert (f"{run}: image scores in metrics.json were computed with {world['other']} (sha256 "
            f"{sha_b}...) at step 4; rerun with --embeddings {world['other']} to see or "
            f"refresh them.") in out
    assert "not computed" not in out and f"--embeddings {world['embeddings']}" not in out
    scored = rundir.read_metrics(run)["image_alignment"]["steps"][-1]["test"]
    row = [line.split() for line in out.splitlines() if line.startswith(str(run))][0]
    assert row[5] == f"{scored['mutual_knn']['mean']:.3f}"      # the recorded mkNN@10 shown
    assert (run / rundir.METRICS).read_bytes() == before        # nothing written
    data = json.loads((bare / rundir.METRICS).read_text())
    del data["image_alignment"]                                 # a run never scored
    (bare / rundir.METRICS).write_text(json.dumps(data))
    assert cli.main(["evaluate", "--run", str(run), "--run", str(bare)]) == 0
    out = capsys.readouterr().out
    sha_a = sha256_file(world["embeddings"])[:12]
    assert (f"image alignment of {bare} not computed: it needs the frozen DINOv2 image "
            f"embeddings of the run's photos ({world['captions']}) and --embeddings was not "
            f"given. {world['embeddings']} exists: rerun with --embeddings {world['embeddings']}"
            f"; but {world['embeddings']} (sha256 {sha_a}...) is not the file {run} was scored "
            f"with: scoring with it needs --rescore.") in out
