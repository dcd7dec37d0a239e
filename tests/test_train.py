"""Training (train.py, checkpoint.py): a run stopped (stop_after; kill -9 in tests/test_grid.py)
and resumed ends bit-identical to one never stopped, float32 and float64; refusals before
anything is written; one step; the vocabulary; the README's Python encoder API
(runs.load_model, embed_captions)."""
import dataclasses
import json

import numpy as np
import pytest
from conftest import write_captions

from minialign.checkpoint import Diverged
from minialign.data import load_captions, sample_batch
from minialign.metrics import paraphrase_r_at_1
from minialign.machinery import runs
from minialign.model import ModelConfig, init_params
from minialign.objectives import OBJECTIVES
from minialign.optim import adam_init, adam_step, clip_grad_norm, lr_at
from minialign.train import TrainConfig, prepare, train, train_step

TINY = ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=16)


def config(captions, **changes):
    return TrainConfig(**{**dict(objective="bad_views", captions=str(captions), steps=8,
                                 batch_photos=8, eval_every=3, warmup_steps=2, model=TINY),
                          **changes})


def files(run):
    """A run's files' bytes; of those with wall times: the log less "seconds", the evaluations,
    the checkpoint's arrays, step, Adam t and streams. A write kill -9 cut short leaves no
    temporary file behind once resumed."""
    timed = (".lock", "checkpoint.npz", "log.jsonl", "metrics.json")
    out = {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
           if p.is_file() and p.name not in timed}
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    out["log"] = [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
    metrics = runs.read_metrics(run)
    out["metrics"] = metrics["evals"], metrics.get("final")
    if (run / "checkpoint.npz").is_file():
        ckpt = runs.load_npz(run / "checkpoint.npz")
        meta = json.loads(str(ckpt.pop("meta")))
        out["checkpoint"] = ({k: v.tobytes() for k, v in ckpt.items()},
                             [meta[k] for k in ("step", "t", "rngs")])
    return out


@pytest.fixture(scope="module")
def whole(captions, tmp_path_factory):
    """Runs never stopped: bad_views float32 (data, mask streams), next_token float64 reference."""
    root = tmp_path_factory.mktemp("whole")
    f64 = dataclasses.replace(TINY, dtype="float64", layers="reference")
    cfgs = {"f32": config(captions), "f64": config(captions, objective="next_token", model=f64)}
    for name, cfg in cfgs.items():
        train(cfg, root / name, progress=False)
    return {name: (cfg, root / name) for name, cfg in cfgs.items()}


@pytest.mark.parametrize("kind, stops", [("f32", [5]), ("f32", [6]), ("f32", [2, 7]),
                                         ("f64", [4])])
def test_a_stopped_run_resumes_to_the_same_bits(whole, tmp_path, kind, stops):
    """Stopped between checkpoints, right on one, twice (once before the first checkpoint)."""
    cfg, reference = whole[kind]
    run = tmp_path / "run"
    for i, stop in enumerate(stops):
        assert train(cfg, run, resume=i > 0, progress=False, stop_after=stop) is None
        assert [r["step"] for r in files(run)["log"]] == list(range(1, stop + 1))
    train(cfg, run, resume=True, progress=False)
    assert files(run) == files(reference)
    evals, final = files(run)["metrics"]                       # the curve: evals, then final
    assert [e["step"] for e in evals] == [0, 3, 6, 8] and final["step"] == 8
    assert files(run)["checkpoint"][1][:2] == [8, 8]           # step, Adam's t: the last step
    assert [r["lr"] for r in files(run)["log"]] == [lr_at(s, 1e-3, 2, 8, 0.1) for s in range(8)]
    weights = runs.load_npz(run / "model.npz")
    assert weights["tok_emb"].dtype == np.dtype("float64" if kind == "f64" else "float32")
    with np.load(run / "checkpoint.npz") as ckpt:
        assert {ckpt[k].dtype for k in ckpt.files if k != "meta"} == {weights["tok_emb"].dtype}
    before = files(run)
    assert train(cfg, run, resume=True, progress=False) == runs.read_metrics(run)  # finished
    assert files(run) == before


def test_refusals_before_anything_is_written(whole, captions, tmp_path):
    cfg, reference = whole["f32"]
    train(cfg, tmp_path / "cut", progress=False, stop_after=4)
    before = files(tmp_path / "cut")
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'cut' / 'config.json'}: a run of "
                                         rf"another config \(config.lr: 0.001 -> 0.002\)"):
        train(dataclasses.replace(cfg, lr=2e-3), tmp_path / "cut", resume=True, progress=False)
    with pytest.raises(FileExistsError, match=rf"^{tmp_path / 'cut'}: not empty"):
        train(cfg, tmp_path / "cut", progress=False)
    other = write_captions(tmp_path / "other.json", seed=1)       # a second dataset, one --out
    for resume in (False, True):
        with pytest.raises(ValueError) as err:
            train(dataclasses.replace(cfg, captions=str(other)), tmp_path / "cut", resume=resume)
        assert str(err.value) == (f"{tmp_path / 'cut'}: holds a run of other captions ({captions};"
                                  f" now {other}, whose bytes differ); pick another --out or pass "
                                  f"--force")
    assert files(tmp_path / "cut") == before
    with pytest.raises(ValueError, match="another config"):          # finished, too
        train(dataclasses.replace(cfg, lr=2e-3), reference, resume=True, progress=False)
    before = files(reference)
    # a diverged run says when, and is not retried
    boom = dataclasses.replace(cfg, lr=1e6, grad_clip=0.0, steps=30)
    with pytest.raises(Diverged, match=rf"^{tmp_path / 'run'}: diverged at step"):
        train(boom, tmp_path / "run", progress=False)
    assert runs.read_json(tmp_path / "run" / "diverged.json")["step"] >= 1
    touched = lambda: {p: (p.read_bytes(), p.stat().st_mtime_ns)
                       for p in (tmp_path / "run").rglob("*") if p.is_file()}
    before_resume = touched()
    with pytest.raises(Diverged, match=rf"^{tmp_path / 'run'}: diverged"):
        train(boom, tmp_path / "run", resume=True, progress=False)
    assert touched() == before_resume and not (tmp_path / "run" / "model.npz").exists()
    train(cfg, tmp_path / "run", force=True, progress=False)   # --force starts it over
    assert files(tmp_path / "run") == before


