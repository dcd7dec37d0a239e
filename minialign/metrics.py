"""Evaluation metrics. Text side: recall_at_k, paraphrase_r_at_1, collapse_stats. Alignment
with frozen DINOv2 embeddings of the same photos: mutual_knn, fit_rotation, and caption ->
image R@k after a rotation fitted on the train photos (fit_procrustes, then rotated_recall).

Sizes: N samples (photos), D caption-embedding width, D_img image-embedding width (768 for
DINOv2-base), K neighbours. Every metric computes in float64, and every sort is
`kind="stable"`, so ties always go to the lower index.
"""
import numpy as np

DEFAULT_KS = (1, 5, 10)  # recall cut-offs reported by the replication (R@1, R@5, R@10)
MUTUAL_KNN_K = 10  # neighbours per point in the replication; chance K / (N - 1) = 0.010 at N = 1000
COLLAPSE_RMS_TOL = 1e-6  # unit rows whose RMS distance to their mean is below this are one point
#                          up to float32 rounding (float32 eps ~ 1.2e-7); effective rank is then 1
COLLAPSE_STD_FRACTION = 0.1  # "collapsed" when the mean per-dimension std of the unit rows is
#   below this fraction of the isotropic 1 / sqrt(D). Measured (test split, std * sqrt(D)):
#   tiny good_views runs with var_weight = cov_weight = 0 (D = 16, 32; 20-60 steps) 0.004-0.017;
#   the same runs with the VICReg terms 0.73-0.96; untrained encoders 0.57-0.59 (D = 16-64);
#   the README's 256-d COCO runs 0.91-0.96. 0.1 sits ~6x above the collapsed, ~6x below the rest.


def _check_matrix(x, name):
    """Return x as a float64 (N, D) array; ValueError if it is not 2-D, empty or not finite."""
    x = np.asarray(x, dtype=np.float64)                                       # (N, D)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (N, D) array, got shape {x.shape}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must be non-empty, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or Inf")
    return x


def l2_normalize(x):
    """Scale each row to unit Euclidean norm.
    x: (N, D) float. Returns (N, D) float64 with ||row||_2 = 1.
    Raises ValueError for a zero row (it has no direction, so no cosine similarity)."""
    x = _check_matrix(x, "x")                                                 # (N, D)
    norms = np.linalg.norm(x, axis=1, keepdims=True)                          # (N, 1)
    if np.any(norms == 0):
        raise ValueError(f"x has {int(np.sum(norms == 0))} all-zero row(s); cannot L2-normalise")
    return x / norms                                                          # (N, D)


