"""Tests for minialign.metrics: exact values on small hand-made inputs."""
import numpy as np
import pytest

from minialign.metrics import (COLLAPSE_STD_FRACTION, collapse_stats, cosine_similarity,
                               fit_procrustes, fit_rotation, knn_indices, l2_normalize, mutual_knn,
                               paraphrase_r_at_1, prepare_for_rotation, recall_at_k, rotated_recall)
from minialign.machinery.run.monitor import text_metrics


def random_semi_orthogonal(rng, d_in, d_out):
    """(d_in, d_out) float64 with orthonormal rows (W W^T = I), d_in <= d_out."""
    q, _ = np.linalg.qr(rng.standard_normal((d_out, d_in)))                   # (d_out, d_in)
    return q.T                                                                # (d_in, d_out)


def on_circle(degrees):
    """Unit 2-D points at the given angles (degrees)."""
    t = np.deg2rad(np.asarray(degrees, dtype=np.float64))                     # (N,)
    return np.stack([np.cos(t), np.sin(t)], axis=1)                           # (N, 2)


# ---------------------------------------------------------------- recall_at_k, paraphrase R@1

def test_recall_at_k_hand_made_with_ties():
    sim = np.array([[0.9, 0.9, 0.1, 0.0],    # tie with j=1, but 1 > 0: rank 0
                    [0.5, 0.5, 0.2, 0.7],    # j=3 higher, j=0 tied with lower index: rank 2
                    [0.3, 0.1, 0.3, 0.3],    # j=0 tied lower (counts), j=3 tied higher: rank 1
                    [0.8, 0.9, 0.95, 0.1]])  # all three higher: rank 3
    r = recall_at_k(sim, ks=(1, 2, 3, 4))
    assert r == {"R@1": 0.25, "R@2": 0.5, "R@3": 0.75, "R@4": 1.0}
    # R@1 agrees with argmax (first occurrence wins ties)
    assert np.mean(np.argmax(sim, axis=1) == np.arange(4)) == r["R@1"]


def test_recall_at_k_rectangular_and_errors():
    sim = np.array([[0.2, 0.1, 0.3],
                    [0.0, 0.5, 0.4]])        # 2 queries, 3 gallery items: ranks 1, 0
    assert recall_at_k(sim, ks=(1, 2)) == {"R@1": 0.5, "R@2": 1.0}
    with pytest.raises(ValueError, match="more queries"):
        recall_at_k(sim.T)
    with pytest.raises(ValueError, match="positive integers"):
        recall_at_k(sim, ks=(0,))
    with pytest.raises(ValueError, match="NaN or Inf"):
        recall_at_k(np.array([[np.nan, 0.0], [0.0, 1.0]]))


def test_paraphrase_r_at_1_exact():
    z_query = on_circle([0, 90, 180, 270])                                   # (4, 2)
    # photo 0 and 1's other captions are 10 degrees away: found. Photo 2's (260) is nearer to
    # query 3 (270) and photo 3's (190) nearer to query 2 (180): both missed.
    z_gallery = on_circle([10, 100, 260, 190]) * np.array([[3.0], [0.5], [2.0], [7.0]])  # (4, 2)
    assert paraphrase_r_at_1(z_query, z_gallery) == 0.5
    assert paraphrase_r_at_1(z_query, z_query * 4.0) == 1.0
    with pytest.raises(ValueError, match="must match"):
        paraphrase_r_at_1(z_query, z_gallery[:3])


# ---------------------------------------------------------------------------- collapse_stats

def test_collapse_stats_fully_collapsed():
    exact = np.tile([[2.0, 0.0, 0.0]], (6, 1))                               # (6, 3)
    assert collapse_stats(exact) == {"std": 0.0, "collapse_std_threshold": 0.1 / np.sqrt(3),
                                     "collapsed": True, "effective_rank": 1.0}
    # a generic direction: the column means are only equal to the rows up to rounding
    generic = np.tile([[3.0, -1.0, 2.0, 0.7]], (7, 1)) * np.arange(1, 8)[:, None]  # (7, 4)
    stats = collapse_stats(generic)
    assert stats["std"] < 1e-15
    assert stats["effective_rank"] == 1.0 and stats["collapsed"] is True