def test_the_vocabulary_is_the_train_photos_words(tmp_path):
    rows = [{"id": 2 * p + k, "image_id": p, "caption": f"photo{p} caption {k}"}
            for p in range(20) for k in (0, 1)]                 # a word of its own per photo
    (tmp_path / "c.json").write_text(json.dumps({"annotations": rows}))
    data = prepare(TrainConfig(captions=str(tmp_path / "c.json"), batch_photos=2))
    assert set(data["tokenizer"].vocab[5:]) == {"caption", "0", "1"} | {
        f"photo{p}" for p in data["captions"].image_ids[data["split"]["train"]]}


def test_train_step_is_the_objective_clipping_and_adamw(captions):
    cfg = config(captions)
    data = prepare(cfg)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        TINY, vocab_size=data["tokenizer"].vocab_size))
    batch = sample_batch(data["tables"]["train"], 8, np.random.default_rng(0))
    params = init_params(cfg.model, np.random.default_rng(0))
    by_hand = {k: v.copy() for k, v in params.items()}
    state, state_by_hand = adam_init(params), adam_init(by_hand)
    loss, stats, norm = train_step(params, state, batch, cfg, 1e-3, np.random.default_rng(1))
    loss2, grads, stats2 = OBJECTIVES["bad_views"](by_hand, batch, cfg, np.random.default_rng(1))
    assert (loss, stats, norm) == (loss2, stats2, clip_grad_norm(grads, cfg.grad_clip))
    adam_step(by_hand, grads, state_by_hand, 1e-3, cfg.weight_decay)
    assert all(np.array_equal(params[k], by_hand[k]) for k in params) and state["t"] == 1
    params["ln_f.gamma"][0] = np.nan                         # the next loss is not finite:
    before = {k: v.copy() for k, v in params.items()}        # the step changes nothing
    loss, _, norm = train_step(params, state, batch, cfg, 1e-3, np.random.default_rng(1))
    assert not np.isfinite(loss) or not np.isfinite(norm)
    assert all(np.array_equal(params[k], before[k], equal_nan=True) for k in params)
    assert state["t"] == 1


def test_the_python_encoder_api(whole, captions):
    """A next_token run: embed_captions encodes with the causal attention it trained with."""
    cfg, run = whole["f64"]
    params, loaded, tok = runs.load_model(run)
    assert loaded.objective == "next_token" and loaded.model.vocab_size == tok.vocab_size
    assert params["tok_emb"].shape == (tok.vocab_size, 16)
    slots = runs.load_caption_slots(runs.caption_files(run, "test")[8])   # metrics read them
    assert runs.read_metrics(run)["final"]["test"]["paraphrase_R@1"] == \
        paraphrase_r_at_1(slots[0][1], slots[1][1])
    ids, z_saved = slots[0]
    texts = dict(zip(load_captions(captions).image_ids, load_captions(captions).captions))
    z = runs.embed_captions(run, [texts[i][0].upper() + "  " for i in ids])   # raw: cleaned
    assert z.dtype == np.float32 and z.shape == z_saved.shape
    np.testing.assert_allclose(z, z_saved, rtol=2e-3, atol=2e-3)         # saved as float16
    with pytest.raises(ValueError, match="list of strings"):
        runs.embed_captions(run, "a red dog")
