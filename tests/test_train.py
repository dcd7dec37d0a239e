"""The training loop: same seed -> bit-identical losses; short real runs learn; run directory."""
import json

import numpy as np
import pytest

from minialign.model import ModelConfig
from minialign.synthetic import write_world
from minialign.train import TrainConfig, train

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_len=64)


def losses(run):
    return [json.loads(line)["loss"] for line in (run / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    captions, _ = write_world(tmp_path_factory.mktemp("world"), n_scenes=200, seed=0)
    return captions


@pytest.mark.parametrize("objective", ["good_views", "bad_views", "next_token"])
def test_same_seed_bit_identical_losses(world, tmp_path, objective):
    cfg = TrainConfig(objective=objective, captions=str(world), steps=3, batch_photos=16,
                      warmup_steps=1, eval_every=3, model=SMALL)
    train(cfg, tmp_path / "a", progress=False)
    train(cfg, tmp_path / "b", progress=False)
    train(TrainConfig(**{**cfg.__dict__, "seed": 1}), tmp_path / "c", progress=False)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")          # == on floats: bit for bit
    assert losses(tmp_path / "a") != losses(tmp_path / "c")
    for name in ("model.npz", "captions/test_step00003.npz"):
        a, b = np.load(tmp_path / "a" / name), np.load(tmp_path / "b" / name)
        assert all(a[k].tobytes() == b[k].tobytes() for k in a.files), name


@pytest.mark.parametrize("objective", ["good_views", "bad_views", "next_token"])
def test_short_real_run_learns(real_captions_path, tmp_path, objective):
    """Tens of steps on the real COCO captions: every loss finite, and falling."""
    cfg = TrainConfig(objective=objective, captions=str(real_captions_path), steps=40,
                      batch_photos=64, lr=3e-3, warmup_steps=5, eval_every=40,
                      model=ModelConfig(d_model=64, n_layers=1, n_heads=2))
    metrics = train(cfg, tmp_path / "run", progress=False)
    curve = losses(tmp_path / "run")
    assert len(curve) == 40 and np.isfinite(curve).all()
    assert np.mean(curve[-5:]) < 0.9 * np.mean(curve[:5]), curve
    final = metrics["final"]
    assert set(final) == {"step", "val", "test"} and final["step"] == 40
    assert final["test"]["chance"] == pytest.approx(1 / 1000)
    written = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"config.json", "log.jsonl", "model.npz", "metrics.json", "captions"} <= written