def test_collapse_verdict_hand_computed():
    """Rows (1, +a) and (1, -a): unit rows (1, +-a) / sqrt(1 + a^2). Per-dimension std:
    0 and a / sqrt(1 + a^2), so std = a / (2 sqrt(1 + a^2)); the threshold for D = 2 is
    0.1 / sqrt(2) = 0.0707. Centred, the rows are (0, +-a / sqrt(1 + a^2)): one direction."""
    assert COLLAPSE_STD_FRACTION == 0.1
    for a, collapsed in [(0.1, True), (0.2, False)]:      # std 0.04975 and 0.09806
        stats = collapse_stats(np.array([[1.0, a], [1.0, -a]]))
        assert abs(stats["std"] - a / (2 * np.sqrt(1 + a * a))) < 1e-15
        assert stats["collapse_std_threshold"] == 0.1 / np.sqrt(2)
        assert stats["collapsed"] is collapsed
        assert abs(stats["effective_rank"] - 1.0) < 1e-12
    # float32 input with a tiny spread: 400 rows around one direction in D = 16
    rng = np.random.default_rng(0)
    z = (np.ones(16) + 1e-3 * rng.standard_normal((400, 16))).astype(np.float32)  # (400, 16)
    stats = collapse_stats(z)
    assert stats["collapse_std_threshold"] == 0.1 / 4                      # 0.1 / sqrt(16)
    assert stats["std"] < 1e-3 and stats["collapsed"] is True
    assert stats["effective_rank"] > 10          # the rank alone would look healthy


def test_collapse_stats_orthonormal_basis():
    d = 5
    rng = np.random.default_rng(0)
    # permuted, rescaled standard basis: unit rows e_i, each column holds one 1 and d-1 zeros
    z = np.eye(d)[rng.permutation(d)] * rng.uniform(0.5, 3.0, size=(d, 1))   # (d, d)
    stats = collapse_stats(z)
    # per-dimension std: sqrt(1/d - 1/d^2) = sqrt(d - 1) / d
    assert abs(stats["std"] - np.sqrt(d - 1) / d) < 1e-15
    # centred: (I - 11^T/d) has d-1 singular values 1 and one 0 -> exp(log(d-1)) = d-1
    assert abs(stats["effective_rank"] - (d - 1)) < 1e-12
    assert stats["collapsed"] is False and stats["collapse_std_threshold"] == 0.1 / np.sqrt(d)
    # any orthonormal basis has the same spectrum after centring
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))                          # (d, d)
    assert abs(collapse_stats(q)["effective_rank"] - (d - 1)) < 1e-10


def test_collapse_stats_isotropic():
    d = 16
    z = np.random.default_rng(1).standard_normal((20000, d))                 # (20000, d)
    stats = collapse_stats(z)
    assert abs(stats["std"] - 1 / np.sqrt(d)) < 0.005 and stats["collapsed"] is False
    assert d - 0.5 < stats["effective_rank"] <= d


def test_zero_row_rejected():
    with pytest.raises(ValueError, match="all-zero"):
        l2_normalize(np.array([[1.0, 0.0], [0.0, 0.0]]))


# ------------------------------------------------------------------------------ mutual_knn

def test_mutual_knn_identical_and_rotated_spaces():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((200, 16))                                        # (200, 16)
    assert mutual_knn(a, a, k=10) == 1.0
    b = a @ random_semi_orthogonal(rng, 16, 40)                               # (200, 40)
    assert mutual_knn(a, b, k=10) == 1.0
    # rescaling rows changes no cosine similarity
    assert mutual_knn(a, b * rng.uniform(0.1, 10.0, size=(200, 1)), k=10) == 1.0


def test_mutual_knn_permuted_rows_is_chance():
    n, k = 400, 10
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, 32))                                          # (n, 32)
    b = a[rng.permutation(n)]                                                 # (n, 32)
    chance = k / (n - 1)
    # per-sample overlap ~ hypergeometric, var ~ k^2/(n-1) / k^2; mean of n: sd ~ 1/sqrt(n(n-1))
    tol = 5 / np.sqrt(n * (n - 1))   # 5 standard deviations
    assert abs(mutual_knn(a, b, k=k) - chance) < tol


