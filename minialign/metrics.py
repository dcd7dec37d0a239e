"""Evaluation metrics. Text side: recall_at_k, paraphrase_r_at_1, collapse_stats. Alignment
with frozen image embeddings of the same photos: mutual_knn, and caption -> image R@k after a
rotation fitted on the train photos (fit_procrustes, then rotated_recall). N photos, D and
D_img widths; float64 throughout; every sort stable, so ties go to the lower index."""
import numpy as np

DEFAULT_KS = (1, 5, 10)  # R@1, R@5, R@10
MUTUAL_KNN_K = 10        # chance K / (N - 1) = 0.010 at N = 1000
COLLAPSE_RMS_TOL = 1e-6  # unit rows closer than this to their mean are one point
COLLAPSE_STD_FRACTION = 0.1  # "collapsed": mean per-dimension std of unit rows < 0.1 / sqrt(D)


def _check_matrix(x, name):
    """x as a float64 (N, D) array; ValueError unless 2-D, non-empty and finite."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or 0 in x.shape or not np.all(np.isfinite(x)):
        raise ValueError(f"{name} must be a finite, non-empty 2-D array, got shape {x.shape}")
    return x


def l2_normalize(x):
    """Each row of x (N, D) scaled to unit norm. Raises ValueError for a zero row."""
    x = _check_matrix(x, "x")
    norms = np.linalg.norm(x, axis=1, keepdims=True)                          # (N, 1)
    if np.any(norms == 0):
        raise ValueError(f"x has {int(np.sum(norms == 0))} all-zero row(s); cannot L2-normalise")
    return x / norms


def cosine_similarity(a, b):
    """(N_a, N_b) cosine similarity of every row of a (N_a, D) with every row of b (N_b, D)."""
    return l2_normalize(a) @ l2_normalize(b).T


def recall_at_k(sim, ks=DEFAULT_KS):
    """Recall@k where gallery item i is the right answer for query i. sim: (N_q, N_g), N_q <=
    N_g, higher = more similar. Rank of query i = #{j: sim[i, j] > sim[i, i]} + #{j < i:
    sim[i, j] == sim[i, i]} (ties to the lower index). Returns {"R@k": fraction with rank < k}."""
    sim = _check_matrix(sim, "sim")
    n_query, n_gallery = sim.shape
    if n_query > n_gallery or any(int(k) != k or k < 1 for k in ks):
        raise ValueError(f"need N_query <= N_gallery and ks >= 1, got {sim.shape}, {ks}")
    # --- exercise 12: recall at k ---
    rows = np.arange(n_query)                                                 # (Nq,)
    correct = sim[rows, rows][:, None]                                        # (Nq, 1)
    cols = np.arange(n_gallery)[None, :]                                      # (1, Ng)
    beats = (sim > correct) | ((sim == correct) & (cols < rows[:, None]))     # (Nq, Ng)
    rank = beats.sum(axis=1)                                                  # (Nq,)
    return {f"R@{k}": float(np.mean(rank < k)) for k in ks}
    # --- end of exercise 12 ---


def paraphrase_r_at_1(z_query, z_gallery):
    """Does a caption find another caption of its own photo? Row i of z_query and z_gallery
    (N, D) are two different captions of photo i. R@1 by cosine similarity (chance 1 / N)."""
    if np.shape(z_query) != np.shape(z_gallery):
        raise ValueError(f"z_query {np.shape(z_query)} and z_gallery {np.shape(z_gallery)} differ")
    return recall_at_k(cosine_similarity(z_query, z_gallery), ks=(1,))["R@1"]


def collapse_stats(z):
    """Collapse diagnostics of z (N, D), on its unit rows u: "std", the mean per-dimension std
    of u (0 when every caption maps to one direction, ~1/sqrt(D) when isotropic); "collapsed",
    std < COLLAPSE_STD_FRACTION / sqrt(D); "effective_rank", exp(entropy) of the normalised
    singular values of the centred u (Roy & Vetterli 2007), 1 if all rows coincide."""
    u = l2_normalize(z)                                                       # (N, D)
    std = float(np.mean(u.std(axis=0)))
    threshold = COLLAPSE_STD_FRACTION / np.sqrt(u.shape[1])
    verdict = {"std": std, "collapse_std_threshold": float(threshold),
               "collapsed": bool(std < threshold)}
    centred = u - u.mean(axis=0, keepdims=True)                               # (N, D)
    if np.sqrt(np.mean(np.sum(centred**2, axis=1))) < COLLAPSE_RMS_TOL:
        return {**verdict, "effective_rank": 1.0}
    s = np.linalg.svd(centred, compute_uv=False)
    s = s[s > s.max() * max(centred.shape) * np.finfo(np.float64).eps]        # drop rounding noise
    p = s / s.sum()
    return {**verdict, "effective_rank": float(np.exp(-np.sum(p * np.log(p))))}


def knn_indices(x, k):
    """(N, k) indices of each row's k nearest rows of x (N, D) by cosine similarity, itself
    excluded, nearest first, ties to the lower index. 1 <= k < N."""
    x = _check_matrix(x, "x")
    if not 1 <= k < len(x):
        raise ValueError(f"k must satisfy 1 <= k < N = {len(x)} (self is excluded), got k = {k}")
    sim = cosine_similarity(x, x)                                             # (N, N)
    np.fill_diagonal(sim, -np.inf)                                            # never itself
    return np.argsort(-sim, axis=1, kind="stable")[:, :k]                     # (N, K)


def mutual_knn(A, B, k=MUTUAL_KNN_K):
    """Mutual k-NN alignment (Huh et al. 2024): row i of A (N, D_a) and of B (N, D_b) describe
    photo i; each row's k nearest neighbours are found within A and within B, and the score is
    mean_i |knn_A(i) & knn_B(i)| / k, in [0, 1] (chance ~ k / (N - 1))."""
    A, B = _check_matrix(A, "A"), _check_matrix(B, "B")
    if len(A) != len(B):
        raise ValueError(f"A and B must have the same number of rows, got {len(A)} and {len(B)}")
    n = A.shape[0]
    # --- exercise 13: mutual k-NN ---
    rows = np.arange(n)[:, None]                                              # (N, 1)
    in_knn_A = np.zeros((n, n), dtype=bool)                                   # (N, N)
    in_knn_A[rows, knn_indices(A, k)] = True
    in_knn_B = np.zeros((n, n), dtype=bool)                                   # (N, N)
    in_knn_B[rows, knn_indices(B, k)] = True
    overlap = np.sum(in_knn_A & in_knn_B, axis=1)                             # (N,)
    return float(np.mean(overlap / k))
    # --- end of exercise 13 ---


def prepare_for_rotation(x, mean):
    """Centre x (N, D) with the TRAIN mean (D,), then unit rows: a rotation cannot move one
    cloud's offset onto the other's, and cosine ranking reads directions."""
    mean = np.asarray(mean, dtype=np.float64)
    if mean.shape != (np.shape(x)[1],):
        raise ValueError(f"mean must have shape ({np.shape(x)[1]},), got {mean.shape}")
    return l2_normalize(_check_matrix(x, "x") - mean)


def fit_rotation(z_text, img):
    """Orthogonal Procrustes (Schönemann 1966): W = argmin ||z_text W - img||_F with W W^T = I.
    z_text (N, D), img (N, D_img), D <= D_img. With z_text^T img = U S V^T, W = U V^T (D, D_img)."""
    z_text, img = _check_matrix(z_text, "z_text"), _check_matrix(img, "img")
    if len(z_text) != len(img) or z_text.shape[1] > img.shape[1]:
        raise ValueError(f"need the same rows and D <= D_img, got {z_text.shape}, {img.shape}")
    # --- exercise 14: Procrustes rotation ---
    m = z_text.T @ img                                                        # (D, D_img)
    u, _, vt = np.linalg.svd(m, full_matrices=False)                          # (D, D), (D, D_img)
    return u @ vt                                                             # (D, D_img)
    # --- end of exercise 14 ---


def fit_procrustes(z_text_train, img_train):
    """The rotation on the train photos' (caption, image) pairs, each space centred with its
    train mean and unit rows. Returns (W (D, D_img), text_mean (D,), img_mean (D_img,))."""
    text_mean = _check_matrix(z_text_train, "z_text_train").mean(axis=0)     # (D,)
    img_mean = _check_matrix(img_train, "img_train").mean(axis=0)            # (D_img,)
    w = fit_rotation(prepare_for_rotation(z_text_train, text_mean),
                     prepare_for_rotation(img_train, img_mean))               # (D, D_img)
    return w, text_mean, img_mean


def rotated_recall(rotation, z_text_test, img_test, ks=DEFAULT_KS):
    """Caption -> image R@k through a fitted rotation (fit_procrustes): test captions mapped by
    W rank all test images by cosine; caption i's image is image i (chance ~ k / N)."""
    w, text_mean, img_mean = rotation
    if len(z_text_test) != len(img_test):
        raise ValueError(f"{len(z_text_test)} test captions but {len(img_test)} test images")
    mapped = prepare_for_rotation(z_text_test, text_mean) @ w                 # (N, D_img)
    return recall_at_k(cosine_similarity(mapped, prepare_for_rotation(img_test, img_mean)), ks)
