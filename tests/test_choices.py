"""The choices the replication's write-up leaves unsaid (#29, docs/protocol.md), each a flag
whose default is the behaviour before it existed: VICReg's projector (--projector-dim), the
causal encoder's pooling (--causal-pool), bad_views' masking (--mask-mode) and the parameters
the loss cannot see (--unseen-params). Every gradient with each option on against central
differences (float64, a 1-block D=8 model), the fast set against the reference with each, the
hand-made cases of dropping words and last-token pooling, and the flags reaching a run's
config.json and checkpoint."""
import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import NEEDS_FAST_PATH
from gradcheck import numerical_grad, rel_err

from minialign.__main__ import main
from minialign.machinery.experiment.results_md import choices_line
from minialign.data import Batch
from minialign.machinery.images.synthetic import CAPTIONS_NAME, write_world
from minialign.model import PROJECTOR_PARAMS, ModelConfig, encode, init_params, project
from minialign.objectives import (OBJECTIVES, ObjectiveConfig, drop_words, mask_words,
                                  unseen_params)
from minialign.optim import adam_init
from minialign.tokenizer import BOS, EOS, MASK, PAD
from minialign.train import TrainConfig, train_step

ONE_BLOCK = ModelConfig(vocab_size=20, max_len=8, d_model=8, n_layers=1, n_heads=2, mlp_ratio=2)
PROJECTED = dataclasses.replace(ONE_BLOCK, projector_dim=6)
LAST = dataclasses.replace(ONE_BLOCK, causal_pool="last")
DROP = ObjectiveConfig(mask_mode="drop", mask_rate=0.4)
# (objective, model, loss): every objective with a projector, next_token pooling its last
# token, bad_views dropping its masked words
OPTIONS = [(name, PROJECTED, ObjectiveConfig()) for name in sorted(OBJECTIVES)] + [
    ("next_token", LAST, ObjectiveConfig()), ("bad_views", ONE_BLOCK, DROP),
    ("bad_views", PROJECTED, DROP), ("next_token", dataclasses.replace(LAST, projector_dim=6),
                                     ObjectiveConfig(anticollapse="sigreg", sigreg_directions=5))]


@dataclass(frozen=True)
class Config:
    """What an objective (and objectives.unseen_params) reads of train.TrainConfig."""
    objective: str = "good_views"
    model: ModelConfig = ONE_BLOCK
    loss: ObjectiveConfig = ObjectiveConfig()


def batch_of(rows_a, rows_b, T=7):
    """A Batch of captions given as word lists (ids >= 5), each wrapped in BOS .. EOS."""
    pad = lambda rows: np.array([[BOS, *r, EOS] + [PAD] * (T - 2 - len(r)) for r in rows],
                                dtype=np.int32)
    return Batch(photos=np.arange(len(rows_a)), tokens_a=pad(rows_a), tokens_b=pad(rows_b))


def tiny_batch():
    return batch_of([[5, 6, 7, 8, 9], [10, 11, 12], [13], [14, 15]],
                    [[16, 17, 18, 19], [5, 8, 11, 14, 17], [6, 9], [12]])


def off_init(model, seed=0):
    """float64 weights with gains, shifts and biases moved off 1 / 0."""
    rng = np.random.default_rng(seed)
    params = init_params(model, rng, dtype=np.float64)
    return {k: p + 0.1 * rng.standard_normal(p.shape) + (0.2 if "w_" in k else 0.0) *
            rng.standard_normal(p.shape) for k, p in params.items()}


@pytest.mark.parametrize("objective, model, loss", OPTIONS)
def test_gradients_with_each_option_on(objective, model, loss):
    cfg = Config(objective, model, loss)
    params, batch = off_init(model), tiny_batch()
    f = lambda: OBJECTIVES[objective](params, batch, cfg, np.random.default_rng(1))[0]
    _, grads, _ = OBJECTIVES[objective](params, batch, cfg, np.random.default_rng(1))
    P = 6 if model.projector_dim else 0                               # the encoder's, then its
    assert sorted(list(grads)[len(grads) - P:]) == sorted(PROJECTOR_PARAMS[:P])
    assert sorted(grads) == sorted(params)
    for k in sorted(params):
        numeric = numerical_grad(f, params[k])
        if k in unseen_params(cfg):
            assert np.abs(numeric).max() < 1e-8 and np.abs(grads[k]).max() < 1e-10, k
            continue
        assert rel_err(grads[k], numeric) < 1e-6, f"{objective} {model} {loss}: d{k}"