def test_mutual_knn_hand_worked():
    # N = 5, k = 3: each neighbour set is "everyone but me and my farthest point", so two sets
    # share 3 points when the farthest points agree and 2 otherwise.
    a = on_circle([0, 10, 25, 45, 70])   # farthest: 4, 4, 4, 0, 0
    b = on_circle([0, 60, 20, 45, 12])   # farthest: 1, 0, 1, 0, 1
    assert [sorted(row) for row in knn_indices(a, 3)] == [[1, 2, 3], [0, 2, 3], [0, 1, 3],
                                                          [1, 2, 4], [1, 2, 3]]
    assert [sorted(row) for row in knn_indices(b, 3)] == [[2, 3, 4], [2, 3, 4], [0, 3, 4],
                                                          [1, 2, 4], [0, 2, 3]]
    # only point 3 agrees: (4 * 2/3 + 1) / 5 = 11/15
    assert abs(mutual_knn(a, b, k=3) - 11 / 15) < 1e-15
    assert knn_indices(a, 3)[0].tolist() == [1, 2, 3]   # nearest first


def test_mutual_knn_ties_go_to_lower_index():
    e = np.eye(3)
    a = e[[0, 1, 1, 1, 2]]                                                    # (5, 3)
    b = e[[0, 1, 1, 2, 2]]                                                    # (5, 3)
    # point 0 sees cosine 0 to all others -> 1; points 1..3 are copies -> the lowest other copy
    assert knn_indices(a, 1)[:, 0].tolist() == [1, 2, 1, 1, 0]
    assert knn_indices(b, 1)[:, 0].tolist() == [1, 2, 1, 4, 3]
    # points 0, 1, 2 agree: 3/5 (ties to the HIGHER index would give 2/5)
    assert mutual_knn(a, b, k=1) == 0.6


def test_mutual_knn_errors():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 3))                                           # (5, 3)
    with pytest.raises(ValueError, match="1 <= k < N"):
        mutual_knn(a, a, k=5)
    with pytest.raises(ValueError, match="1 <= k < N"):
        mutual_knn(a, a, k=0)
    with pytest.raises(ValueError, match="same number of rows"):
        mutual_knn(a, a[:4], k=2)
    with pytest.raises(ValueError, match="2-D"):
        mutual_knn(a[0], a[0], k=2)
    bad = a.copy()
    bad[2, 1] = np.inf
    with pytest.raises(ValueError, match="NaN or Inf"):
        mutual_knn(a, bad, k=2)


# ------------------------------------------------------------------------------- Procrustes

def test_fit_rotation_recovers_semi_orthogonal_map():
    rng = np.random.default_rng(0)
    d_text, d_img = 8, 20
    w_true = random_semi_orthogonal(rng, d_text, d_img)                      # (8, 20)
    offset = rng.standard_normal(d_img) * 5.0                                 # (20,) shared offset
    z_train = rng.standard_normal((100, d_text)) + 2.0                        # (100, 8)
    z_test = rng.standard_normal((50, d_text)) + 2.0                          # (50, 8)
    img_train = z_train @ w_true + offset                                     # (100, 20)
    img_test = z_test @ w_true + offset                                       # (50, 20)
    w = fit_rotation(prepare_for_rotation(z_train, z_train.mean(axis=0)),
                     prepare_for_rotation(img_train, img_train.mean(axis=0)))  # (8, 20)
    assert np.linalg.norm(w - w_true) < 1e-8
    assert np.linalg.norm(w @ w.T - np.eye(d_text)) < 1e-12
    r = rotated_recall(fit_procrustes(z_train, img_train), z_test, img_test)
    assert r == {"R@1": 1.0, "R@5": 1.0, "R@10": 1.0}


def test_fit_rotation_is_semi_orthogonal_on_noise_and_rejects_wide_text():
    rng = np.random.default_rng(1)
    w = fit_rotation(rng.standard_normal((30, 6)), rng.standard_normal((30, 9)))  # (6, 9)
    assert w.shape == (6, 9)
    assert np.linalg.norm(w @ w.T - np.eye(6)) < 1e-12
    with pytest.raises(ValueError, match="D_text <= D_img"):
        fit_rotation(rng.standard_normal((30, 9)), rng.standard_normal((30, 6)))


