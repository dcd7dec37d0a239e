"""Metrics (metrics.py): exact values on small inputs with ties and duplicated rows, rank-deficient
rotations, float32 scored as float64, and the verdict of a run that collapses. recall_at_k,
mutual_knn and fit_rotation by hand and against loops: tests/test_exercises.py, 12 to 14."""
import numpy as np
import pytest

from minialign.metrics import (collapse_stats, fit_procrustes, knn_indices, l2_normalize,
                               mutual_knn, paraphrase_r_at_1, prepare_for_rotation, rotated_recall)
from minialign.model import ModelConfig
from minialign.train import TrainConfig, train


def semi_orthogonal(rng, d_in, d_out):
    """(d_in, d_out) with orthonormal rows (W W^T = I)."""
    return np.linalg.qr(rng.standard_normal((d_out, d_in)))[0].T


def on_circle(degrees):
    t = np.deg2rad(np.asarray(degrees, dtype=np.float64))
    return np.stack([np.cos(t), np.sin(t)], axis=1)


def test_paraphrase_r_at_1_with_duplicated_rows():
    query = on_circle([0, 90, 180, 270])
    # photos 0 and 1's other captions are 10 degrees away: found; 2's (260) is nearer to query 3
    # and 3's (190) to query 2: missed. Norms differ: cosine ignores them.
    gallery = on_circle([10, 100, 260, 190]) * np.array([[3.0], [0.5], [2.0], [7.0]])
    assert paraphrase_r_at_1(query, gallery) == 0.5
    assert paraphrase_r_at_1(query, query * 4.0) == 1.0
    # every caption identical: all tie, each query's own item wins only at index 0
    assert paraphrase_r_at_1(np.ones((4, 3)), np.ones((4, 3))) == 0.25
    with pytest.raises(ValueError, match="differ"):
        paraphrase_r_at_1(query, gallery[:3])
    with pytest.raises(ValueError, match="all-zero"):
        l2_normalize(np.array([[1.0, 0.0], [0.0, 0.0]]))


def test_collapse_stats_by_hand():
    """Rows (1, +-a): unit rows (1, +-a) / sqrt(1 + a^2), per-dimension std 0 and a / sqrt(1 +
    a^2): std a / (2 sqrt(1 + a^2)) against 0.1 / sqrt(2); one direction."""
    for a, collapsed in [(0.1, True), (0.2, False)]:           # std 0.04975, 0.09806
        stats = collapse_stats(np.array([[1.0, a], [1.0, -a]], np.float32))
        assert stats["std"] == pytest.approx(a / (2 * np.sqrt(1 + a * a)), rel=1e-6)
        assert stats["collapse_std_threshold"] == 0.1 / np.sqrt(2)
        assert stats["collapsed"] is collapsed and stats["effective_rank"] == pytest.approx(1.0)
    same = collapse_stats(np.tile([[3.0, -1.0, 2.0, 0.7]], (7, 1)) * np.arange(1, 8)[:, None])
    assert same["std"] < 1e-15 and same["effective_rank"] == 1.0 and same["collapsed"] is True
    # a permuted, rescaled basis of D = 5: per-dimension std sqrt(d - 1) / d; centred, d - 1
    # singular values 1 and one 0: effective rank d - 1
    z = np.eye(5)[[3, 0, 4, 1, 2]] * np.array([[0.5], [3], [1], [2], [0.7]])
    stats = collapse_stats(z)
    assert stats["std"] == pytest.approx(2 / 5, rel=1e-14)
    assert stats["effective_rank"] == pytest.approx(4, rel=1e-12) and not stats["collapsed"]


def test_knn_and_mutual_knn_by_hand():
    # N = 5, k = 3: each neighbour set is everyone but me and my farthest point
    a = on_circle([0, 10, 25, 45, 70])                         # farthest: 4, 4, 4, 0, 0
    assert knn_indices(a, 3).tolist() == [[1, 2, 3], [0, 2, 3], [1, 3, 0], [2, 4, 1], [3, 2, 1]]
    # duplicated rows tie: the lower index wins (mutual_knn's values: exercise 13's tests)
    e = np.eye(3)
    assert knn_indices(e[[0, 1, 1, 1, 2]], 1)[:, 0].tolist() == [1, 2, 1, 1, 0]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 6))
    assert mutual_knn(x, x @ semi_orthogonal(rng, 6, 9) * rng.uniform(0.1, 9, (60, 1)), 10) == 1
    for A, B, k in [(x, x, 60), (x, x, 0), (x, x[:59], 2), (x[0], x[0], 1)]:
        with pytest.raises(ValueError):
            mutual_knn(A, B, k)


def test_mutual_knn_of_unrelated_rows_is_chance():
    rng = np.random.default_rng(1)
    n, k = 300, 10
    a = rng.standard_normal((n, 16))
    assert abs(mutual_knn(a, a[rng.permutation(n)], k) - k / (n - 1)) < 5 / np.sqrt(n * (n - 1))


def test_procrustes_recall_centres_with_the_train_means():
    """Test captions and images both moved away from the train photos: centred with the train
    means they still match exactly (centred with their own, R@1 falls to ~0.3)."""
    rng = np.random.default_rng(3)
    w_true, offset = semi_orthogonal(rng, 8, 20), 5.0 * rng.standard_normal(20)
    z_train = rng.standard_normal((100, 8)) + 2
    z_test = rng.standard_normal((50, 8)) + [5, 2, 2, 2, 2, 2, 2, 2]      # moved off the train mean
    rotation = fit_procrustes(z_train.astype(np.float32), z_train @ w_true + offset)
    assert rotation[0].dtype == np.float64
    assert rotated_recall(rotation, z_test, z_test @ w_true + offset) == \
        {"R@1": 1.0, "R@5": 1.0, "R@10": 1.0}
    unrelated = fit_procrustes(rng.standard_normal((300, 8)), rng.standard_normal((300, 16)))
    r = rotated_recall(unrelated, rng.standard_normal((200, 8)), rng.standard_normal((200, 16)))
    assert r["R@1"] < 0.05 and r["R@10"] < 0.2
    out = prepare_for_rotation(np.array([[3.0, 4.0], [1.0, 1.0]]), np.array([0.0, 1.0]))
    np.testing.assert_allclose(out, [[2**-0.5, 2**-0.5], [1.0, 0.0]], atol=1e-15)


@pytest.mark.parametrize("var_weight, collapsed", [(0.0, True), (25.0, False)])
def test_a_run_without_variance_and_covariance_collapses_and_says_so(captions, tmp_path,
                                                                     var_weight, collapsed):
    """good_views without VICReg's variance and covariance terms: every caption in one direction
    (std ~ 0.01, threshold 0.1 / sqrt(16)), though its effective rank looks healthy."""
    cfg = TrainConfig(objective="good_views", captions=str(captions), steps=20, batch_photos=16,
                      lr=3e-3, warmup_steps=2, eval_every=20,
                      model=ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=16),
                      loss=dict(var_weight=var_weight, cov_weight=var_weight / 25))
    final = train(cfg, tmp_path / "run", progress=False)["final"]
    assert final["test"]["collapsed"] is final["val"]["collapsed"] is collapsed
    assert final["test"]["collapse_std_threshold"] == 0.025
    assert (final["test"]["std"] < 0.5 * 0.025) if collapsed else (final["test"]["std"] > 0.1)
