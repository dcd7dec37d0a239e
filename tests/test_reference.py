"""Behaviour pinned to stored numbers: the same seed gives bit-identical losses, gradients,
weights, saved caption embeddings and metrics as the code had when the numbers were stored.

Bit-identical holds only for the environment the numbers were made in (their "environment":
numpy's version, its BLAS and version, the kernel OpenBLAS picked for the CPU): another BLAS
kernel (another CPU, OPENBLAS_CORETYPE, Accelerate) or numpy rounds float32 sums in another
order. There every number is compared to TOLERANCE instead, digests through the per-array
summaries stored beside them (summary: float64 norm, sum, sum of |x|; exact for integer and
text arrays), and the run says which comparison it made (conftest's summary line).

tests/reference_numbers.json was written by `reference_numbers` below (its "made_with" names the
commit), before the package was reorganised. A refactor must leave every number unchanged;
a deliberate change of behaviour regenerates the file and says why in its commit:
    python -c "import sys; sys.path.insert(0, 'tests'); import test_reference as t; \\
               t.write_reference('tests/reference_numbers.json')"
"""
import dataclasses
import hashlib
import json
import math
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import NEEDS_FAST_PATH
from minialign import train
from minialign.machinery.images import synthetic
from minialign.machinery.run.machine import describe
from minialign.data import sample_batch
from minialign.model import ModelConfig, init_params
from minialign.objectives import OBJECTIVES

STORED = Path(__file__).with_name("reference_numbers.json")
OBJECTIVE_NAMES = ("good_views", "bad_views", "next_token")
TEXT_KEYS = ("paraphrase_R@1", "chance", "std", "effective_rank")
ENVIRONMENT_KEYS = ("numpy", "blas", "blas_core")   # machine.describe's: what sets the bits
# Outside the recorded environment, measured with OpenBLAS forced onto other kernels
# (Sandybridge, SkylakeX) and on numpy 1.25 (docs/platforms.md): losses, gradients and weights
# moved <= 2e-5 (relative), the evaluations and the float16 caption embeddings <= 5e-4.
TOLERANCE = {"rel": 1e-4, "abs": 1e-6}             # float32 training: losses, grads, weights
EMBEDDING_TOLERANCE = {"rel": 2e-3, "abs": 1e-6}   # evaluations, float16 caption embeddings
LOOSE = ("evals", "captions_summary")                # the keys compared to EMBEDDING_TOLERANCE
SUMMARIES = {"model_sha256": "model_summary", "captions_sha256": "captions_summary",
             "init_grads_sha256": "init_grads_summary",
             "init_params_sha256": "init_params_summary"}   # digest -> what stands in for it
# VICReg's loss does not change when every z moves by one vector (the invariance term takes a
# difference, variance and covariance centre z), so the final LayerNorm's beta has a zero
# gradient in exact arithmetic: its computed gradient is rounding noise, and Adam's normalised
# step turns that noise into moves of ~lr either way. Outside the recorded environment it is
# checked to be noise, not compared; it shifts the view objectives' embeddings (LOOSE).
ROUNDING_NOISE = {"good_views": ("ln_f.beta",), "bad_views": ("ln_f.beta",)}


def digest(arrays):
    """sha256 over the names, dtypes, shapes and bytes of a dict of arrays, names sorted."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        for part in (name, a.dtype.str, str(a.shape)):
            h.update(part.encode())
        h.update(a.tobytes())
    return h.hexdigest()


def summary(arrays):
    """Per array (names sorted): float arrays {"norm", "sum", "abs_sum"} in float64 (math.fsum:
    no BLAS, the same on every machine for the same values), any other {"sha256"}."""
    out = {}
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        if np.issubdtype(a.dtype, np.floating):
            x = a.astype(np.float64).ravel().tolist()
            out[name] = {"norm": math.sqrt(math.fsum(v * v for v in x)), "sum": math.fsum(x),
                         "abs_sum": math.fsum(abs(v) for v in x)}
        else:
            out[name] = {"sha256": digest({name: a})}
    return out


def environment():
    """The environment the stored numbers are bit-exact in: describe()'s ENVIRONMENT_KEYS."""
    found = describe()
    return {k: found[k] for k in ENVIRONMENT_KEYS}


def comparison(stored=None):
    """("exact" | "tolerance", one line saying which and why) for this process."""
    recorded = (stored or json.loads(STORED.read_text()))["environment"]
    here = environment()
    said = ", ".join(f"{k} {here[k]}" for k in ENVIRONMENT_KEYS)
    if here == recorded:
        return "exact", f"reference numbers compared exactly (recorded environment: {said})"
    return "tolerance", (f"reference numbers compared to rtol {TOLERANCE['rel']:g} (evaluations "
                         f"{EMBEDDING_TOLERANCE['rel']:g}): here {said}; recorded "
                         + ", ".join(f"{k} {recorded[k]}" for k in ENVIRONMENT_KEYS))