def test_rotated_recall_unrelated_spaces_is_low():
    rng = np.random.default_rng(2)
    rotation = fit_procrustes(rng.standard_normal((300, 8)), rng.standard_normal((300, 16)))
    r = rotated_recall(rotation, rng.standard_normal((200, 8)), rng.standard_normal((200, 16)))
    assert r["R@1"] < 0.05 and r["R@10"] < 0.2
    with pytest.raises(ValueError, match="differ from train widths"):
        rotated_recall(fit_procrustes(rng.standard_normal((30, 8)), rng.standard_normal((30, 16))),
                       rng.standard_normal((20, 7)), rng.standard_normal((20, 16)))


def refit_per_slot_recall(z_train, img_train, z_test, img_test):
    """Caption -> image R@k as it was before the fit was shared: every call refits W."""
    text_mean, img_mean = z_train.astype(np.float64).mean(0), img_train.astype(np.float64).mean(0)
    w = fit_rotation(prepare_for_rotation(z_train, text_mean),
                     prepare_for_rotation(img_train, img_mean))
    mapped = prepare_for_rotation(z_test, text_mean) @ w
    return recall_at_k(cosine_similarity(mapped, prepare_for_rotation(img_test, img_mean)))


def test_one_fit_for_every_slot_gives_the_per_slot_refit_numbers():
    """evaluate.score_test fits W once per step and maps every slot: the same numbers, bit for
    bit, as refitting on the identical train pairs once per slot (the SVD is deterministic)."""
    rng = np.random.default_rng(5)
    w_true = random_semi_orthogonal(rng, 8, 12)                               # (8, 12)
    z_train = rng.standard_normal((60, 8)).astype(np.float32)                 # (60, 8)
    img_train = (z_train @ w_true + 0.8 * rng.standard_normal((60, 12))).astype(np.float32)
    img_test = rng.standard_normal((40, 12)).astype(np.float32)               # (40, 12)
    z_slots = [(img_test @ w_true.T + s * rng.standard_normal((40, 8))).astype(np.float32)
               for s in (0.5, 1.0, 2.0)]                                       # 3 x (40, 8)
    rotation = fit_procrustes(z_train, img_train)
    for z in z_slots:
        old = refit_per_slot_recall(z_train, img_train, z, img_test)
        assert rotated_recall(rotation, z, img_test) == old
    assert len({rotated_recall(rotation, z, img_test)["R@1"] for z in z_slots}) > 1
    with pytest.raises(ValueError, match="differ from train widths"):
        rotated_recall(rotation, z_slots[0][:, :7], img_test)


def test_prepare_for_rotation():
    x = np.array([[3.0, 4.0], [1.0, 1.0]])
    out = prepare_for_rotation(x, np.array([0.0, 1.0]))
    assert np.allclose(out, [[3 / np.sqrt(18), 3 / np.sqrt(18)], [1.0, 0.0]], rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="mean must have shape"):
        prepare_for_rotation(x, np.zeros(3))


def test_cosine_similarity_width_mismatch():
    with pytest.raises(ValueError, match="same width"):
        cosine_similarity(np.ones((2, 3)), np.ones((2, 4)))


def test_text_metrics_of_slots():
    """Paraphrase R@1 (slot 0 queries slot 1), chance 1 / P, the slot count, and the collapse
    statistics of slot 0."""
    z0 = np.eye(4, dtype=np.float32)                                          # (4, 4)
    z1 = np.eye(4, dtype=np.float32)[[0, 1, 3, 2]]                            # photos 2, 3 swapped
    photos = np.arange(4)
    out = text_metrics({0: (photos, z0), 1: (photos, z1), 2: (photos[:2], z0[:2])})
    assert out["paraphrase_R@1"] == 0.5 and out["chance"] == 0.25 and out["caption_slots"] == 3
    assert out == {"paraphrase_R@1": 0.5, "chance": 0.25, "caption_slots": 3, **collapse_stats(z0)}
