"""The whole model under each objective: every gradient against central differences (float64),
plus the pair construction of bad views and the causal next-token head."""
from dataclasses import dataclass

import numpy as np
import pytest
from gradcheck import numerical_grad, rel_err

from minialign.data import Batch
from minialign.model import ModelConfig, encode, init_params, param_count
from minialign.losses import sigreg, sigreg_directions
from minialign.objectives import (ANTICOLLAPSE, OBJECTIVES, ObjectiveConfig, mask_words,
                                  next_token_targets)
from minialign.tokenizer import BOS, EOS, MASK, PAD

TINY = ModelConfig(vocab_size=20, max_len=8, d_model=8, n_layers=2, n_heads=2, mlp_ratio=4)


@dataclass(frozen=True)
class Config:
    """What an objective reads of train.TrainConfig: the model's shape and its own settings."""
    model: ModelConfig = TINY
    loss: ObjectiveConfig = ObjectiveConfig()


def tiny_batch():
    """4 photos, two captions each, T = 7 with padding (lengths 7, 5, 3, 4 / 6, 7, 4, 3)."""
    def caption(n_words, start):
        return [BOS] + [5 + (start + 3 * j) % 15 for j in range(n_words)] + [EOS]
    a = [caption(n, s) for n, s in [(5, 0), (3, 1), (1, 2), (2, 3)]]
    b = [caption(n, s) for n, s in [(4, 4), (5, 5), (2, 6), (1, 7)]]
    pad = lambda seqs: np.array([s + [PAD] * (7 - len(s)) for s in seqs], dtype=np.int32)
    return Batch(photos=np.arange(4), tokens_a=pad(a), tokens_b=pad(b))


def tiny_params(rng):
    """float64 weights, with gains, shifts and biases moved off 1 / 0 so none is trivially exact."""
    params = init_params(TINY, rng, dtype=np.float64)
    for k in params:
        params[k] += 0.1 * rng.standard_normal(params[k].shape) + (0.2 if "w_" in k else 0.0) * \
            rng.standard_normal(params[k].shape)
    return params


@pytest.mark.parametrize("name, anticollapse", [(n, a) for a in ANTICOLLAPSE
                                                for n in sorted(OBJECTIVES)])
def test_objective_gradients_end_to_end(name, anticollapse):
    cfg = Config(loss=ObjectiveConfig(anticollapse=anticollapse, sigreg_directions=6))
    params, batch = tiny_params(np.random.default_rng(0)), tiny_batch()
    objective = OBJECTIVES[name]
    # bad views draws its masks, SIGReg its directions, from rng: the same seed on every call
    # gives the same pair and the same directions
    loss = lambda: objective(params, batch, cfg, np.random.default_rng(1))[0]
    _, grads, stats = objective(params, batch, cfg, np.random.default_rng(1))
    assert sorted(grads) == sorted(params)
    for k in sorted(params):
        assert grads[k].shape == params[k].shape, k
        numeric = numerical_grad(loss, params[k])
        if np.abs(numeric).max() < 1e-8:
            # VICReg is blind to shifting every z by one vector, so under the view objectives
            # ln_f.beta has a true gradient of 0: check that it is 0, not a ratio of noises
            assert np.abs(grads[k]).max() < 1e-10, f"{name}: d{k} should be 0"
            continue
        err = rel_err(grads[k], numeric)
        assert err < 1e-6, f"{name}: d{k} relative error {err:.1e}"


def test_next_token_loss_is_ce_plus_weighted_var_cov():
    params, batch = tiny_params(np.random.default_rng(2)), tiny_batch()
    l1, _, s1 = OBJECTIVES["next_token"](params, batch, Config(), None)
    half = Config(loss=ObjectiveConfig(anticollapse_weight=0.5))
    l2, _, s2 = OBJECTIVES["next_token"](params, batch, half, None)
    assert l1 == pytest.approx(s1["ce"] + 25 * s1["var"] + s1["cov"], rel=1e-12)
    assert l2 == pytest.approx(s2["ce"] + 0.5 * (25 * s2["var"] + s2["cov"]), rel=1e-12)
    # targets: 7 + 5 + 3 + 4 + 6 + 7 + 4 + 3 tokens, each predicts its successor except EOS
    assert s1["targets"] == (7 + 5 + 3 + 4 + 6 + 7 + 4 + 3) - 8


