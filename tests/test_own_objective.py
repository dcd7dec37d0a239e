"""The course's final project, as a path that works (docs/course.md, "Your own objective"):
write a fourth objective, check its gradient, register it with two lines, and `replicate`
trains it, `report` tables and draws it beside the others.

The objective here is a small one of our own, not the project's suggestion (InfoNCE), so the
handout does not hold a solution: cosine views, two captions of a photo pulled together by
1 - cos(z_a, z_b) instead of VICReg's squared distance, with VICReg's variance and covariance
terms against collapse.
"""
import dataclasses

import numpy as np
import pytest
from gradcheck import numerical_grad, rel_err
from test_objectives import Config, tiny_batch, tiny_params

from minialign import objectives, train
from minialign.machinery import cli
from minialign.machinery.grid import replicate
from minialign.machinery.experiment import report
from minialign.machinery.images import synthetic
from minialign.machinery.experiment.protocol import Protocol
from minialign.model import ModelConfig, encode, encode_backward
from minialign.objectives import pair_loss

COSINE_WEIGHT = 25.0  # as VICReg's sim_weight: the pull has the invariance term's strength


def cosine_loss(z_a, z_b, weight=COSINE_WEIGHT):
    """weight * mean_i (1 - cos(z_a_i, z_b_i)). z_a, z_b: (N, D), no zero row.
    Returns loss (float) and (dz_a, dz_b), each (N, D)."""
    N = len(z_a)
    na = np.linalg.norm(z_a, axis=1, keepdims=True)                       # (N, 1)
    nb = np.linalg.norm(z_b, axis=1, keepdims=True)                       # (N, 1)
    u, v = z_a / na, z_b / nb                                             # (N, D) unit rows
    cos = (u * v).sum(axis=1, keepdims=True)                              # (N, 1)
    # d cos / d z_a = (v - cos u) / |z_a|: the part of v across u, scaled by 1 / |z_a|
    dz_a = -weight / N * (v - cos * u) / na                               # (N, D)
    dz_b = -weight / N * (u - cos * v) / nb                               # (N, D)
    return float(weight * (1.0 - cos).mean()), (dz_a, dz_b)


def cosine_views(params, batch, cfg, rng):
    """Two captions of one photo, pulled together by cosine (cosine_loss) -> plus VICReg's
    variance + covariance (pair_loss without its invariance)."""
    tokens = np.concatenate([batch.tokens_a, batch.tokens_b])            # (2B, T) caption a | b
    B = len(batch.tokens_a)
    z, hf, cache = encode(params, tokens, cfg.model, causal=False)        # (2B, D), (n, D)
    loss, (dz_a, dz_b), stats = pair_loss(z[:B], z[B:], cfg.loss, rng, sim_weight=0.0)  # <-
    cos, (dc_a, dc_b) = cosine_loss(z[:B], z[B:])                         # <- the pull
    grads = encode_backward(np.concatenate([dz_a + dc_a, dz_b + dc_b]), None, cache)  # <-
    stats.update(cosine=cos, loss=loss + cos)                             # <-
    return loss + cos, grads, stats                                       # <-


@pytest.fixture
def registered(monkeypatch):
    """The two registry lines of objectives.py, for this test only."""
    monkeypatch.setitem(objectives.OBJECTIVES, "cosine_views", cosine_views)
    monkeypatch.setitem(objectives.CAUSAL, "cosine_views", False)


def test_cosine_loss_gradient():
    rng = np.random.default_rng(0)
    z_a, z_b = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    _, (dz_a, dz_b) = cosine_loss(z_a, z_b)
    for name, analytic, wrt in [("z_a", dz_a, z_a), ("z_b", dz_b, z_b)]:
        err = rel_err(analytic, numerical_grad(lambda: cosine_loss(z_a, z_b)[0], wrt))
        assert err < 1e-7, f"d{name}: relative error {err:.1e}"


def test_cosine_views_gradients_end_to_end():
    """As tests/test_objectives.py checks every registered objective, on a 2-block D = 8 model."""
    cfg = Config()
    params, batch = tiny_params(np.random.default_rng(0)), tiny_batch()
    loss = lambda: cosine_views(params, batch, cfg, np.random.default_rng(1))[0]
    _, grads, _ = cosine_views(params, batch, cfg, np.random.default_rng(1))
    assert sorted(grads) == sorted(params)
    for k in sorted(params):
        numeric = numerical_grad(loss, params[k])
        if np.abs(numeric).max() < 1e-8:          # a true gradient of 0: check it is 0
            assert np.abs(grads[k]).max() < 1e-10, f"d{k} should be 0"
            continue
        err = rel_err(grads[k], numeric)
        assert err < 1e-6, f"d{k}: relative error {err:.1e}"


def test_a_registered_objective_runs_through_replicate_and_report(registered, tmp_path):
    captions, _ = synthetic.write_world(tmp_path / "world", n_scenes=300, seed=0)
    # the command line offers it as soon as it is registered
    args = cli.parser().parse_args(["replicate", "--captions", str(captions), "--out", "o",
                                    "--objectives", "good_views", "cosine_views"])
    assert args.objectives == ["good_views", "cosine_views"]
    base = train.TrainConfig(captions=str(captions), steps=6, batch_photos=16, eval_every=3,
                             warmup_steps=2, lr=1e-3,
                             model=ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=64))
    protocol = Protocol(base=base, objectives=("good_views", "cosine_views"), seeds=(0,),
                        lr_min=1e-3, lr_max=1e-2, lr_per_decade=0, max_extensions=0)
    replicate.replicate(protocol, tmp_path / "results", None, progress=False)
    results = report.build_report(tmp_path / "results")
    md = (tmp_path / "results" / "results.md").read_text()
    assert "| cosine_views |" in md and "| good_views |" in md
    para = results["objectives"]["cosine_views"]["paraphrase_R@1"]
    assert 0.0 <= para["mean"] <= 1.0
    for name in report.FIGURES:
        assert (tmp_path / "results" / name).stat().st_size > 0