def close(now, stored, where, tol=TOLERANCE):
    """Assert `now` equals `stored` to `tol` (pytest.approx's rel and abs), recursively through
    dicts and lists; numbers by rel / abs, a summary's "sum" to rel x its "abs_sum", anything
    else (ints, strings, sha256s) exactly."""
    if isinstance(stored, dict):
        assert isinstance(now, dict) and sorted(now) == sorted(stored), where
        for k in stored:
            if k == "sum" and "abs_sum" in stored:
                scale = tol["rel"] * stored["abs_sum"] + tol["abs"]
                assert abs(now[k] - stored[k]) <= scale, f"{where}.sum: {now[k]} vs {stored[k]}"
            else:
                close(now[k], stored[k], f"{where}.{k}", tol)
    elif isinstance(stored, list):
        assert isinstance(now, list) and len(now) == len(stored), where
        for i, (a, b) in enumerate(zip(now, stored)):
            close(a, b, f"{where}[{i}]", tol)
    elif isinstance(stored, float):
        assert now == pytest.approx(stored, **tol), f"{where}: {now!r} vs {stored!r}"
    else:
        assert now == stored, f"{where}: {now!r} vs {stored!r}"


def without_noise(objective, numbers):
    """numbers with ROUNDING_NOISE's arrays taken out of the gradient and weight summaries,
    after checking that their gradient is noise: a norm below 1e-6 of the whole gradient's."""
    noise = ROUNDING_NOISE.get(objective, ())
    grads = numbers["init_grads_summary"]
    whole = math.fsum(g["norm"] for g in grads.values())
    for name in noise:
        assert grads[name]["norm"] < 1e-6 * whole, f"{objective}: d{name} is not rounding noise"
    return {**numbers, **{key: {k: v for k, v in numbers[key].items() if k not in noise}
                          for key in ("init_grads_summary", "model_summary")}}


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
            "init_params_sha256": digest(params), "init_grads_summary": summary(grads),
            "init_params_summary": summary(params)}


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
    captions = sorted((run / "captions").glob("*.npz"))
    return {"log": log, "evals": evals, "model_sha256": digest(npz(run / "model.npz")),
            "captions_sha256": {p.name: digest(npz(p)) for p in captions},
            "model_summary": summary(npz(run / "model.npz")),
            "captions_summary": {p.name: summary(npz(p)) for p in captions},
            **first_step_gradients(cfg)}


def write_reference(path):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    root = Path(tempfile.mkdtemp())
    numbers = {name: reference_numbers(root, name) for name in OBJECTIVE_NAMES}
    Path(path).write_text(json.dumps({"made_with": commit, "environment": environment(),
                                      "objectives": numbers}, indent=1) + "\n")


@NEEDS_FAST_PATH                      # the numbers were recorded on the fast set
@pytest.mark.parametrize("objective", OBJECTIVE_NAMES)
def test_same_numbers_as_stored(objective, tmp_path):
    stored_file = json.loads(STORED.read_text())
    stored = stored_file["objectives"][objective]
    mode, line = comparison(stored_file)
    now = reference_numbers(tmp_path, objective)
    if mode == "tolerance":
        now, stored = without_noise(objective, now), without_noise(objective, stored)
    for key in stored:                                 # one assertion per kind of number
        if key == "evals":           # stored before step 0 was evaluated (#22): those steps
            by_step = {e["step"]: e for e in now[key]}
            now[key] = [by_step.get(e["step"]) for e in stored[key]]
        elif key in ("captions_sha256", "captions_summary"):   # ... and their caption files
            now[key] = {name: now[key].get(name) for name in stored[key]}
        if mode == "exact":
            assert now[key] == stored[key], f"{objective}: {key} differs from {STORED.name}"
        elif key not in SUMMARIES:                     # a digest: its summary stands in
            close(now[key], stored[key], f"{objective}: {key} ({line})",
                  EMBEDDING_TOLERANCE if key in LOOSE else TOLERANCE)


def test_the_tolerance_check_can_fail():
    """close() accepts rounding-size changes and refuses a change the size of a real one."""
    stored = {"loss": 21.894149780273438, "w": {"norm": 3.0, "sum": 0.5, "abs_sum": 9.0},
              "ids": {"sha256": "ab"}}
    close({"loss": 21.894150028, "w": {"norm": 3.00001, "sum": 0.50001, "abs_sum": 9.0},
           "ids": {"sha256": "ab"}}, stored, "rounding")
    for changed in ({"loss": 21.9}, {"w": {"norm": 3.0, "sum": 0.502, "abs_sum": 9.0}},
                    {"ids": {"sha256": "ac"}}):
        with pytest.raises(AssertionError):
            close({**stored, **changed}, stored, "changed")
