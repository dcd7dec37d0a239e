"""Named variants beyond the replication, each an objective beside the three, registered in
objectives.OBJECTIVES on import (`--objective good_views_sigreg`):
    *_sigreg        LeJEPA's SIGReg (Balestriero & LeCun 2025) for VICReg's variance + covariance
    *_projector     VICReg's expander (4 D wide) between encoder and loss; metrics read the z
    next_token_last z is the last real token's state instead of the mean over the caption
    bad_views_drop  masked words removed (not replaced by <mask>): views differ in length too"""
import numpy as np

from ..losses import _invariance_term, vicreg_loss
from ..model import INIT_STD, encode, encode_backward, layer_set
from ..objectives import CAUSAL, OBJECTIVES, mask_words, next_token_targets
from ..tokenizer import PAD

SIGREG_DIRECTIONS = 256  # M random unit directions, drawn every step
SIGREG_T_MAX = 3.0       # the Epps-Pulley integral over t in [-3, 3] (the authors' code)
SIGREG_POINTS = 17       # trapezoid knots on [0, t_max]
# LeJEPA's loss is (1 - lam) pred + lam SIGReg, lam = 0.05; two views' pred = invariance / 4,
# so beside VICReg's sim_weight 25 the same balance is 25 * 4 * lam / (1 - lam) = 5.26.
SIGREG_WEIGHT = 25.0 * 4 * 0.05 / (1 - 0.05)
PROJECTOR_RATIO = 4      # the projector's width P = 4 D


def sigreg(z, directions, t_max=SIGREG_T_MAX, n_points=SIGREG_POINTS):
    """SIGReg (LeJEPA eq. 5): the mean over M directions a of the Epps-Pulley statistic of x = z a,
        EP(a) = N integral_{-t_max}^{t_max} |phi_N(t) - phi(t)|^2 w(t) dt, phi(t) = w(t) =
        exp(-t^2 / 2), phi_N(t) = mean_n exp(i t x_n): twice the trapezoid rule on [0, t_max].
    Not centred or scaled: mean 0 and variance 1 are part of the target (it stops collapse).
    z: (N, D); directions: (D, M) unit columns. Returns SIGReg, dSIGReg/dz (N, D)."""
    N, M = len(z), directions.shape[1]
    t, dt = np.linspace(0.0, t_max, n_points).astype(z.dtype), t_max / (n_points - 1)  # (P,)
    quad = np.full(n_points, 2 * dt, dtype=z.dtype)                       # trapezoid, folded:
    quad[[0, -1]] = dt                                                    # ends once, inside twice
    phi = np.exp(-t * t / 2)                                              # (P,)
    w = quad * phi                                                        # (P,)
    xt = (z @ directions)[:, :, None] * t                                 # (N, M, P)
    cos, sin = np.cos(xt), np.sin(xt)
    re, im = cos.mean(axis=0) - phi, sin.mean(axis=0)                     # (M, P), (M, P)
    ep = N * ((re * re + im * im) @ w)                                    # (M,)
    # d EP / d x_n = sum_k w_k 2 (re_k (-t_k sin) + im_k t_k cos); the mean over M divides by M
    dx = (im[None] * cos - re[None] * sin) @ (w * t) * (2.0 / M)          # (N, M)
    return float(ep.mean()), dx @ directions.T                            # (N, D)


def sigreg_loss(z_a, z_b, rng, sim_weight, weight=1.0):
    """sim_weight * invariance + weight * SIGREG_WEIGHT * [SIGReg(z_a) + SIGReg(z_b)] / 2, both
    views on one set of directions drawn from rng. Returns (loss, (dz_a, dz_b), stats)."""
    A = rng.standard_normal((z_a.shape[1], SIGREG_DIRECTIONS))            # (D, M)
    directions = (A / np.linalg.norm(A, axis=0)).astype(z_a.dtype)
    inv, dinv = _invariance_term(z_a, z_b)
    (s_a, ds_a), (s_b, ds_b) = sigreg(z_a, directions), sigreg(z_b, directions)
    c = weight * SIGREG_WEIGHT
    loss = sim_weight * inv + c * (s_a + s_b) / 2
    stats = {"loss": float(loss), "inv": float(inv), "sigreg": (s_a + s_b) / 2}
    return float(loss), (sim_weight * dinv + c / 2 * ds_a, -sim_weight * dinv + c / 2 * ds_b), stats


def drop_words(tokens, rate, rng):
    """mask_words's words (the same draws) removed, the rest moved left. tokens: (B, T) int."""
    keep = (tokens != PAD) & (mask_words(tokens, rate, rng) == tokens)    # (B, T)
    packed = np.take_along_axis(tokens, np.argsort(~keep, axis=1, kind="stable"), 1)  # kept first
    return np.where(np.arange(tokens.shape[1]) < keep.sum(axis=1, keepdims=True), packed,
                    PAD).astype(tokens.dtype)


