"""Losses with their gradients: VICReg or invariance + SIGReg on pairs of caption embeddings,
cross-entropy on next tokens. Each returns (loss, gradient of its array inputs, stats dict of
floats)."""
import numpy as np

VICREG_VAR_EPS = 1e-4  # floor inside sqrt(var + eps) (Bardes et al. 2022, eq. 1; released code)
VICREG_STD_TARGET = 1.0  # gamma in eq. 1: the per-dimension std the hinge pushes up to
# SIGReg (Balestriero & LeCun 2025, LeJEPA, arXiv 2511.08544). Defaults of ObjectiveConfig.
SIGREG_DIRECTIONS = 256  # M unit directions per step (paper's Algorithm 1, authors' MINIMAL.md)
SIGREG_T_MAX = 3.0       # integrate t over [-3, 3] (authors' code, lejepa EppsPulley t_max=3;
                         # the paper's Algorithm 1 uses [-5, 5]; its Table 1a: same accuracy)
SIGREG_POINTS = 17       # trapezoid knots on [0, t_max] (authors' code; 33 on [-t_max, t_max])
# LeJEPA's loss (eq. 9) is (1 - lam) * pred + lam * mean_v SIGReg(z_v), lam = 0.05 recommended
# (Sec. 6.1). For two views pred = mean((z_a - z_b)^2) / 4 = inv / 4, so with our invariance
# weight sim_weight = 25 the same balance is sigreg_weight = 25 * 4 * lam / (1 - lam) = 5.26.
SIGREG_WEIGHT = 25.0 * 4 * 0.05 / (1 - 0.05)


def _variance_term(z):
    """v(Z) = mean_j relu(1 - sqrt(Var(z_j) + eps)), unbiased (N-1) variance (VICReg eq. 1).
    z: (N, D). Returns v and dv/dz (N, D)."""
    # --- exercise 6: VICReg variance term ---
    N, D = z.shape
    zc = z - z.mean(axis=0)                                               # (N, D)
    std = np.sqrt((zc * zc).sum(axis=0) / (N - 1) + VICREG_VAR_EPS)       # (D,)
    hinge = VICREG_STD_TARGET - std                                       # (D,)
    v = np.maximum(hinge, 0.0).mean()
    # d std_j / d z_ij = zc_ij / ((N-1) std_j); the mean over rows of zc is 0, so no centring term
    dstd = -(hinge > 0).astype(z.dtype) / D                                              # (D,)
    dz = zc * (dstd / ((N - 1) * std))                                    # (N, D)
    return v, dz
    # --- end of exercise 6 ---


def _covariance_term(z):
    """c(Z) = sum_{j != k} C_jk^2 / D with C = zc^T zc / (N-1) (VICReg eq. 3-4).
    z: (N, D). Returns c and dc/dz (N, D)."""
    # --- exercise 7: VICReg covariance term ---
    N, D = z.shape
    zc = z - z.mean(axis=0)                                               # (N, D)
    C = zc.T @ zc / (N - 1)                                               # (D, D)
    off = C - np.diag(np.diag(C))                                         # (D, D) zero diagonal
    c = (off * off).sum() / D
    # dc/dC = 2 off / D, and C is quadratic in zc: dc/dzc = zc (dC + dC^T) / (N-1).
    # The rows of zc @ off average to 0 (zc is centred), so centring adds no term.
    dz = zc @ off * (4.0 / (D * (N - 1)))                                 # (N, D)
    return c, dz
    # --- end of exercise 7 ---


def _invariance_term(z_a, z_b):
    """s(Z_a, Z_b) = mean over the N rows and D dimensions of (z_a - z_b)^2 (VICReg eq. 5 / D).
    z_a, z_b: (N, D). Returns s and ds/dz_a (N, D); ds/dz_b is its negative."""
    N, D = z_a.shape
    diff = z_a - z_b                                                      # (N, D)
    return (diff * diff).mean(), diff * (2.0 / (N * D))                   # (N, D) ds/dz_a