def test_the_projector_is_the_loss_input_and_z_is_the_encoders():
    params = off_init(PROJECTED)
    assert [k for k in params if k.startswith("projector.")] == list(PROJECTOR_PARAMS)
    assert not any(k.startswith("projector.") for k in init_params(ONE_BLOCK,
                                                                   np.random.default_rng(0)))
    # the encoder's weights are those of a run without a projector: drawn first
    plain = init_params(ONE_BLOCK, np.random.default_rng(3))
    projected = init_params(PROJECTED, np.random.default_rng(3))
    assert all(np.array_equal(plain[k], projected[k]) for k in plain)
    tokens = np.concatenate([tiny_batch().tokens_a, tiny_batch().tokens_b])
    z = encode(params, tokens, PROJECTED)[0]                              # (8, D) the metrics'
    y = project(params, z, PROJECTED)[0]
    u = z @ params["projector.w_in"] + params["projector.b_in"]
    u = (u - u.mean(1, keepdims=True)) / np.sqrt(u.var(1, keepdims=True) + 1e-5)
    u = u * params["projector.ln.gamma"] + params["projector.ln.beta"]
    u = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
    assert z.shape == (8, 8) and y.shape == (8, 6)
    assert np.allclose(y, u @ params["projector.w_out"] + params["projector.b_out"], atol=1e-12)


class Draws:
    """A stand-in numpy Generator whose random() returns fixed draws (hand-made masks)."""

    def __init__(self, u):
        self.u = np.array(u, dtype=float)

    def random(self, shape):
        assert shape == self.u.shape
        return self.u


def test_drop_words_removes_what_mask_words_masks_and_closes_up():
    tokens = np.array([[BOS, 5, 6, 7, 8, EOS, PAD],
                       [BOS, 9, 10, EOS, PAD, PAD, PAD],
                       [BOS, 11, EOS, PAD, PAD, PAD, PAD]], dtype=np.int32)
    u = [[0.9, 0.1, 0.8, 0.2, 0.7, 0.0, 0.0],      # words 5 and 7 drawn below 0.25
         [0.9, 0.1, 0.2, 0.9, 0.9, 0.9, 0.9],      # both words drawn: the larger (10) stays
         [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]]      # nothing drawn
    assert mask_words(tokens, 0.25, Draws(u)).tolist() == [
        [BOS, MASK, 6, MASK, 8, EOS, PAD], [BOS, MASK, 10, EOS, PAD, PAD, PAD],
        [BOS, 11, EOS, PAD, PAD, PAD, PAD]]
    dropped = drop_words(tokens, 0.25, Draws(u))
    assert dropped.dtype == tokens.dtype and tokens[0, 1] == 5            # input untouched
    assert dropped.tolist() == [[BOS, 6, 8, EOS, PAD, PAD, PAD],
                                [BOS, 10, EOS, PAD, PAD, PAD, PAD],
                                [BOS, 11, EOS, PAD, PAD, PAD, PAD]]


def test_bad_views_drop_encodes_the_closed_up_captions():
    """bad_views with mask_mode "drop" is bad_views on the captions drop_words returns: the
    same loss as good_views fed those two token arrays as its pair."""
    params, batch = off_init(ONE_BLOCK), tiny_batch()
    cfg = Config("bad_views", ONE_BLOCK, DROP)
    loss = OBJECTIVES["bad_views"](params, batch, cfg, np.random.default_rng(4))[0]
    rng = np.random.default_rng(4)
    a, b = drop_words(batch.tokens_a, 0.4, rng), drop_words(batch.tokens_a, 0.4, rng)
    assert not np.isin(a, [MASK]).any() and (a != batch.tokens_a).any()
    pair = Batch(photos=batch.photos, tokens_a=a, tokens_b=b)
    assert loss == OBJECTIVES["good_views"](params, pair, cfg, None)[0]