def projector_init(model, rng):
    """VICReg's expander y = linear(gelu(layernorm(linear(z)))), (N, D) -> (N, P); LN for BN."""
    D, P, dtype = model.d_model, PROJECTOR_RATIO * model.d_model, np.dtype(model.dtype)
    normal = lambda *shape: (INIT_STD * rng.standard_normal(shape)).astype(dtype)
    return {"projector.w_in": normal(D, P), "projector.b_in": np.zeros(P, dtype),
            "projector.gamma": np.ones(P, dtype), "projector.beta": np.zeros(P, dtype),
            "projector.w_out": normal(P, P), "projector.b_out": np.zeros(P, dtype)}


def project(params, z, model):
    L = layer_set(model)
    u, c_in = L.linear_forward(z, params["projector.w_in"], params["projector.b_in"])
    u, c_ln = L.layernorm_forward(u, params["projector.gamma"], params["projector.beta"])
    u, c_gelu = L.gelu_forward(u)
    y, c_out = L.linear_forward(u, params["projector.w_out"], params["projector.b_out"])
    return y, (L, c_in, c_ln, c_gelu, c_out)


def project_backward(dy, cache):
    L, c_in, c_ln, c_gelu, c_out = cache
    g = {}
    du, g["projector.w_out"], g["projector.b_out"] = L.linear_backward(dy, c_out)   # y = linear
    du = L.gelu_backward(du, c_gelu)                                                 # u = gelu(u)
    du, g["projector.gamma"], g["projector.beta"] = L.layernorm_backward(du, c_ln)   # layernorm
    dz, g["projector.w_in"], g["projector.b_in"] = L.linear_backward(du, c_in)       # linear(z)
    return dz, g


def encode_last(params, tokens, model, causal):
    """model.encode with z = each caption's last real token's hf (next_token_last)."""
    z, hf, cache = encode(params, tokens, model, causal)
    return hf[np.cumsum((tokens != PAD).sum(axis=1)) - 1], hf, cache


def variant(pair="views", loss="vicreg", projector=False, pool="mean"):
    """An objective of the three's shape: pair "views" (caption a | b), "masked" (a masked
    twice), "dropped" (a with words dropped twice) or "next" (a | b, causal, + next-token CE)."""
    def objective(params, batch, cfg, rng):
        a, b, rate = batch.tokens_a, batch.tokens_b, cfg.loss.mask_rate
        views = {"masked": mask_words, "dropped": drop_words}.get(pair)  # a changed twice
        tokens = np.concatenate([views(a, rate, rng), views(a, rate, rng)] if views else [a, b])
        B, causal = len(a), pair == "next"
        z, hf, cache = objective.encode(params, tokens, cfg.model, causal)  # (2B, D), (n, D)
        y, c_proj = project(params, z, cfg.model) if projector else (z, None)
        w, sim = (cfg.loss.anticollapse_weight, 0.0) if causal else (1.0, cfg.loss.sim_weight)
        out, dys, stats = (vicreg_loss(y[:B], y[B:], sim, w * cfg.loss.var_weight,
                                       w * cfg.loss.cov_weight) if loss == "vicreg"
                           else sigreg_loss(y[:B], y[B:], rng, sim, w))
        dz = np.concatenate(dys)
        dz, grads_proj = project_backward(dz, c_proj) if projector else (dz, {})
        dhf = np.zeros_like(hf) if causal or pool == "last" else None
        if pool == "last":
            dhf[np.cumsum((tokens != PAD).sum(axis=1)) - 1] += dz         # z = hf[last]
            dz = np.zeros_like(dz)
        if causal:
            targets, has = next_token_targets(tokens)
            L = layer_set(cfg.model)
            logits, c_head = L.lm_head_forward(hf[has], params["tok_emb"])
            ce, dlogits, ce_stats = L.cross_entropy(logits, targets[has])
            dh, dtok_emb = L.lm_head_backward(dlogits, c_head)
            dhf[has] += dh
            stats.update(ce_stats, anticollapse=out, loss=out + ce)
            out += ce
        grads = {**encode_backward(dz, dhf, cache), **grads_proj}
        if causal:
            grads["tok_emb"] += dtok_emb
        return out, grads, stats
    objective.encode = encode_last if pool == "last" else encode
    objective.init = projector_init if projector else lambda model, rng: {}
    return objective


VARIANTS = {
    "good_views_sigreg": variant("views", loss="sigreg"),
    "bad_views_sigreg": variant("masked", loss="sigreg"),
    "next_token_sigreg": variant("next", loss="sigreg"),
    "good_views_projector": variant("views", projector=True),
    "bad_views_projector": variant("masked", projector=True),
    "next_token_projector": variant("next", projector=True),
    "next_token_last": variant("next", pool="last"),
    "bad_views_drop": variant("dropped"),
}
OBJECTIVES.update(VARIANTS)
CAUSAL.update({name: name.startswith("next_token") for name in VARIANTS})
