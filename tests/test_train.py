"""The training loop: same seed -> bit-identical losses; short real runs learn; run directory."""
import dataclasses
import json

import numpy as np
import pytest

from conftest import NEEDS_FAST_PATH
from minialign.model import ModelConfig
from minialign.machinery.images.synthetic import write_world
from minialign.machinery.run.encoder import embed_captions, load_model
from minialign.train import TrainConfig, train

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_len=64)


def losses(run):
    return [json.loads(line)["loss"] for line in (run / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    captions, _ = write_world(tmp_path_factory.mktemp("world"), n_scenes=200, seed=0, world="v1")
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


# ------------------------------------------- photos with 2-3 captions; raw text (#4, #9)

@pytest.fixture(scope="module")
def few_captions_world(tmp_path_factory):
    """The 200-scene synthetic world cut to 2 captions per photo (odd image ids: 3), and the
    first caption of every photo whose id is a multiple of 3 ending in "near the dog's bed"."""
    root = tmp_path_factory.mktemp("few")
    captions, embeddings = write_world(root, n_scenes=200, seed=0, world="v1")
    doc = json.loads(open(captions).read())
    kept, seen = [], {}
    for a in sorted(doc["annotations"], key=lambda a: a["id"]):
        k = seen.get(a["image_id"], 0)
        if k < 2 + a["image_id"] % 2:
            if k == 0 and a["image_id"] % 3 == 0:
                a = {**a, "caption": a["caption"].rstrip(" .") + " near the dog's bed."}
            kept.append(a)
            seen[a["image_id"]] = k + 1
    doc["annotations"] = kept
    path = root / "few.json"
    path.write_text(json.dumps(doc))
    return path, embeddings


def test_photos_with_two_or_three_captions_train_to_the_end(few_captions_world, tmp_path):
    from minialign.machinery.run.monitor import load_coco_captions
    from minialign.machinery.images.embeddings import load_embeddings
    from minialign.machinery.images.evaluate import evaluate_run, load_caption_slots
    path, embeddings = few_captions_world
    caps = load_coco_captions(path)
    assert caps.stats["max_captions_per_photo"] == 3
    assert {len(c) for c in caps.captions} == {2, 3}
    cfg = TrainConfig(objective="good_views", captions=str(path), steps=4, batch_photos=16,
                      warmup_steps=1, eval_every=2, model=SMALL)
    metrics = train(cfg, tmp_path / "run", progress=False)
    assert [e["step"] for e in metrics["evals"]] == [0, 2, 4]   # 0: the untrained encoder
    assert (tmp_path / "run" / "captions" / "val_step00000.npz").is_file()
    for entry in metrics["evals"]:
        for split in set(entry) - {"step"}:
            assert entry[split]["caption_slots"] == 3
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["final"]["test"][
        "caption_slots"] == 3
    # slot 2 holds exactly the test photos with a third caption (odd image ids)
    slots = load_caption_slots(tmp_path / "run" / "captions" / "test_step00004.npz")
    assert len(slots) == 3
    assert np.array_equal(slots[0][0], slots[1][0])
    assert np.array_equal(slots[2][0], slots[0][0][slots[0][0] % 2 == 1])
    # evaluate.py scores such a run: text side alone, and against the image embeddings
    text_only = evaluate_run(tmp_path / "run", None, write=False)
    assert text_only["steps"][-1]["test"]["text"]["caption_slots"] == 3
    assert text_only["steps"][-1]["test"]["text"]["paraphrase_R@1"] == pytest.approx(
        metrics["final"]["test"]["paraphrase_R@1"], abs=0.05)          # float16 round trip
    scored = evaluate_run(tmp_path / "run", load_embeddings(embeddings), write=False)
    test = scored["steps"][-1]["test"]
    assert len(test["mutual_knn"]["per_slot"]) == 3 and 0 <= test["mutual_knn"]["mean"] <= 1
    assert test["photos"]["photos"] == len(slots[2][0])     # the photos that have all 3 slots


def test_embed_captions_cleans_raw_text_like_training(few_captions_world, tmp_path):
    path, _ = few_captions_world
    cfg = TrainConfig(objective="good_views", captions=str(path), steps=2, batch_photos=16,
                      warmup_steps=1, eval_every=2, model=SMALL)
    train(cfg, tmp_path / "run", progress=False)
    _, tok, _ = load_model(tmp_path / "run")
    assert {"dog's", "bed", "near"} <= set(tok.vocab)
    raw = tok.encode("A Dog\u2019s  Bed\n")[0]
    assert raw.tolist() == tok.encode("a dog's bed")[0].tolist()
    assert raw.tolist() == [2, tok.index["a"], tok.index["dog's"], tok.index["bed"], 3]  # no UNK
    z = embed_captions(tmp_path / "run", ["A Dog\u2019s bed\n", "a dog's bed", "TWO cats"])
    assert z.shape == (3, 32) and z.dtype == np.float32
    # one batch: the same tokens in two rows, equal up to BLAS blocking (float32 rounding)
    np.testing.assert_allclose(z[0], z[1], rtol=0, atol=1e-5)
    assert np.abs(z[0] - z[2]).max() > 0.01
    # alone, each is one identical forward pass: equal bit for bit
    assert np.array_equal(embed_captions(tmp_path / "run", ["A Dog\u2019s bed\n"]),
                          embed_captions(tmp_path / "run", ["a dog's bed"]))
    with pytest.raises(TypeError, match="one str"):
        embed_captions(tmp_path / "run", "a dog's bed")


def test_prepare_split_error_names_the_file(tmp_path):
    from minialign.machinery.run.monitor import prepare
    path = tmp_path / "eleven.json"
    path.write_text(json.dumps({"annotations": [
        {"id": 2 * p + k, "image_id": p, "caption": f"photo {p} caption {k}"}
        for p in range(11) for k in range(2)]}))
    cfg = TrainConfig(captions=str(path), steps=2, batch_photos=2, warmup_steps=1, model=SMALL)
    with pytest.raises(ValueError) as err:
        prepare(cfg)
    message = str(err.value)
    assert message.startswith(f"{path}: 11 photos cannot give train/val/test = 7/2/2")
    assert "\n" not in message
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="^" + str(path).replace(".", r"\.") + ": 11 photos"):
        train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()               # failed before the run dir was made


# ------------------------------------------- run directories written before TrainConfig.loss (#10)

def flatten_saved_config(run):
    """Rewrite run/config.json the way minialign wrote it before #10: the objectives' settings
    (mask_rate, the VICReg weights, anticollapse_weight) at the top of "config"."""
    saved = json.loads((run / "config.json").read_text())
    from minialign.machinery.run.rundir import FLAT_LOSS_KEYS
    saved["config"] = {**{k: v for k, v in saved["config"].items() if k != "loss"},
                       **{k: saved["config"]["loss"][k] for k in FLAT_LOSS_KEYS}}
    (run / "config.json").write_text(json.dumps(saved))
    return saved["config"]


@NEEDS_FAST_PATH                      # an old run's config: the fast set, the default then
def test_upgrade_config_moves_the_flat_keys_into_loss():
    from minialign.machinery.run.rundir import upgrade_config
    now = json.loads(json.dumps(dataclasses.asdict(TrainConfig(loss={"mask_rate": 0.5}))))
    from minialign.machinery.run.rundir import FLAT_LOSS_KEYS
    flat = {**{k: v for k, v in now.items() if k != "loss"},
            **{k: now["loss"][k] for k in FLAT_LOSS_KEYS}}
    assert "loss" not in flat and flat["mask_rate"] == 0.5
    assert upgrade_config(flat) == now
    assert upgrade_config(now) == now                      # today's layout: unchanged
    assert TrainConfig(**upgrade_config(flat)) == TrainConfig(loss={"mask_rate": 0.5})
    before_layers = {**now, "model": {k: v for k, v in now["model"].items() if k != "layers"}}
    assert upgrade_config(before_layers) == now            # runs before #20 ran the fast set


def test_a_run_with_a_flat_config_still_resumes_and_loads(world, tmp_path):
    from minialign.machinery.experiment.protocol import Protocol
    from minialign.machinery.run.checkpoint import config_differences
    from minialign.machinery.run.rundir import read_run_config
    cfg = TrainConfig(objective="bad_views", captions=str(world), steps=4, batch_photos=16,
                      warmup_steps=1, eval_every=2, model=SMALL, loss={"mask_rate": 0.3})
    train(cfg, tmp_path / "whole", progress=False)
    assert train(cfg, tmp_path / "old", progress=False, stop_after=3) is None
    flat = flatten_saved_config(tmp_path / "old")
    assert flat["mask_rate"] == 0.3 and "loss" not in flat
    assert read_run_config(tmp_path / "old")["loss"]["mask_rate"] == 0.3
    assert config_differences(flat, cfg) == []
    train(cfg, tmp_path / "old", progress=False, resume=True)      # from the step-2 checkpoint
    for name in ("model.npz", "captions/test_step00004.npz"):
        a, b = np.load(tmp_path / "whole" / name), np.load(tmp_path / "old" / name)
        assert all(a[k].tobytes() == b[k].tobytes() for k in a.files), name
    flatten_saved_config(tmp_path / "whole")
    _, tok, loaded = load_model(tmp_path / "whole")
    assert loaded == dataclasses.replace(cfg, model=dataclasses.replace(
        SMALL, vocab_size=tok.vocab_size))
    assert train(cfg, tmp_path / "whole", progress=False, resume=True)["final"]["step"] == 4
    # a replicate protocol.json saved before #10 holds the same flat "base"
    assert Protocol(base=flat).base.loss.mask_rate == 0.3


def test_train_step_is_objective_clip_adamw_and_skips_a_diverged_step(world):
    from minialign.data import sample_batch
    from minialign.model import init_params
    from minialign.objectives import OBJECTIVES
    from minialign.optim import adam_init, adam_step, clip_grad_norm
    from minialign.machinery.run.monitor import prepare
    from minialign.train import train_step
    cfg = TrainConfig(objective="bad_views", captions=str(world), batch_photos=16, model=SMALL)
    data = prepare(cfg)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        SMALL, vocab_size=data["tokenizer"].vocab_size))
    batch = sample_batch(data["tables"]["train"], 16, np.random.default_rng(0))
    params = init_params(cfg.model, np.random.default_rng(0))
    by_hand = {k: v.copy() for k, v in params.items()}
    state, state_by_hand = adam_init(params), adam_init(by_hand)
    loss, stats, grad_norm = train_step(params, state, batch, cfg, 1e-3, np.random.default_rng(1))
    loss2, grads, stats2 = OBJECTIVES["bad_views"](by_hand, batch, cfg, np.random.default_rng(1))
    assert (loss, stats, grad_norm) == (loss2, stats2, clip_grad_norm(grads, cfg.grad_clip))
    adam_step(by_hand, grads, state_by_hand, 1e-3, cfg.weight_decay)
    assert all(params[k].tobytes() == by_hand[k].tobytes() for k in params)
    assert state["t"] == 1
    params["ln_f.gamma"][0] = np.nan                       # the next loss is not finite
    before = {k: v.copy() for k, v in params.items()}
    loss, _, grad_norm = train_step(params, state, batch, cfg, 1e-3, np.random.default_rng(1))
    assert not (np.isfinite(loss) and np.isfinite(grad_norm))
    assert all(params[k].tobytes() == before[k].tobytes() for k in params) and state["t"] == 1
    assert all(state[m][k].tobytes() == state_by_hand[m][k].tobytes() for m in "mv" for k in params)


