"""machinery/scaling.py: sweep sizes, parameter counts, and the gap's trend on hand-made data."""
import math

import numpy as np
import pytest

from minialign.machinery.scaling import count_params, gap_trend, size_config, trend_sentence
from minialign.model import init_params, param_count


@pytest.mark.parametrize("d_model, n_layers", [(64, 2), (128, 4), (96, 1)])
def test_count_params_equals_the_allocated_model(d_model, n_layers):
    cfg = size_config(d_model, n_layers, vocab_size=50, max_len=12)
    assert cfg.n_heads == max(1, d_model // 64) and cfg.mlp_ratio == 4
    assert count_params(cfg) == param_count(init_params(cfg, np.random.default_rng(0)))


def test_trend_slope_and_se_match_a_hand_computed_fit():
    # x = log10(params) = 1, 2, 3 (mean 2, sum of squares about it 2); gaps 0.1, 0.2, 0.4:
    # b = sum (x - 2)(g - gbar) / 2 = ((-1)(0.1) + (0)(0.2) + (1)(0.4)) / 2 = 0.15
    t = gap_trend([(10, 0.1), (100, 0.2), (1000, 0.4)])
    assert t["slope"] == pytest.approx(0.15, abs=1e-12)
    # residuals: g - gbar - b (x - 2) = 0.1-0.2333+0.15, 0.2-0.2333, 0.4-0.2333-0.15
    r = np.array([0.1 - 0.7 / 3 + 0.15, 0.2 - 0.7 / 3, 0.4 - 0.7 / 3 - 0.15])
    assert t["se"] == pytest.approx(math.sqrt(r @ r / 1 / 2), abs=1e-12)
    assert t["verdict"] == ("grows" if 0.15 > 2 * t["se"] else "not resolved at these sizes")
    assert t["n"] == 3 and t["sizes"] == 3


def test_trend_verdicts():
    rng = np.random.default_rng(0)
    sizes = [1e5, 1e6, 1e7, 1e8]
    shrinking = [(p, 0.3 - 0.05 * math.log10(p) + 0.001 * rng.standard_normal())
                 for p in sizes for _ in range(3)]
    assert gap_trend(shrinking)["verdict"] == "shrinks"
    flat = gap_trend([(p, sign * 0.1) for p in sizes for sign in (1, -1)])  # slope 0, se > 0
    assert flat["slope"] == pytest.approx(0.0, abs=1e-15) and flat["se"] > 0
    assert flat["verdict"] == "not resolved at these sizes"
    one_size = gap_trend([(1e6, 0.1), (1e6, 0.2), (1e6, 0.15)])
    assert one_size["slope"] is None and one_size["sizes"] == 1
    assert "not resolved" in trend_sentence(one_size, "mutual_knn")
    assert "shrinks with encoder size" in trend_sentence(gap_trend(shrinking), "mutual_knn")
