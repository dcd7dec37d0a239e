"""Tests of stopping and resuming train.train: a run stopped after k steps and resumed ends
bit-identical to one never stopped; a finished run is skipped; another config is an error.

Tiny runs (1 block, D = 16, 16 photos per step, 8 steps, checkpoints at 3, 6 and 8) on a
300-scene SYNTHETIC world. bad_views draws from both the data and the mask generators.
"""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from minialign import train
from minialign.machinery.run import checkpoint, rundir
from minialign.machinery.images import synthetic
from minialign.model import ModelConfig

TINY = ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=64)
STEPS, EVAL_EVERY = 8, 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The captions file, and one uninterrupted bad_views run to compare against."""
    root = tmp_path_factory.mktemp("world")
    captions, _ = synthetic.write_world(root, n_scenes=300, seed=0, world="v1")
    cfg = config(captions)
    train.train(cfg, root / "whole", progress=False)
    return {"captions": captions, "whole": root / "whole"}


def config(captions, **changes):
    fields = dict(objective="bad_views", captions=str(captions), steps=STEPS, batch_photos=16,
                  eval_every=EVAL_EVERY, warmup_steps=2, model=TINY)
    return train.TrainConfig(**{**fields, **changes})


def arrays(path):
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def assert_same_run(a, b):
    """Same final weights, Adam moments, generator states, logged values and saved evaluations."""
    ckpt_a, ckpt_b = arrays(a / rundir.CHECKPOINT), arrays(b / rundir.CHECKPOINT)
    assert sorted(ckpt_a) == sorted(ckpt_b)
    for name in ckpt_a:
        if name != "state":
            assert ckpt_a[name].tobytes() == ckpt_b[name].tobytes(), name
    state_a, state_b = (json.loads(str(c["state"])) for c in (ckpt_a, ckpt_b))
    for key in ("step", "adam_t", "rng"):          # not log_bytes: it counts timing digits
        assert state_a[key] == state_b[key], key
    # every logged number is identical; only each step's wall time ("seconds") may differ
    untimed = lambda run: [{k: v for k, v in json.loads(line).items() if k != "seconds"}
                           for line in (run / "log.jsonl").read_text().splitlines()]
    assert untimed(a) == untimed(b)
    model_a, model_b = arrays(a / "model.npz"), arrays(b / "model.npz")
    assert all(model_a[k].tobytes() == model_b[k].tobytes() for k in model_a)
    metrics_a, metrics_b = (json.loads((r / "metrics.json").read_text()) for r in (a, b))
    assert metrics_a["evals"] == metrics_b["evals"] and metrics_a["final"] == metrics_b["final"]
    names_a = sorted(p.name for p in (a / "captions").iterdir())
    assert names_a == sorted(p.name for p in (b / "captions").iterdir())
    for name in names_a:
        saved_a, saved_b = arrays(a / "captions" / name), arrays(b / "captions" / name)
        assert all(saved_a[k].tobytes() == saved_b[k].tobytes() for k in saved_a), name


@pytest.mark.parametrize("stop_after", [5, 6])   # between checkpoints, and right on one
def test_stopped_and_resumed_run_is_bit_identical(world, tmp_path, stop_after):
    cfg, run = config(world["captions"]), tmp_path / "run"
    assert train.train(cfg, run, progress=False, stop_after=stop_after) is None
    log = (run / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log] == list(range(1, stop_after + 1))
    assert "final" not in json.loads((run / "metrics.json").read_text())
    train.train(cfg, run, progress=False, resume=True)
    steps = [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))                 # no step twice
    assert_same_run(world["whole"], run)


def test_stopped_twice_before_and_after_a_checkpoint(world, tmp_path):
    cfg, run = config(world["captions"]), tmp_path / "run"
    train.train(cfg, run, progress=False, stop_after=2)       # before the first checkpoint
    assert not (run / rundir.CHECKPOINT).exists()
    assert checkpoint.run_state(run, cfg) == "restart"
    train.train(cfg, run, progress=False, resume=True, stop_after=7)
    train.train(cfg, run, progress=False, resume=True)
    assert_same_run(world["whole"], run)


def test_resumed_during_final_evaluation(world, tmp_path):
    """Killed after the last step's checkpoint but before "final": one final evaluation."""
    cfg, run = config(world["captions"]), Path(shutil.copytree(world["whole"], tmp_path / "r"))
    metrics = json.loads((run / "metrics.json").read_text())
    del metrics["final"]                                       # the final eval entry is kept
    (run / "metrics.json").write_text(json.dumps(metrics))
    assert checkpoint.run_state(run, cfg) == "checkpoint"
    train.train(cfg, run, progress=False, resume=True)
    assert_same_run(world["whole"], run)
    evals = json.loads((run / "metrics.json").read_text())["evals"]
    assert [e["step"] for e in evals] == [0, 3, 6, 8]


