"""The training loop: same seed -> bit-identical losses; short real runs learn; run directory."""
import json

import numpy as np
import pytest

from minialign.model import ModelConfig
from minialign.synthetic import write_world
from minialign.train import TrainConfig, embed_captions, load_model, train

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


def test_load_model_reproduces_the_saved_embeddings(world, tmp_path):
    cfg = TrainConfig(objective="next_token", captions=str(world), steps=2, batch_photos=16,
                      warmup_steps=1, eval_every=2, model=SMALL)
    train(cfg, tmp_path / "run", progress=False)
    params, tok, loaded = load_model(tmp_path / "run")
    assert loaded.objective == "next_token" and loaded.model.vocab_size == tok.vocab_size
    assert params["tok_emb"].shape == (tok.vocab_size, 32) and params["tok_emb"].dtype == np.float32
    saved = np.load(tmp_path / "run" / "captions" / "test_step00002.npz")
    ids = saved["slot0_image_ids"][:5]
    doc = json.loads(open(world).read())
    by_id = {}
    for a in sorted(doc["annotations"], key=lambda a: a["id"]):
        by_id.setdefault(a["image_id"], []).append(" ".join(a["caption"].split()).lower())
    z = embed_captions(tmp_path / "run", [by_id[i][0] for i in ids])
    np.testing.assert_allclose(z, saved["slot0_z"][:5].astype(np.float32), rtol=2e-3, atol=2e-3)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)