def test_sigreg_replaces_var_cov_in_all_three_objectives():
    params, batch = tiny_params(np.random.default_rng(2)), tiny_batch()
    half = Config(loss=ObjectiveConfig(anticollapse="sigreg", sigreg_directions=6,
                                       anticollapse_weight=0.5, sigreg_weight=3.0))
    for name in ("good_views", "bad_views"):
        loss, _, stats = OBJECTIVES[name](params, batch, half, np.random.default_rng(1))
        assert set(stats) == {"loss", "inv", "sigreg"}
        assert loss == pytest.approx(25 * stats["inv"] + 3.0 * stats["sigreg"], rel=1e-12)
    loss, _, stats = OBJECTIVES["next_token"](params, batch, half, np.random.default_rng(1))
    assert stats["inv"] > 0                         # reported, but weighted 0 in the loss
    assert loss == pytest.approx(stats["ce"] + 0.5 * 3.0 * stats["sigreg"], rel=1e-12)
    # the SIGReg term is that of the two captions' embeddings on the rng's first (D, M) draw
    z, _, _ = encode(params, np.concatenate([batch.tokens_a, batch.tokens_b]), TINY, causal=True)
    A = sigreg_directions(TINY.d_model, 6, np.random.default_rng(1))
    assert stats["sigreg"] == pytest.approx((sigreg(z[:4], A)[0] + sigreg(z[4:], A)[0]) / 2,
                                            rel=1e-12)


@pytest.mark.parametrize("name", ("good_views", "bad_views", "next_token"))
def test_only_sigreg_draws_from_rng(name):
    """VICReg draws nothing more (VICReg runs stay bit-identical), SIGReg one (D, M) array.
    The three objectives of the replication only: an objective a student adds (docs/course.md's
    final project) need not take an anti-collapse term at all."""
    params, batch = tiny_params(np.random.default_rng(5)), tiny_batch()
    after = {}
    for anticollapse in ANTICOLLAPSE:
        rng = np.random.default_rng(9)
        OBJECTIVES[name](params, batch, Config(loss=ObjectiveConfig(
            anticollapse=anticollapse, sigreg_directions=6)), rng)
        after[anticollapse] = rng.random()
    masks = np.random.default_rng(9)
    if name == "bad_views":                                              # its two mask draws
        masks.random(batch.tokens_a.shape), masks.random(batch.tokens_a.shape)
    assert after["vicreg"] == masks.random()
    masks = np.random.default_rng(9)
    if name == "bad_views":
        masks.random(batch.tokens_a.shape), masks.random(batch.tokens_a.shape)
    masks.standard_normal((TINY.d_model, 6))
    assert after["sigreg"] == masks.random()


def test_next_token_targets_are_the_following_real_token():
    tokens = np.array([[BOS, 7, 8, EOS], [BOS, EOS, PAD, PAD]], np.int32)   # packed: 6 rows
    targets, has_target = next_token_targets(tokens)
    assert targets.tolist() == [7, 8, EOS, PAD, EOS, PAD]
    assert has_target.tolist() == [True, True, True, False, True, False]


def test_objective_config_refuses_out_of_range_settings():
    for fields, message in [({"mask_rate": 1.0}, "mask_rate=1.0 must be a number in [0, 1)"),
                            ({"sim_weight": -1.0}, "sim_weight=-1.0 must be a number >= 0"),
                            ({"cov_weight": float("nan")}, "cov_weight=nan must be a number"),
                            ({"var_weight": True}, "var_weight=True must be a number >= 0"),
                            ({"anticollapse": "barlow"},
                             "anticollapse='barlow' must be one of vicreg, sigreg"),
                            ({"sigreg_weight": -0.5}, "sigreg_weight=-0.5 must be a number >= 0"),
                            ({"sigreg_directions": 0},
                             "sigreg_directions=0 must be an integer >= 1"),
                            ({"sigreg_directions": 2.0},
                             "sigreg_directions=2.0 must be an integer >= 1"),
                            ({"sigreg_points": 1}, "sigreg_points=1 must be an integer >= 2"),
                            ({"sigreg_t_max": 0.0}, "sigreg_t_max=0.0 must be a number > 0"),
                            ({"sigreg_t_max": float("inf")},
                             "sigreg_t_max=inf must be a number > 0")]:
        with pytest.raises(ValueError) as info:
            ObjectiveConfig(**fields)
        assert str(info.value).startswith("ObjectiveConfig: " + message)
    assert ObjectiveConfig(mask_rate=0.0, anticollapse_weight=0).mask_rate == 0.0
    edge = ObjectiveConfig(sigreg_directions=1, sigreg_points=2, sigreg_t_max=1e-3,
                           sigreg_weight=0.0, anticollapse="sigreg")
    assert (edge.sigreg_directions, edge.sigreg_points) == (1, 2)