def cosine_similarity(a, b):
    """Cosine similarity of every row of a with every row of b.
    a: (N_a, D), b: (N_b, D) float. Returns (N_a, N_b) float64 in [-1, 1]."""
    a, b = _check_matrix(a, "a"), _check_matrix(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must have the same width, got {a.shape} and {b.shape}")
    return l2_normalize(a) @ l2_normalize(b).T                                # (N_a, N_b)


def recall_at_k(sim, ks=DEFAULT_KS):
    """Recall@k for retrieval where the correct gallery item of query i is gallery item i.
    sim: (N_query, N_gallery) float, higher = more similar, N_query <= N_gallery. Rank of query
    i (0 = first) = #{j : sim[i, j] > sim[i, i]} + #{j < i : sim[i, j] == sim[i, i]}: ties go
    to the lower index, as np.argmax and a stable sort of -sim[i]. ks: positive ints.
    Returns {"R@k": fraction of queries with rank < k} for each k, floats in [0, 1] (chance ~
    k / N_gallery). Raises ValueError for a non-2-D or non-finite sim, N_query > N_gallery,
    or a k < 1."""
    sim = _check_matrix(sim, "sim")                                           # (Nq, Ng)
    n_query, n_gallery = sim.shape
    if n_query > n_gallery:
        raise ValueError(f"sim has more queries ({n_query}) than gallery items ({n_gallery})")
    if any(int(k) != k or k < 1 for k in ks):
        raise ValueError(f"ks must be positive integers, got {ks}")
    # --- exercise 12: recall at k ---
    rows = np.arange(n_query)                                                 # (Nq,)
    correct = sim[rows, rows][:, None]                                        # (Nq, 1)
    cols = np.arange(n_gallery)[None, :]                                      # (1, Ng)
    beats = (sim > correct) | ((sim == correct) & (cols < rows[:, None]))     # (Nq, Ng)
    rank = beats.sum(axis=1)                                                  # (Nq,)
    return {f"R@{k}": float(np.mean(rank < k)) for k in ks}
    # --- end of exercise 12 ---


def paraphrase_r_at_1(z_query, z_gallery):
    """Paraphrase retrieval R@1: does a caption find another caption of its own photo?
    z_query, z_gallery: (N, D) caption embeddings; row i of each is a DIFFERENT caption of
    photo i. Returns the fraction of queries whose most cosine-similar gallery row is row i
    (recall_at_k; chance 1 / N). Raises ValueError for mismatched shapes."""
    z_query, z_gallery = _check_matrix(z_query, "z_query"), _check_matrix(z_gallery, "z_gallery")
    if z_query.shape != z_gallery.shape:
        raise ValueError(f"z_query {z_query.shape} and z_gallery {z_gallery.shape} must match")
    sim = cosine_similarity(z_query, z_gallery)                               # (N, N)
    return recall_at_k(sim, ks=(1,))["R@1"]


def collapse_stats(z):
    """Collapse diagnostics of caption embeddings z: (N, D) float, on L2-normalised rows u:
      "std": mean over dimensions of u's per-dimension std (ddof=0); 0 = every caption maps to
          one direction, ~1 / sqrt(D) for isotropic unit vectors (SimSiam, Chen & He 2021);
      "collapse_std_threshold": COLLAPSE_STD_FRACTION / sqrt(D); "collapsed": std below it
          (the verdict: the effective rank of a collapsed run's tiny spread can look healthy);
      "effective_rank": exp(H(p)), p_i = s_i / sum_j s_j over the singular values of the
          CENTRED u (Roy & Vetterli 2007; 0 log 0 = 0), so the mean direction every embedding
          shares is not a dimension; in [1, min(N - 1, D)], 1 if all rows coincide (RMS
          distance to their mean < COLLAPSE_RMS_TOL). Raises ValueError for a zero or
          non-finite row or a non-2-D z."""
    u = l2_normalize(z)                                                       # (N, D)
    std = float(np.mean(u.std(axis=0)))
    threshold = COLLAPSE_STD_FRACTION / np.sqrt(u.shape[1])
    verdict = {"std": std, "collapse_std_threshold": float(threshold),
               "collapsed": bool(std < threshold)}
    centred = u - u.mean(axis=0, keepdims=True)                               # (N, D)
    if np.sqrt(np.mean(np.sum(centred**2, axis=1))) < COLLAPSE_RMS_TOL:
        return {**verdict, "effective_rank": 1.0}
    s = np.linalg.svd(centred, compute_uv=False)                              # (min(N, D),)
    # drop singular values that are rounding noise (numpy.linalg.matrix_rank's tolerance)
    s = s[s > s.max() * max(centred.shape) * np.finfo(np.float64).eps]        # (r,)
    p = s / s.sum()                                                           # (r,)
    entropy = -np.sum(p * np.log(p))
    return {**verdict, "effective_rank": float(np.exp(entropy))}


def knn_indices(x, k):
    """Indices of each row's k nearest neighbours by cosine similarity, itself excluded.
    x: (N, D) float; 1 <= k < N. Returns (N, k) int64, nearest first; ties go to the lower
    index (stable sort of -similarity). Raises ValueError for k outside [1, N - 1]."""
    x = _check_matrix(x, "x")                                                 # (N, D)
    n = x.shape[0]
    if not 1 <= k < n:
        raise ValueError(f"k must satisfy 1 <= k < N = {n} (self is excluded), got k = {k}")
    sim = cosine_similarity(x, x)                                             # (N, N)
    np.fill_diagonal(sim, -np.inf)  # a point is never its own neighbour
    order = np.argsort(-sim, axis=1, kind="stable")                          # (N, N)
    return order[:, :k]                                                       # (N, K)


def mutual_knn(A, B, k=MUTUAL_KNN_K):
    """Mutual k-NN alignment (Huh et al. 2024, "The Platonic Representation Hypothesis").
    A: (N, D_a), B: (N, D_b) float; row i of A and of B describe the same photo i (e.g. a
    caption embedding and its DINOv2 image embedding). Each sample's k nearest neighbours by
    cosine similarity are found WITHIN A and WITHIN B (knn_indices). Returns a float in
    [0, 1]: mean_i |knn_A(i) & knn_B(i)| / k (chance ~ k / (N - 1), 0.010 for k = 10, N = 1000).
    Note: the replication's prose describes a cross-modal nearest-neighbour match, which cannot
    be computed between a 256-d and a 768-d space without a map; this within-space definition
    is the one its chance level (0.010) matches.
    Raises ValueError for non-2-D inputs, different N, NaN/Inf, zero rows, or k >= N."""
    A, B = _check_matrix(A, "A"), _check_matrix(B, "B")
    if A.shape[0] != B.shape[0]:
        raise ValueError(f"A and B must have the same number of rows (samples), "
                         f"got {A.shape[0]} and {B.shape[0]}")
    n = A.shape[0]                                          # knn_indices checks 1 <= k < n
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
    """Centre with the TRAIN mean, then L2-normalise rows, before fitting or applying a rotation.
    x: (N, D) float; mean: (D,) the mean of the training rows of the same space (test rows
    too: no test statistics leak into the fit). A rotation cannot move one cloud's mean offset
    (DINOv2's is large) onto the other's; unit rows make the fit match directions, which is
    what cosine ranking uses. Returns (N, D) float64 unit rows. Raises ValueError for a
    wrong-shape mean or a row equal to the mean."""
    x = _check_matrix(x, "x")                                                 # (N, D)
    mean = np.asarray(mean, dtype=np.float64)                                 # (D,)
    if mean.shape != (x.shape[1],):
        raise ValueError(f"mean must have shape ({x.shape[1]},), got {mean.shape}")
    return l2_normalize(x - mean)                                             # (N, D)


def fit_rotation(z_text, img):
    """Orthogonal Procrustes (Schönemann 1966): W = argmin ||z_text W - img||_F s.t. W W^T = I.
    z_text: (N, D) caption embeddings, img: (N, D_img) image embeddings, row i = photo i, both
    from prepare_for_rotation; D <= D_img. With z_text^T img = U S V^T (thin SVD), W = U V^T.
    Returns W: (D, D_img) float64, semi-orthogonal (W W^T = I_D, so z W keeps norms and angles).
    Raises ValueError if D > D_img, the row counts differ, or inputs are not finite 2-D."""
    z_text, img = _check_matrix(z_text, "z_text"), _check_matrix(img, "img")
    if z_text.shape[0] != img.shape[0]:
        raise ValueError(f"z_text and img must have the same number of rows, "
                         f"got {z_text.shape[0]} and {img.shape[0]}")
    if z_text.shape[1] > img.shape[1]:
        raise ValueError(f"need D_text <= D_img for W W^T = I, "
                         f"got {z_text.shape[1]} > {img.shape[1]}")
    # --- exercise 14: Procrustes rotation ---
    m = z_text.T @ img                                                        # (D, D_img)
    u, _, vt = np.linalg.svd(m, full_matrices=False)                          # (D, D), (D, D_img)
    return u @ vt                                                             # (D, D_img)
    # --- end of exercise 14 ---


def fit_procrustes(z_text_train, img_train):
    """Orthogonal Procrustes on the train photos' (caption, image) pairs: each space centred
    with its TRAIN mean and L2-normalised (prepare_for_rotation), then fit_rotation. Fitted
    once, it maps every test set (rotated_recall). z_text_train: (N, D),
    img_train: (N, D_img) float, row i = photo i, D <= D_img. Returns (W (D, D_img), text_mean
    (D,), img_mean (D_img,)), float64, for rotated_recall. Raises ValueError as fit_rotation."""
    text_mean = _check_matrix(z_text_train, "z_text_train").mean(axis=0)     # (D,)
    img_mean = _check_matrix(img_train, "img_train").mean(axis=0)            # (D_img,)
    w = fit_rotation(prepare_for_rotation(z_text_train, text_mean),
                     prepare_for_rotation(img_train, img_mean))               # (D, D_img)
    return w, text_mean, img_mean


def rotated_recall(rotation, z_text_test, img_test, ks=DEFAULT_KS):
    """Caption -> image retrieval through a fitted rotation (fit_procrustes): map test captions
    z W, rank all test images by cosine similarity; the correct image of caption i is image i.
    rotation: (W (D, D_img), text_mean (D,), img_mean (D_img,)); z_text_test: (N, D),
    img_test: (N, D_img) float, each prepared with the TRAIN means.
    Returns {"R@k": float in [0, 1]} for k in ks (chance ~ k / N). Raises ValueError for
    mismatched row counts or widths, and as recall_at_k."""
    w, text_mean, img_mean = rotation
    z_text_test = _check_matrix(z_text_test, "z_text_test")                  # (N_test, D)
    img_test = _check_matrix(img_test, "img_test")                           # (N_test, D_img)
    if z_text_test.shape[0] != img_test.shape[0]:
        raise ValueError(f"z_text_test and img_test must have the same number of rows, "
                         f"got {z_text_test.shape[0]} and {img_test.shape[0]}")
    if (z_text_test.shape[1], img_test.shape[1]) != w.shape:
        raise ValueError(f"test widths {(z_text_test.shape[1], img_test.shape[1])} differ from "
                         f"train widths {w.shape}")
    mapped = prepare_for_rotation(z_text_test, text_mean) @ w                 # (N_test, D_img)
    sim = cosine_similarity(mapped, prepare_for_rotation(img_test, img_mean))  # (N_test, N_test)
    return recall_at_k(sim, ks=ks)