def test_finished_run_is_skipped(world, tmp_path, capsys):
    cfg, run = config(world["captions"]), Path(shutil.copytree(world["whole"], tmp_path / "r"))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    metrics = train.train(cfg, run, progress=False, resume=True)
    assert "already finished" in capsys.readouterr().out
    assert metrics == json.loads((run / "metrics.json").read_text())
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_config_mismatch_is_an_error_naming_the_directory(world, tmp_path):
    run = Path(shutil.copytree(world["whole"], tmp_path / "r"))
    with pytest.raises(ValueError, match=rf"{run}.*lr: 0.001 -> 0.002"):
        train.train(config(world["captions"], lr=2e-3), run, progress=False, resume=True)
    with pytest.raises(FileExistsError, match="--resume"):  # without resume: refused as before
        train.train(config(world["captions"]), run, progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a run")
    with pytest.raises(FileExistsError, match="not a run directory"):
        train.train(config(world["captions"]), tmp_path / "other", progress=False, resume=True)
    with pytest.raises(ValueError, match="not both"):
        train.train(config(world["captions"]), run, force=True, resume=True)


def test_a_checkpoint_at_least_every_checkpoint_seconds(world, tmp_path, monkeypatch):
    """train.CHECKPOINT_SECONDS = 0: a checkpoint after every step, so a run stopped after
    step 5 (evaluations at 3 and 6) resumes from step 5, not 3, and ends as one never stopped."""
    monkeypatch.setattr(train, "CHECKPOINT_SECONDS", 0)
    cfg, run = config(world["captions"]), tmp_path / "run"
    assert train.train(cfg, run, progress=False, stop_after=5) is None
    assert json.loads(str(arrays(run / rundir.CHECKPOINT)["state"]))["step"] == 5
    train.train(cfg, run, progress=False, resume=True)
    assert_same_run(world["whole"], run)


# ---------------------------------------------------------------- inputs by what they are
def test_resume_matches_the_captions_file_by_its_bytes_not_its_spelling(tmp_path, monkeypatch):
    """`train --captions c.json` then `--captions "$PWD/c.json" --resume` (or a copy of the
    same bytes) resumes; a file of other bytes is refused, naming both; a run from before the
    sha256 was recorded is matched by reading its saved spelling again."""
    from minialign.machinery.run.files import atomic_write_json, read_json
    captions = Path(synthetic.write_world(tmp_path / "world", n_scenes=120, seed=0)[0])
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(captions)
    cfg = lambda path: train.TrainConfig(objective="good_views", captions=str(path), steps=4,
                                         batch_photos=16, eval_every=2, warmup_steps=1,
                                         model=TINY)
    train.train(cfg(relative), "run", progress=False, stop_after=2)
    assert train.train(cfg(captions.resolve()), "run", progress=False, resume=True)["final"]
    copy = tmp_path / "copy.json"
    copy.write_bytes(captions.read_bytes())
    train.train(cfg(relative), "run2", progress=False, stop_after=2)
    other = tmp_path / "other.json"
    other.write_bytes(captions.read_bytes().replace(b"a ", b"an ", 1))
    with pytest.raises(ValueError) as err:
        train.train(cfg(other), "run2", progress=False, resume=True)
    message = str(err.value)
    assert message.startswith("run2: holds a run of another config, so it cannot be resumed "
                              f"(captions: {relative!r} -> {str(other)!r} (other bytes: sha256 ")
    assert "\n" not in message
    config = read_json(Path("run2") / rundir.CONFIG)           # as written before #19
    del config["info"]["captions_sha256"]
    atomic_write_json(Path("run2") / rundir.CONFIG, config)
    with pytest.raises(ValueError, match=r"other.json' \(other bytes: sha256 \w{12}\.\.\. in the "
                                         r"saved file, \w{12}\.\.\. now\)"):
        train.train(cfg(other), "run2", progress=False, resume=True)
    assert train.train(cfg(copy), "run2", progress=False, resume=True)["final"]
