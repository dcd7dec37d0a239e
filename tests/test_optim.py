"""Global-norm clipping and the learning-rate schedule (minialign/optim.py) against values
worked out by hand. AdamW's steps (decay on weight matrices only, the paper's defaults, bias
corrections, dtype kept): tests/test_exercises.py, exercise 9."""
import math

import numpy as np
import pytest

from minialign.optim import clip_grad_norm, lr_at


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