def test_causal_encoding_ignores_later_tokens():
    params = tiny_params(np.random.default_rng(3))
    tokens = tiny_batch().tokens_a
    changed = tokens.copy()
    changed[0, 4] = 19                                    # a later word of caption 0
    _, h, _ = encode(params, tokens, TINY, causal=True)   # packed: rows 0-6 are caption 0
    _, h2, _ = encode(params, changed, TINY, causal=True)
    np.testing.assert_allclose(h2[:4], h[:4], rtol=1e-12)
    assert not np.allclose(h2[4:7], h[4:7])
    np.testing.assert_allclose(h2[7:], h[7:], rtol=1e-12)  # other captions never see it
    _, h3, _ = encode(params, changed, TINY, causal=False)
    assert not np.allclose(h3[:4], encode(params, tokens, TINY, causal=False)[1][:4])


def test_padding_does_not_change_the_embedding():
    params = tiny_params(np.random.default_rng(4))
    tokens = tiny_batch().tokens_a
    wider = np.concatenate([tokens, np.zeros((4, 1), np.int32)], axis=1)   # one more PAD column
    for causal in (False, True):
        z, _, _ = encode(params, tokens, TINY, causal)
        z2, _, _ = encode(params, wider, TINY, causal)
        np.testing.assert_allclose(z2, z, rtol=1e-12)


def test_mask_words():
    tokens = np.array([[BOS, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, EOS, PAD, PAD]] * 200, np.int32)
    masked = mask_words(tokens, 0.25, np.random.default_rng(0))
    assert tokens[0, 1] == 5                              # the input is untouched
    specials = np.isin(tokens, [BOS, EOS, PAD])
    np.testing.assert_array_equal(masked[specials], tokens[specials])
    changed = masked != tokens
    assert (masked[changed] == MASK).all()
    assert abs(changed.sum() / (200 * 10) - 0.25) < 0.03   # 2000 draws: 3 standard deviations
    again = mask_words(tokens, 0.25, np.random.default_rng(0))
    np.testing.assert_array_equal(again, masked)
    # a one-word caption at a rate near 1 keeps its word; at rate 0 nothing changes
    one = np.array([[BOS, 9, EOS, PAD]] * 50, np.int32)
    np.testing.assert_array_equal(mask_words(one, 0.999, np.random.default_rng(1)), one)
    np.testing.assert_array_equal(mask_words(tokens, 0.0, np.random.default_rng(1)), tokens)
    # two words at rate ~1: exactly one of them survives in every row
    two = np.array([[BOS, 9, 10, EOS]] * 50, np.int32)
    assert ((mask_words(two, 0.999, np.random.default_rng(2))[:, 1:3] == MASK).sum(1) == 1).all()


def test_default_model_size():
    """The default encoder: 4 blocks of width 256 are 3.16M parameters; the rest is V x D."""
    cfg = ModelConfig(vocab_size=5814)
    params = init_params(cfg, np.random.default_rng(0))
    body = 4 * (256 * 768 + 768 + 256 * 256 + 256 + 256 * 1024 + 1024 + 1024 * 256 + 256 + 4 * 256)
    assert param_count(params) == 5814 * 256 + 64 * 256 + body + 2 * 256
    assert params["tok_emb"].dtype == np.float32


@pytest.mark.parametrize("anticollapse, key", [("vicreg", "vicreg"), ("sigreg", "sigreg_loss")])
def test_next_token_names_its_anticollapse_term_after_the_regulariser(anticollapse, key):
    """next_token's stats carry its weighted anti-collapse term under the regulariser's name
    (never "vicreg" under SIGReg): total loss = that term + cross-entropy."""
    cfg = Config(loss=ObjectiveConfig(anticollapse=anticollapse, sigreg_directions=6,
                                      anticollapse_weight=0.5))
    params, batch = tiny_params(np.random.default_rng(3)), tiny_batch()
    loss, _, stats = OBJECTIVES["next_token"](params, batch, cfg, np.random.default_rng(1))
    other = {"vicreg", "sigreg_loss"} - {key}
    assert key in stats and not other & set(stats)
    assert stats[key] + stats["ce"] == pytest.approx(loss, rel=1e-14)
    if anticollapse == "vicreg":          # 0.5 x (var_weight x var + cov_weight x cov)
        assert stats[key] == pytest.approx(0.5 * (25.0 * stats["var"] + stats["cov"]), rel=1e-12)
    else:                                 # 0.5 x sigreg_weight x the statistic
        assert stats[key] == pytest.approx(0.5 * cfg.loss.sigreg_weight * stats["sigreg"],
                                           rel=1e-12)