def test_last_pool_is_the_last_real_tokens_state():
    params = off_init(LAST)
    tokens = tiny_batch().tokens_a                                        # lengths 7, 5, 3, 4
    z, hf, _ = encode(params, tokens, LAST, causal=True)                  # hf: batch order
    assert np.array_equal(z, hf[[6, 7 + 4, 12 + 2, 15 + 3]])
    z_mean = encode(params, tokens, ONE_BLOCK, causal=True)[0]
    assert np.allclose(z_mean[2], hf[12:15].mean(0), atol=1e-12)
    # bidirectional attention pools by the mean whatever causal_pool says
    assert np.array_equal(encode(params, tokens, LAST)[0], encode(params, tokens, ONE_BLOCK)[0])


def test_unseen_params_are_the_shift_of_vicregs_input():
    """What unseen_params names; test_gradients_with_each_option_on checks that their
    gradients are 0 by central differences, and every other's is not (rel_err there)."""
    assert unseen_params(Config("good_views")) == ("ln_f.beta",)
    assert unseen_params(Config("bad_views")) == ("ln_f.beta",)
    assert unseen_params(Config("next_token")) == ()                  # CE reads ln_f.beta
    for name in sorted(OBJECTIVES):
        assert unseen_params(Config(name, PROJECTED)) == ("projector.b_out",)
        assert unseen_params(Config(name, loss=ObjectiveConfig(anticollapse="sigreg"))) == ()


@pytest.mark.parametrize("unseen", ["train", "freeze"])
def test_freeze_leaves_ln_f_beta_and_nothing_else_where_it_was(unseen):
    """Two float32 steps: frozen, ln_f.beta and its moments stay exactly 0 and every other
    weight moves as when trained (its gradient was noise, ~1e-9 of the norm, so the clipped
    step of the others agrees to float32 rounding)."""
    model = dataclasses.replace(ONE_BLOCK, vocab_size=20)
    moved = {}
    for mode in ("train", unseen):
        cfg = TrainConfig(objective="good_views", model=model,
                          loss=ObjectiveConfig(unseen_params=mode))
        params = init_params(model, np.random.default_rng(0))
        state = adam_init(params)
        for seed in (1, 2):
            train_step(params, state, tiny_batch(), cfg, 1e-3, np.random.default_rng(seed))
        moved[mode] = (params, state)
    params, state = moved[unseen]
    if unseen == "freeze":
        assert not params["ln_f.beta"].any() and not state["m"]["ln_f.beta"].any()
        assert not state["v"]["ln_f.beta"].any()
    else:                                            # noise, stepped by ~lr
        assert np.abs(params["ln_f.beta"]).max() > 1e-4
    for k in params:
        if k != "ln_f.beta":
            assert np.allclose(params[k], moved["train"][0][k], rtol=0, atol=1e-6), k


# ---------------------------------------------------------------- the fast set agrees
FAST16 = ModelConfig(vocab_size=30, max_len=9, d_model=16, n_layers=1, n_heads=2, mlp_ratio=2)


def ragged(rng, B=40):
    """B photos, two captions each of 3..9 tokens (BOS .. EOS, PAD after)."""
    def captions():
        tokens = rng.integers(5, FAST16.vocab_size, size=(B, FAST16.max_len)).astype(np.int32)
        lengths = rng.integers(3, FAST16.max_len + 1, size=B)
        tokens[:, 0] = BOS
        tokens[np.arange(B), lengths - 1] = EOS
        tokens[np.arange(FAST16.max_len)[None, :] >= lengths[:, None]] = PAD
        return tokens
    return Batch(photos=np.arange(B), tokens_a=captions(), tokens_b=captions())


