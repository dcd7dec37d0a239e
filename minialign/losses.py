"""Losses with their gradients: VICReg on pairs of caption embeddings, cross-entropy on next
tokens. Each returns (loss, gradient of its array inputs, stats dict of floats)."""
import numpy as np

VICREG_VAR_EPS = 1e-4  # floor inside sqrt(var + eps) (Bardes et al. 2022, eq. 1; released code)
VICREG_STD_TARGET = 1.0  # gamma in eq. 1: the per-dimension std the hinge pushes up to


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
    """VICReg (Bardes, Ponce & LeCun 2022, eq. 6) between paired embeddings z_a, z_b (N, D):
        loss = sim_weight * s(Z_a, Z_b) + var_weight * [v(Z_a) + v(Z_b)] / 2
               + cov_weight * [c(Z_a) + c(Z_b)]
    The two variance terms are averaged, as the authors' released code does (the paper sums).
    Returns loss, (dz_a, dz_b) each (N, D), and stats {loss, inv, var, cov}."""
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


def cross_entropy(logits, targets):
    """Softmax cross-entropy mean_i -log softmax(logits_i)[t_i] over the positions that have a
    next token. logits: (n, V); targets: (n,) int. Returns loss, dlogits (n, V) =
    (softmax - onehot) / n, and stats {ce, targets}."""
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
