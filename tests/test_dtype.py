"""--dtype float64 (ModelConfig.dtype, #29 item 4): a run whose weights, and so every
activation, gradient and Adam moment, are float64, whose rounding (~1e-16) is too small for
training to carry into its results. The flag reaches config.json, the weights, the checkpoint
and model.npz; a stopped float64 run resumes to the same weights; the fast and the reference
layer sets train to the same weights and metrics; memory estimates say so (results.md's
protocol line: tests/test_report.py)."""
import dataclasses
import json

import numpy as np
import pytest
from conftest import NEEDS_FAST_PATH

from minialign.__main__ import main
from minialign.machinery.grid.memory import MEM_BASE_MB, MEM_MARGIN, run_memory_mb
from minialign.machinery.images.synthetic import CAPTIONS_NAME, write_world
from minialign.model import ModelConfig, init_params
from minialign.train import TrainConfig, train

TINY = dict(steps=12, batch_photos=16, warmup_steps=3, eval_every=6, lr=3e-3)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    write_world(out, n_scenes=80, seed=0)
    return str(out / CAPTIONS_NAME)


def tiny_config(world, objective="good_views", **model):
    shape = dict(d_model=16, n_layers=1, n_heads=2, mlp_ratio=2, max_len=24, dtype="float64")
    return TrainConfig(objective=objective, captions=world, seed=3, **TINY,
                       model=ModelConfig(**{**shape, **model}))


def weights(run):
    with np.load(run / "model.npz") as z:
        return {k: z[k] for k in z.files if not k.startswith("tokenizer")}


def test_init_params_follows_the_config():
    rng = lambda: np.random.default_rng(0)
    small = ModelConfig(vocab_size=12, max_len=6, d_model=8, n_layers=1, n_heads=2)
    p32 = init_params(small, rng())
    p64 = init_params(dataclasses.replace(small, dtype="float64"), rng())
    assert {p.dtype for p in p32.values()} == {np.dtype(np.float32)}
    assert {p.dtype for p in p64.values()} == {np.dtype(np.float64)}
    for k in p32:                                  # the same draws, only wider
        assert np.array_equal(p64[k].astype(np.float32), p32[k]), k
    assert init_params(small, rng(), np.float64)["tok_emb"].dtype == np.float64   # explicit wins
    with pytest.raises(ValueError, match="dtype='float16' must be one of float32, float64"):
        ModelConfig(dtype="float16")


def test_the_flag_reaches_config_weights_checkpoint_and_model(world, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--objective", "next_token", "--captions", world, "--out", str(out),
                 "--steps", "2", "--batch-photos", "8", "--warmup-steps", "1", "--eval-every",
                 "2", "--d-model", "8", "--n-layers", "1", "--n-heads", "2",
                 "--dtype", "float64"]) in (0, None)
    assert json.loads((out / "config.json").read_text())["config"]["model"]["dtype"] == "float64"
    with np.load(out / "checkpoint.npz") as ckpt:
        arrays = [ckpt[k] for k in ckpt.files if k.startswith(("params/", "adam_"))]
        assert arrays and {a.dtype for a in arrays} == {np.dtype(np.float64)}
    assert {w.dtype for w in weights(out).values()} == {np.dtype(np.float64)}
    with pytest.raises(SystemExit) as refused:
        main(["train", "--captions", world, "--out", str(tmp_path / "x"), "--dtype", "float16"])
    assert refused.value.code == 2


def test_a_stopped_float64_run_resumes_to_the_same_weights(world, tmp_path):
    cfg = tiny_config(world, "bad_views")
    train(cfg, tmp_path / "whole", progress=False)
    assert train(cfg, tmp_path / "cut", progress=False, stop_after=7) is None
    train(cfg, tmp_path / "cut", progress=False, resume=True)
    whole, cut = weights(tmp_path / "whole"), weights(tmp_path / "cut")
    assert whole.keys() == cut.keys() and whole["tok_emb"].dtype == np.float64
    for k in whole:
        assert np.array_equal(whole[k], cut[k]), k


@NEEDS_FAST_PATH
@pytest.mark.parametrize("objective", ["good_views", "bad_views", "next_token"])
def test_fast_and_reference_train_to_the_same_run_in_float64(world, tmp_path, objective):
    """Two layer sets round differently; in float64 that difference (~1e-16) stays far below
    anything the metrics resolve after training (docs/protocol.md measures the demo)."""
    runs = {}
    for layers in ("fast", "reference"):
        train(tiny_config(world, objective, layers=layers), tmp_path / layers, progress=False)
        final = json.loads((tmp_path / layers / "metrics.json").read_text())["final"]
        runs[layers] = weights(tmp_path / layers), final
    (w_f, final_f), (w_r, final_r) = runs["fast"], runs["reference"]
    for k in w_r:
        assert np.abs(w_f[k] - w_r[k]).max() <= 1e-9 * max(1.0, np.abs(w_r[k]).max()), k
    for split in ("val", "test"):
        for name, value in final_r[split].items():
            if isinstance(value, float):
                assert final_f[split][name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_memory_estimate_doubles_everything_but_the_interpreter():
    cfg32 = TrainConfig(objective="next_token", batch_photos=64)
    cfg64 = dataclasses.replace(cfg32, model=dataclasses.replace(cfg32.model, dtype="float64"))
    grown32 = run_memory_mb(cfg32, 5000) / MEM_MARGIN - MEM_BASE_MB
    grown64 = run_memory_mb(cfg64, 5000) / MEM_MARGIN - MEM_BASE_MB
    assert grown32 > 10 and grown64 == pytest.approx(2 * grown32, rel=1e-12)


def test_resuming_under_another_dtype_names_that_field_alone(world, tmp_path):
    cfg = tiny_config(world)
    assert train(cfg, tmp_path / "run", progress=False, stop_after=3) is None
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="float32"))
    with pytest.raises(ValueError) as refused:
        train(other, tmp_path / "run", progress=False, resume=True)
    assert str(refused.value) == (
        f"{tmp_path / 'run'}: holds a run of another config, so it cannot be resumed "
        f"(model.dtype: 'float64' -> 'float32'); pick another directory or pass --force")
