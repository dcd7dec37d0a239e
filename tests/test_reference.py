"""Behaviour pinned to stored numbers: the same seed gives bit-identical losses, gradients,
weights, saved caption embeddings and metrics as the code had when the numbers were stored.

tests/reference_numbers.json was written by `reference_numbers` below (its "made_with" names the
commit), before the package was reorganised. A refactor must leave every number unchanged;
a deliberate change of behaviour regenerates the file and says why in its commit:
    python -c "import sys; sys.path.insert(0, 'tests'); import test_reference as t; \\
               t.write_reference('tests/reference_numbers.json')"
"""
import dataclasses
import hashlib
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from minialign import train
from minialign.machinery import synthetic
from minialign.data import sample_batch
from minialign.model import ModelConfig, init_params
from minialign.objectives import OBJECTIVES

STORED = Path(__file__).with_name("reference_numbers.json")
OBJECTIVE_NAMES = ("good_views", "bad_views", "next_token")
TEXT_KEYS = ("paraphrase_R@1", "chance", "std", "effective_rank")


def digest(arrays):
    """sha256 over the names, dtypes, shapes and bytes of a dict of arrays, names sorted."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        for part in (name, a.dtype.str, str(a.shape)):
            h.update(part.encode())
        h.update(a.tobytes())
    return h.hexdigest()


def npz(path):
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def config(objective, captions):
    """A 2-block D=16 model, 4 steps of 16 photos, evaluations at steps 2 and 4."""
    return train.TrainConfig(objective=objective, captions=str(captions), steps=4,
                             batch_photos=16, eval_every=2, warmup_steps=1,
                             model=ModelConfig(d_model=16, n_layers=2, n_heads=2, max_len=64))


def first_step_gradients(cfg):
    """Loss, gradient and init-weight digests of one objective call on the first batch."""
    data = train.prepare(cfg)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, vocab_size=data["tokenizer"].vocab_size))
    rng_init, rng_data, rng_mask = (np.random.default_rng(s)
                                    for s in np.random.SeedSequence(cfg.seed).spawn(3))
    params = init_params(cfg.model, rng_init)
    batch = sample_batch(data["tables"]["train"], cfg.batch_photos, rng_data)
    loss, grads, _ = OBJECTIVES[cfg.objective](params, batch, cfg, rng_mask)
    return {"init_loss": float(loss), "init_grads_sha256": digest(grads),
            "init_params_sha256": digest(params)}


def reference_numbers(root, objective):
    """Every number the reference pins for one objective, from a fresh run under root."""
    captions = root / "world" / synthetic.CAPTIONS_NAME
    if not captions.exists():
        synthetic.write_world(root / "world", n_scenes=200, seed=0, world="v1")
    cfg, run = config(objective, captions), root / objective
    train.train(cfg, run, progress=False)
    log = [{k: v for k, v in json.loads(line).items() if k != "seconds"}
           for line in (run / "log.jsonl").read_text().splitlines()]
    evals = [{"step": e["step"], **{split: {k: e[split][k] for k in TEXT_KEYS}
                                    for split in ("val", "test") if split in e}}
             for e in json.loads((run / "metrics.json").read_text())["evals"]]
    return {"log": log, "evals": evals, "model_sha256": digest(npz(run / "model.npz")),
            "captions_sha256": {p.name: digest(npz(p))
                                for p in sorted((run / "captions").glob("*.npz"))},
            **first_step_gradients(cfg)}


def write_reference(path):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    root = Path(tempfile.mkdtemp())
    numbers = {name: reference_numbers(root, name) for name in OBJECTIVE_NAMES}
    Path(path).write_text(json.dumps({"made_with": commit, "objectives": numbers}, indent=1)
                          + "\n")


@pytest.mark.parametrize("objective", OBJECTIVE_NAMES)
def test_same_numbers_as_stored(objective, tmp_path, capsys):
    stored = json.loads(STORED.read_text())["objectives"][objective]
    now = reference_numbers(tmp_path, objective)
    for key in stored:                                 # one assertion per kind of number
        if key == "evals":           # stored before step 0 was evaluated (#22): those steps
            by_step = {e["step"]: e for e in now[key]}
            now[key] = [by_step.get(e["step"]) for e in stored[key]]
        elif key == "captions_sha256":                 # ... and those steps' caption files
            now[key] = {name: now[key].get(name) for name in stored[key]}
        assert now[key] == stored[key], f"{objective}: {key} differs from {STORED.name}"