def vicreg_loss(z_a, z_b, sim_weight=25.0, var_weight=25.0, cov_weight=1.0):
    """VICReg (Bardes, Ponce & LeCun 2022, eq. 6) between two batches of paired embeddings:
        loss = sim_weight * s(Z_a, Z_b) + var_weight * [v(Z_a) + v(Z_b)] / 2
               + cov_weight * [c(Z_a) + c(Z_b)]
    s = mean over the N rows and D dimensions of (z_a - z_b)^2 (eq. 5 divided by D);
    v = mean_j relu(1 - sqrt(Var(z_j) + 1e-4)), unbiased variance (eq. 1);
    c = sum of squared off-diagonal entries of the (N-1) covariance, divided by D (eq. 4).
    The paper's eq. 6 sums the two variance terms; we average them, as the authors' released
    code does (facebookresearch/vicreg main_vicreg.py), so with the published weights 25/25/1
    the variance hinge has the same strength as in every released VICReg run.
    Weights: sim_weight = lambda, var_weight = mu, cov_weight = nu in the paper.
    z_a, z_b: (N, D) float, row i of each is one pair; N >= 2.
    Returns loss (float), (dz_a, dz_b) each (N, D), and stats {loss, inv, var, cov}."""
    assert z_a.shape == z_b.shape and z_a.ndim == 2, (z_a.shape, z_b.shape)
    N, D = z_a.shape
    if N < 2:
        raise ValueError(f"VICReg needs at least 2 pairs for a variance, got N={N}")
    inv, dinv = _invariance_term(z_a, z_b)                                # dinv: d inv / d z_a
    var_a, dvar_a = _variance_term(z_a)
    var_b, dvar_b = _variance_term(z_b)
    cov_a, dcov_a = _covariance_term(z_a)
    cov_b, dcov_b = _covariance_term(z_b)
    var, cov = (var_a + var_b) / 2, cov_a + cov_b
    loss = sim_weight * inv + var_weight * var + cov_weight * cov
    dz_a = sim_weight * dinv + (var_weight / 2) * dvar_a + cov_weight * dcov_a  # (N, D)
    dz_b = -sim_weight * dinv + (var_weight / 2) * dvar_b + cov_weight * dcov_b  # (N, D)
    stats = {"loss": float(loss), "inv": float(inv), "var": float(var), "cov": float(cov)}
    return float(loss), (dz_a, dz_b), stats


def sigreg_directions(D, M, rng, dtype=np.float64):
    """M random unit directions of R^D, uniform on the sphere: Gaussian columns divided by their
    norms (LeJEPA Algorithm 1). rng: numpy Generator (one (D, M) standard-normal draw).
    Returns (D, M) of dtype, every column of norm 1."""
    A = rng.standard_normal((D, M))                                       # (D, M)
    return (A / np.linalg.norm(A, axis=0)).astype(dtype)                  # (D, M) unit columns


def sigreg(z, directions, t_max=SIGREG_T_MAX, n_points=SIGREG_POINTS):
    """SIGReg: the Epps-Pulley statistic of each 1-D projection x = z @ a against N(0, 1),
    averaged over the M directions a (LeJEPA, Balestriero & LeCun 2025, eq. 5 and Algorithm 1):
        EP(a) = N * integral_{-t_max}^{t_max} |phi_N(t) - phi(t)|^2 w(t) dt
        phi_N(t) = mean_n exp(i t x_n),  phi(t) = w(t) = exp(-t^2 / 2),   SIGReg = mean_a EP(a)
    |phi_N - phi|^2 = (mean_n cos(t x_n) - phi(t))^2 + (mean_n sin(t x_n))^2 is even in t, so
    the integral is twice the one over [0, t_max]: the trapezoid rule on n_points equally spaced
    knots t_k there, weights dt at the ends and 2 dt inside (authors' code; the paper's Algorithm
    1 runs the trapezoid over [-5, 5] with 17 knots, same rule, coarser). Normalisation: times N,
    the standard Epps-Pulley scaling (paper and code): for x_n i.i.d. N(0, 1) its expectation is
    integral w(t) (1 - exp(-t^2)) dt (paper Thm 6), 1.05 on [-3, 3], whatever N, while a fixed
    departure from N(0, 1) grows like N. Like the paper and the authors' code (not like Epps and
    Pulley's 1983 test) the projections are NOT centred or standardised: mean 0 and variance 1
    are part of the target, which is what stops collapse. The weight w(t) = exp(-t^2/2) is the
    one of the paper's Algorithm 1 and the code (the paper's text writes exp(-t^2 / sigma^2)).
    z: (N, D) float, N >= 1; directions: (D, M) unit columns (sigreg_directions), same dtype;
    t_max > 0; n_points >= 2. Returns SIGReg (float), dSIGReg/dz (N, D) and EP (M,) per direction.
    Raises ValueError for N = 0, n_points < 2, t_max <= 0, mismatched shapes or dtypes."""
    N, D = z.shape
    if N < 1 or directions.ndim != 2 or directions.shape[0] != D:
        raise ValueError(f"SIGReg needs z (N >= 1, D) and directions (D, M), got {z.shape} and "
                         f"{directions.shape}")
    if directions.dtype != z.dtype:
        raise ValueError(f"SIGReg: directions are {directions.dtype}, z is {z.dtype}; draw them "
                         f"in z's dtype (sigreg_directions(..., dtype=z.dtype))")
    if n_points < 2 or not t_max > 0:
        raise ValueError(f"SIGReg quadrature needs n_points >= 2 and t_max > 0, got "
                         f"{n_points} and {t_max}")
    M = directions.shape[1]
    t = np.linspace(0.0, t_max, n_points).astype(z.dtype)                 # (P,) knots on [0, t_max]
    dt = t_max / (n_points - 1)
    quad = np.full(n_points, 2 * dt, dtype=z.dtype)                       # (P,) trapezoid, folded:
    quad[[0, -1]] = dt                                                    # ends once, inside twice
    phi = np.exp(-t * t / 2)                                              # (P,) N(0, 1)'s CF
    w = quad * phi                                                        # (P,) quadrature x window
    x = z @ directions                                                    # (N, M) projections
    xt = x[:, :, None] * t                                                # (N, M, P)
    cos, sin = np.cos(xt), np.sin(xt)                                     # (N, M, P)
    re = cos.mean(axis=0) - phi                                           # (M, P) Re(phi_N - phi)
    im = sin.mean(axis=0)                                                 # (M, P) Im(phi_N)
    ep = N * ((re * re + im * im) @ w)                                    # (M,) EP per direction
    # d EP_m / d x_nm = N sum_k w_k (2 re_mk d cos / N + 2 im_mk d sin / N), d cos = -t sin,
    # d sin = t cos: N cancels, and the mean over the M directions divides by M
    dx = (im[None] * cos - re[None] * sin) @ (w * t) * (2.0 / M)          # (N, M)
    dz = dx @ directions.T                                                # (N, D)
    return float(ep.mean()), dz, ep