def test_upgrade_config_fills_the_loss_fields_added_since_with_today_defaults():
    """rundir cannot import objectives (it sits below): its copy of the defaults must agree."""
    from minialign.machinery.run.rundir import ADDED_LOSS_DEFAULTS
    from minialign.objectives import ObjectiveConfig
    defaults = dataclasses.asdict(ObjectiveConfig())
    assert {k: defaults[k] for k in ADDED_LOSS_DEFAULTS} == ADDED_LOSS_DEFAULTS


def test_plain_progress_prints_a_line_a_minute_when_steps_are_slow(monkeypatch, capsys):
    """Without a terminal, a line every PLAIN_LOG_EVERY steps, at the first step, and at least
    once every PLAIN_LOG_SECONDS: slow steps (61 s each, a fake clock) print every step; fast
    ones (1 s) only at the first and the 50th."""
    from minialign.machinery.run import monitor
    cfg = TrainConfig(objective="good_views", steps=100)
    for seconds, expected in ((61.0, [1, 2, 3, 4]), (1.0, [1, 50])):
        clock = iter(np.arange(0.0, 1000 * seconds, seconds))
        monkeypatch.setattr(monitor.time, "perf_counter", lambda: float(next(clock)))
        with monitor.Progress(cfg, 0, show=False) as progress:
            for step in range(expected[-1]):
                progress.step(step, 1.0, 1e-3)
        lines = capsys.readouterr().out.splitlines()
        assert [int(line.split()[2].split("/")[0]) for line in lines] == expected