@NEEDS_FAST_PATH
@pytest.mark.parametrize("dtype, tolerance", [(np.float64, 1e-10), (np.float32, 1e-4)])
@pytest.mark.parametrize("objective, changes", [
    ("good_views", {"projector_dim": 24}), ("next_token", {"projector_dim": 24}),
    ("next_token", {"causal_pool": "last"}), ("bad_views", {"mask_mode": "drop"})])
def test_fast_agrees_with_reference_with_each_option(objective, changes, dtype, tolerance):
    model = dataclasses.replace(FAST16, **{k: v for k, v in changes.items() if k != "mask_mode"})
    loss_cfg = ObjectiveConfig(**{k: v for k, v in changes.items() if k == "mask_mode"})
    rng = np.random.default_rng(0)
    params = {k: (p + 0.1 * rng.standard_normal(p.shape)).astype(dtype)
              for k, p in init_params(model, rng, dtype=dtype).items()}
    out = {}
    for layers in ("fast", "reference"):
        cfg = Config(objective, dataclasses.replace(model, layers=layers), loss_cfg)
        out[layers] = OBJECTIVES[objective](params, ragged(np.random.default_rng(1)), cfg,
                                            np.random.default_rng(2))[:2]
    (loss_f, grads_f), (loss_r, grads_r) = out["fast"], out["reference"]
    assert abs(loss_f - loss_r) <= tolerance * abs(loss_r)
    assert list(grads_f) == list(grads_r)
    largest = max(np.abs(g).max() for g in grads_r.values())
    for k in grads_r:                        # a zero-but-rounding gradient: over the largest
        scale = largest if k in unseen_params(cfg) else np.abs(grads_r[k]).max()
        assert np.abs(grads_f[k] - grads_r[k]).max() / scale < tolerance, k


# ---------------------------------------------------------------- the flags reach a run
def test_the_flags_reach_config_and_checkpoint(tmp_path):
    write_world(tmp_path, n_scenes=60, seed=0)
    out = tmp_path / "run"
    assert main(["train", "--objective", "bad_views", "--captions", str(tmp_path / CAPTIONS_NAME),
                 "--out", str(out), "--steps", "2", "--batch-photos", "8", "--warmup-steps", "1",
                 "--eval-every", "2", "--d-model", "8", "--n-layers", "1", "--n-heads", "2",
                 "--projector-dim", "12", "--causal-pool", "last", "--mask-mode", "drop",
                 "--unseen-params", "freeze"]) in (0, None)
    saved = json.loads((out / "config.json").read_text())["config"]
    assert (saved["model"]["projector_dim"], saved["model"]["causal_pool"]) == (12, "last")
    assert (saved["loss"]["mask_mode"], saved["loss"]["unseen_params"]) == ("drop", "freeze")
    with np.load(out / "checkpoint.npz") as ckpt:
        assert ckpt["params/projector.w_out"].shape == (12, 12)
        assert "adam_m/projector.ln.gamma" in ckpt.files
    with pytest.raises(SystemExit) as refused:
        main(["train", "--objective", "bad_views", "--captions", "x", "--out", "y",
              "--mask-mode", "hide"])
    assert refused.value.code == 2


def test_results_md_names_the_choices_a_run_made():
    base = json.loads(json.dumps(dataclasses.asdict(TrainConfig())))
    assert choices_line(base) == (
        "Choices the write-up leaves unsaid (docs/protocol.md): VICReg projector none; "
        "next_token's caption vector the mean of its tokens; bad_views' masked words replaced "
        "by MASK; parameters the loss cannot see (ln_f.beta under VICReg alone) trained.")
    base["model"].update(projector_dim=256, causal_pool="last")
    base["loss"].update(mask_mode="drop", unseen_params="freeze")
    assert choices_line(base) == (
        "Choices the write-up leaves unsaid (docs/protocol.md): VICReg projector 256 wide; "
        "next_token's caption vector the last token; bad_views' masked words dropped; "
        "parameters the loss cannot see (ln_f.beta under VICReg alone) frozen.")