def sigreg_loss(z_a, z_b, directions, sim_weight=25.0, sigreg_weight=SIGREG_WEIGHT,
                t_max=SIGREG_T_MAX, n_points=SIGREG_POINTS):
    """VICReg's invariance term plus SIGReg on each view (LeJEPA eq. 9 with V = 2 views, in
    VICReg's scale; SIGREG_WEIGHT above says how lambda maps to the two weights):
        loss = sim_weight * s(Z_a, Z_b) + sigreg_weight * [SIGReg(Z_a) + SIGReg(Z_b)] / 2
    s = mean over the N rows and D dimensions of (z_a - z_b)^2 (as in vicreg_loss); SIGReg: see
    sigreg(), both views projected on the same directions (LeJEPA draws one set per step).
    z_a, z_b: (N, D) float, row i of each is one pair; directions: (D, M) unit columns.
    Returns loss (float), (dz_a, dz_b) each (N, D), and stats {loss, inv, sigreg}."""
    assert z_a.shape == z_b.shape and z_a.ndim == 2, (z_a.shape, z_b.shape)
    inv, dinv = _invariance_term(z_a, z_b)                                # dinv: d inv / d z_a
    sig_a, dsig_a, _ = sigreg(z_a, directions, t_max, n_points)
    sig_b, dsig_b, _ = sigreg(z_b, directions, t_max, n_points)
    sig = (sig_a + sig_b) / 2
    loss = sim_weight * inv + sigreg_weight * sig
    dz_a = sim_weight * dinv + (sigreg_weight / 2) * dsig_a               # (N, D)
    dz_b = -sim_weight * dinv + (sigreg_weight / 2) * dsig_b              # (N, D)
    stats = {"loss": float(loss), "inv": float(inv), "sigreg": float(sig)}
    return float(loss), (dz_a, dz_b), stats


def cross_entropy(logits, targets):
    """Softmax cross-entropy averaged over the given targets: mean_i -log softmax(logits_i)[t_i].
    The caller passes only positions that have a real next token (no padding), so the mean is
    over non-padding targets. logits: (n, V) float; targets: (n,) int in [0, V).
    Returns loss (float), dlogits (n, V) = (softmax - onehot) / n, and stats {ce, targets (= n)}."""
    n, V = logits.shape
    assert targets.shape == (n,), (targets.shape, n)
    if n == 0:
        raise ValueError("cross_entropy over zero targets")
    # --- exercise 8: cross-entropy ---
    rows = np.arange(n)
    # subtract the row max before exp: same softmax, no overflow
    shifted = logits - logits.max(axis=1, keepdims=True)                 # (n, V)
    probs = np.exp(shifted)                                               # (n, V) unnormalised
    total = probs.sum(axis=1, keepdims=True)                              # (n, 1)
    nll = np.log(total[:, 0]) - shifted[rows, targets]                    # (n,)
    loss = float(nll.astype(np.float64).mean())
    probs /= total
    dlogits = probs                                                       # (n, V) softmax
    dlogits[rows, targets] -= 1.0
    dlogits /= n
    return loss, dlogits, {"ce": loss, "targets": n}
    # --- end of exercise 8 ---
