"""AdamW, global-norm clipping and the learning-rate schedule (minialign/optim.py) against
steps worked out by hand: decay on weight matrices only, bias corrections, dtype kept."""
import math

import numpy as np
import pytest
from test_exercises import adamw_by_hand

from minialign.optim import adam_init, adam_step, clip_grad_norm, lr_at

NAMES = ("blocks.0.attn.w_o", "blocks.1.mlp.b_in", "ln_f.gamma", "tok_emb", "projector.w_in")
DECAYS = {"blocks.0.attn.w_o": True, "blocks.1.mlp.b_in": False, "ln_f.gamma": False,
          "tok_emb": False, "projector.w_in": True}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adamw_three_steps_by_hand(dtype):
    rng = np.random.default_rng(0)
    start = {k: rng.standard_normal(3) * 2 for k in NAMES}
    steps = [{k: rng.standard_normal(3) * s for k in NAMES} for s in (1.0, 3.0, 0.1)]
    steps[1]["ln_f.gamma"][0] = 0.0                                # a zero gradient mid-way
    params = {k: v.astype(dtype) for k, v in start.items()}
    state = adam_init(params)
    for g in steps:
        grads = {k: v.astype(dtype) for k, v in g.items()}
        saved = {k: v.copy() for k, v in grads.items()}
        adam_step(params, grads, state, lr=0.05, weight_decay=0.5)
        assert all(np.array_equal(grads[k], saved[k]) for k in grads)   # gradients untouched
    assert state["t"] == 3
    for k in NAMES:
        assert params[k].dtype == state["m"][k].dtype == state["v"][k].dtype == dtype
        expected = adamw_by_hand(start[k], [g[k] for g in steps], DECAYS[k], 0.05, 0.5, 0.9,
                                 0.999, 1e-8)                 # adam_step's defaults: the paper's
        np.testing.assert_allclose(params[k], expected, rtol=1e-12 if dtype == np.float64
                                   else 1e-5, err_msg=k)


def test_clip_grad_norm_is_global():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]], np.float32)}
    assert clip_grad_norm(grads, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(grads["a"], [0.6, 0.0], rtol=1e-6)   # both by 1 / 5, not each
    np.testing.assert_allclose(grads["b"], [[0.8]], rtol=1e-6)      # to norm 1 on its own
    assert grads["b"].dtype == np.float32
    for limit in (100.0, None, 0):                                   # under it, or measure only
        grads = {"a": np.array([0.3, 0.4]), "b": np.array([12.0])}
        assert clip_grad_norm(grads, limit) == pytest.approx(math.sqrt(0.25 + 144))
        np.testing.assert_array_equal(grads["b"], [12.0])


def test_warmup_then_cosine():
    assert [lr_at(s, 2.0, 4, 104) for s in range(4)] == [0.5, 1.0, 1.5, 2.0]   # (s + 1) / 4
    assert lr_at(4, 2.0, 4, 104) == 2.0                              # the peak, then down
    assert lr_at(54, 2.0, 4, 104) == pytest.approx(1.0, rel=1e-14)   # half way: half
    assert lr_at(29, 2.0, 4, 104) == pytest.approx(1 + math.cos(math.pi / 4), rel=1e-14)
    assert lr_at(104, 2.0, 4, 104) == pytest.approx(0.0, abs=1e-15)
    assert lr_at(104, 2.0, 4, 104, min_lr_ratio=0.1) == pytest.approx(0.2, rel=1e-14)
    assert lr_at(54, 2.0, 4, 104, min_lr_ratio=0.1) == pytest.approx(0.2 + 0.9, rel=1e-14)
    assert lr_at(500, 2.0, 4, 104, min_lr_ratio=0.1) == pytest.approx(0.2, rel=1e-14)
    assert lr_at(0, 2.0, 0, 10) == 2.0                               # no warm-up
