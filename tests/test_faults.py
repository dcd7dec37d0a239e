"""Fault injection: a tiny run interrupted at every write point, then rerun, ends bit-identical
to a run never interrupted; a full disk keeps the last good checkpoint readable.

Every place a run writes goes through os.fdopen (files.atomic_write's temporary file),
os.fsync, os.replace, or train.append_line (log.jsonl). An Injector wraps them and raises at
its k-th "event": inside a write (after half the bytes of the first write to a temporary
file or of a log line), before an fsync, before or after a rename, after a log line. The test
runs the same tiny run once per event k, interrupted there, resumes it, and compares every
file with an uninterrupted run (wall-clock fields aside).
"""
import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from minialign import train
from minialign.machinery import cli
from minialign.machinery.run import dirlock, files, monitor, rundir
from minialign.machinery.images import synthetic
from minialign.model import ModelConfig

TINY = ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=64)
TIMED = {"seconds", "wall_seconds", "ms_per_step", "log_bytes"}   # wall clock, or its digits


class Injector:
    """Counts write events; raises `fault` at event number `at` (1-based; None: never).
    labels: the events seen, e.g. "fsync", "replace-before:metrics.json", "log-inside"."""

    def __init__(self, monkeypatch, at=None, fault=KeyboardInterrupt):
        self.at, self.fault, self.labels = at, fault, []
        real_fdopen, real_fsync, real_replace = os.fdopen, os.fsync, os.replace
        real_append = train.append_line
        injector = self

        class Tmp:                        # the temporary file of files.atomic_write
            def __init__(self, f):
                self.f, self.first = f, True

            def write(self, data):
                if self.first:
                    self.first = False
                    injector.event("write-inside", lambda: self.f.write(bytes(data)[:len(data) // 2]))
                return self.f.write(data)

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self.f.__exit__(*exc)

        def fdopen(fd, mode="r", *args, **kwargs):
            f = real_fdopen(fd, mode, *args, **kwargs)
            return Tmp(f) if "w" in mode else f

        def fsync(fd):
            self.event("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync")
            return real_fsync(fd)

        def replace(src, dst):
            self.event(f"replace-before:{Path(dst).name}")
            real_replace(src, dst)
            self.event(f"replace-after:{Path(dst).name}")

        class Log:                        # log.jsonl, opened "ab" by train.run
            def __init__(self, f):
                self.f = f

            def write(self, data):
                injector.event("log-inside", lambda: (self.f.write(data[:len(data) // 2]),
                                                      self.f.flush()))
                return self.f.write(data)

            def __getattr__(self, name):
                return getattr(self.f, name)

        def append_line(f, line):
            real_append(Log(f), line)
            self.event("log-after")

        monkeypatch.setattr(os, "fdopen", fdopen)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(train, "append_line", append_line)

    def event(self, label, partial=None):
        self.labels.append(label)
        if len(self.labels) == self.at:
            if partial is not None:
                partial()                 # half of the bytes reach the file, then the fault
            if self.fault is KeyboardInterrupt:
                raise KeyboardInterrupt
            raise OSError(errno.ENOSPC, "No space left on device (injected)")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    captions, embeddings = synthetic.write_world(root, n_scenes=120, seed=0, world="v1")
    return {"captions": captions, "embeddings": embeddings, "root": root}


def config(captions):
    """bad_views draws from both generators; evaluations at 2 and 4, the final one at 5."""
    return train.TrainConfig(objective="bad_views", captions=str(captions), steps=5,
                             batch_photos=8, eval_every=2, warmup_steps=1, model=TINY)


@pytest.fixture(scope="module")
def reference(world, tmp_path_factory):
    """One uninterrupted run, and the write events it went through."""
    out = tmp_path_factory.mktemp("reference") / "run"
    with pytest.MonkeyPatch.context() as mp:
        injector = Injector(mp)
        train.train(config(world["captions"]), out, progress=False)
    return {"out": out, "labels": injector.labels}


def untimed(obj):
    """A JSON value with every wall-clock field dropped, recursively."""
    if isinstance(obj, dict):
        return {k: untimed(v) for k, v in obj.items() if k not in TIMED}
    if isinstance(obj, list):
        return [untimed(v) for v in obj]
    return obj


def snapshot(out):
    """Every file of a run directory, as comparable values (timing fields dropped)."""
    snap = {}
    for path in sorted(p for p in Path(out).rglob("*") if p.is_file()):
        name = str(path.relative_to(out))
        if path.suffix == ".npz":
            arrays = files.load_npz(path)
            if "state" in arrays:                                  # the checkpoint's JSON
                arrays["state"] = untimed(json.loads(str(arrays["state"])))
            snap[name] = {k: v if isinstance(v, dict) else (v.dtype.str, v.shape, v.tobytes())
                          for k, v in arrays.items()}
        elif path.suffix == ".jsonl":
            snap[name] = [untimed(json.loads(line)) for line in path.read_text().splitlines()]
        elif path.suffix == ".json":
            snap[name] = untimed(json.loads(path.read_text()))
        else:
            snap[name] = None                                      # .lock: its holder differs
    return snap


def test_the_reference_run_passes_every_kind_of_write_point(reference):
    kinds = {label.split(":")[0] for label in reference["labels"]}
    assert kinds == {"write-inside", "fsync", "replace-before", "replace-after", "fsync-dir",
                     "log-inside", "log-after"}
    targets = {label.split(":")[1] for label in reference["labels"] if ":" in label}
    assert targets == {"config.json", "metrics.json", "checkpoint.npz", "model.npz",
                       "val_step00000.npz", "val_step00002.npz", "val_step00004.npz",
                       "val_step00005.npz",
                       "test_step00005.npz", "train_step00005.npz"}


def test_interrupted_anywhere_then_rerun_is_bit_identical(world, reference, tmp_path,
                                                          monkeypatch):
    """Ctrl-C at every write event of the run, each time followed by `train --resume`."""
    expected, cfg = snapshot(reference["out"]), config(world["captions"])
    for k in range(1, len(reference["labels"]) + 1):
        out = tmp_path / f"run{k}"
        with pytest.MonkeyPatch.context() as mp:
            Injector(mp, at=k)
            with pytest.raises(KeyboardInterrupt):
                train.train(cfg, out, progress=False)
        assert not list(out.rglob(f"*{files.TMP_SUFFIX}")), reference["labels"][k - 1]
        train.train(cfg, out, progress=False, resume=True)
        assert snapshot(out) == expected, f"interrupted at event {k}: {reference['labels'][k - 1]}"


def test_a_full_disk_keeps_the_last_checkpoint_and_the_rerun_continues(world, reference,
                                                                       tmp_path, capsys):
    """ENOSPC at every data write and fsync: one error line naming the file, no temporary
    left, the checkpoint on disk still loads, and the rerun (space freed) ends identical."""
    expected, cfg = snapshot(reference["out"]), config(world["captions"])
    points = [k for k, label in enumerate(reference["labels"], 1)
              if label in ("write-inside", "fsync", "log-inside")]
    assert len(points) > 20
    for k in points:
        out = tmp_path / f"run{k}"
        with pytest.MonkeyPatch.context() as mp:
            Injector(mp, at=k, fault=OSError)
            with pytest.raises(OSError) as err:
                train.train(cfg, out, progress=False)
        assert err.value.errno == errno.ENOSPC
        assert str(err.value).startswith(str(out)), str(err.value)
        assert not list(out.rglob(f"*{files.TMP_SUFFIX}"))
        if (out / rundir.CHECKPOINT).exists():
            assert "state" in files.load_npz(out / rundir.CHECKPOINT)
        train.train(cfg, out, progress=False, resume=True)
        assert snapshot(out) == expected, f"disk full at event {k}"


def test_temporaries_of_a_killed_writer_are_removed_on_resume(world, reference, tmp_path):
    cfg, out = config(world["captions"]), tmp_path / "run"
    assert train.train(cfg, out, progress=False, stop_after=3) is None
    stale = out / f".checkpoint.npz.x1y2z3{files.TMP_SUFFIX}"       # as SIGKILL leaves it
    stale.write_bytes(b"PK\x03\x04 half a zip")
    train.train(cfg, out, progress=False, resume=True)
    assert not stale.exists() and snapshot(out) == snapshot(reference["out"])


def test_stopped_after_the_final_checkpoint_without_metrics_finishes(world, reference,
                                                                     tmp_path, monkeypatch):
    """Issue 8.2: steps <= eval_every, Ctrl-C during the final evaluation: checkpoint.npz, and
    metrics.json with step 0's evaluation alone (#22; before it, no metrics.json at all).
    Resume (train and replicate both call train(resume=True)) finishes it."""
    cfg = train.TrainConfig(**{**config(world["captions"]).__dict__, "eval_every": 10})
    out, real_evaluate_split = tmp_path / "run", monitor.embed_split
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:                                    # step 0's evaluation passes
            return real_evaluate_split(*args, **kwargs)
        raise KeyboardInterrupt
    monkeypatch.setattr(monitor, "embed_split", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train.train(cfg, out, progress=False)
    monkeypatch.setattr(monitor, "embed_split", real_evaluate_split)
    assert (out / rundir.CHECKPOINT).exists()
    assert [e["step"] for e in rundir.read_metrics(out)["evals"]] == [0]
    metrics = train.train(cfg, out, progress=False, resume=True)
    assert metrics["final"]["val"]["paraphrase_R@1"] >= 0
    assert [e["step"] for e in metrics["evals"]] == [0, cfg.steps]


def test_a_truncated_checkpoint_is_one_line_naming_it(world, tmp_path):
    cfg, out = config(world["captions"]), tmp_path / "run"
    train.train(cfg, out, progress=False, stop_after=3)
    path = out / rundir.CHECKPOINT
    before = path.read_bytes()
    path.write_bytes(before[:len(before) // 2])
    with pytest.raises(ValueError) as err:
        train.train(cfg, out, progress=False, resume=True)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)
    assert (out / "log.jsonl").read_text().count("\n") == 3      # nothing was rewound


LOCK_HOLDER = """
import sys, time
from minialign.machinery.run.dirlock import DirLock
lock = DirLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_process_is_refused_and_a_dead_holder_does_not_block(world, tmp_path):
    cfg, out = config(world["captions"]), tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(out)],
                              stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(dirlock.DirLockedError) as err:
            train.train(cfg, out, progress=False)
        assert f"pid {holder.pid}" in str(err.value) and str(out) in str(err.value)
        assert sorted(p.name for p in out.iterdir()) == [dirlock.LOCK_FILE]   # nothing written
    finally:
        holder.kill()                                   # SIGKILL: no chance to clean up
        holder.wait()
    train.train(cfg, out, progress=False)               # the dead holder's lock is gone
    assert (out / "metrics.json").exists()


def test_a_run_in_progress_is_named_even_without_resume(world, tmp_path):
    """A second `train` without --resume into a folder another process is writing: it is told
    who holds it, not just that the folder is not empty."""
    cfg, out = config(world["captions"]), tmp_path / "run"
    train.train(cfg, out, progress=False, stop_after=2)
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(out)],
                              stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(dirlock.DirLockedError, match=f"pid {holder.pid}"):
            train.train(cfg, out, progress=False)
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(FileExistsError, match="not empty"):
        train.train(cfg, out, progress=False)


# ---------------------------------------------------------------- a grid: stop, evaluate, resume
RUN = "good_views-lr1.00e-03-seed0"       # the grid's one run (replicate's run_name)
SIZE = ["--steps", "6", "--batch-photos", "8", "--eval-every", "2", "--warmup-steps", "1",
        "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--max-len", "64"]


def replicate_argv(world, out):
    """`python -m minialign replicate` of one good_views run, 6 steps, evaluated at 2 and 4."""
    return ["replicate", "--captions", str(world["captions"]), "--embeddings",
            str(world["embeddings"]), "--out", str(out), "--objectives", "good_views",
            "--seeds", "0", "--lr-search", "off", "--jobs", "1", "--no-estimate", *SIZE]


def results_table(out):
    """results.md without its one wall-clock line (the runs' own times)."""
    return [line for line in (Path(out) / "results.md").read_text().splitlines()
            if "add up to" not in line]


class StopAfter(Injector):
    """Ctrl-C right after the nth (1-based) write event named `label` of this command."""

    def __init__(self, monkeypatch, label, nth):
        super().__init__(monkeypatch)
        self.label, self.left = label, nth

    def event(self, label, partial=None):
        super().event(label, partial)
        self.left -= label == self.label
        if label == self.label and self.left == 0:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def grid_reference(world, tmp_path_factory):
    """The grid run once without a stop: its results.md."""
    out = tmp_path_factory.mktemp("grid") / "res"
    assert cli.main(replicate_argv(world, out)) == 0
    return {"table": results_table(out)}


def run_step(world, out, what):
    """One user command of a sequence on the grid `out`: "stop:<label>:<n>" (replicate,
    Ctrl-C right after its nth write event `label`), "evaluate", "replicate", "report", or
    "train" (`train --resume` of the run itself). Returns its exit code."""
    run = out / "runs" / RUN
    if what.startswith("stop:"):
        _, label, nth = what.split(":", 2)
        with pytest.MonkeyPatch.context() as mp:
            StopAfter(mp, label.replace("@", ":"), int(nth))
            return cli.main(replicate_argv(world, out))
    argv = {"evaluate": ["evaluate", "--run", str(run), "--embeddings", str(world["embeddings"])],
            "replicate": replicate_argv(world, out), "report": ["report", str(out)],
            "train": ["train", "--captions", str(world["captions"]), "--objective", "good_views",
                      "--seed", "0", "--lr", "1e-3", "--out", str(run), "--resume", *SIZE]}[what]
    return cli.main(argv)


SEQUENCES = [  # each ends in a correct results.md; "@" stands for ":" in a label
    ("stop:replace-after@checkpoint.npz:1", "evaluate", "replicate"),           # the issue's
    ("stop:replace-after@checkpoint.npz:1", "evaluate", "report", "replicate"),
    ("stop:replace-after@checkpoint.npz:2", "evaluate", "train", "report"),     # report rescores
    ("stop:replace-after@checkpoint.npz:2", "evaluate", "train", "replicate"),
    ("stop:replace-before@model.npz:1", "evaluate", "replicate", "evaluate", "report"),
    ("stop:replace-after@checkpoint.npz:1", "evaluate", "stop:replace-after@checkpoint.npz:2",
     "evaluate", "replicate"),
    ("replicate", "evaluate", "report"),                                        # nothing stale
]


@pytest.mark.parametrize("sequence", SEQUENCES, ids=["-".join(s.split(":")[0] for s in seq)
                                                     for seq in SEQUENCES])
def test_stop_evaluate_resume_in_any_order_ends_in_the_same_results(world, grid_reference,
                                                                    tmp_path, sequence, capsys):
    """Issue 28.2: replicate stopped during its run, the run evaluated (a partial run has a
    val split), then the grid resumed (replicate, or train --resume and report): the partial
    run's scores are stale once it trains further and are scored again, so results.md is the
    uninterrupted grid's; before #28 the rerun ended in KeyError: 'test' (report.py)."""
    out = tmp_path / "res"
    codes = [run_step(world, out, what) for what in sequence]
    stops = [k for k, what in enumerate(sequence) if what.startswith("stop:")]
    assert [codes[k] for k in stops] == [cli.EXIT_INTERRUPTED] * len(stops)
    assert [c for k, c in enumerate(codes) if k not in stops] == [0] * (len(codes) - len(stops))
    assert results_table(out) == grid_reference["table"]
    scores = rundir.read_metrics(out / "runs" / RUN)["image_alignment"]
    assert scores["checkpoint"]["step"] == 6 and "test" in scores["steps"][-1]
    assert [e["step"] for e in scores["steps"]] == [0, 2, 4, 6]
    said = capsys.readouterr()
    assert "Traceback" not in said.err and "KeyError" not in said.err
    if sequence[:2] == (sequence[0], "evaluate") and sequence[0].startswith("stop:"):
        assert f"{out / 'runs' / RUN}: its image scores are of step " in said.out
        assert "; the run is now at step 6: scoring it again" in said.out      # said, not silent
