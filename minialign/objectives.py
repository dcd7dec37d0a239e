"""The three training objectives. Read them side by side: each takes the same batch (B photos,
two different captions each), encodes 2B captions, and differs only in how the pair (or the
target) is built:

    good_views  the pair is two different human captions of one photo
    bad_views   the pair is one caption, its words masked twice independently
    next_token  the target is each caption's next word, read causally; the two captions of a
                photo get only the anti-collapse terms (no invariance)

The anti-collapse term (ObjectiveConfig.anticollapse; pair_loss below) is VICReg's variance +
covariance (the replication's default), or SIGReg (LeJEPA, Balestriero & LeCun 2025) on each
view's embeddings in their place: the view objectives then minimise
    sim_weight * invariance + sigreg_weight * [SIGReg(z_a) + SIGReg(z_b)] / 2
and next_token minimises CE + anticollapse_weight * sigreg_weight * [SIGReg(z_a) + SIGReg(z_b)] / 2,
just as its VICReg version is CE + anticollapse_weight * (var_weight * var + cov_weight * cov).
SIGReg's M random directions are drawn each step from `rng` (one set shared by both views, as
LeJEPA does), after bad_views' masks; under VICReg nothing more is drawn, so VICReg runs are
bit-identical to those before SIGReg existed.

Shared steps sit on the same lines in the same order; every line that differs from good_views
ends in `# <-`. Signature:
    objective(params, batch, cfg, rng) -> (loss, grads, stats)
batch: data.Batch with tokens_a, tokens_b (B, T) int32; cfg: train.TrainConfig, of which an
objective reads cfg.model (ModelConfig) and cfg.loss (ObjectiveConfig, below); rng: numpy
Generator (bad_views' masks, SIGReg's directions). The text model never sees anything from images.
"""
from dataclasses import dataclass

import numpy as np

from .losses import (SIGREG_DIRECTIONS, SIGREG_POINTS, SIGREG_T_MAX, SIGREG_WEIGHT,
                     sigreg_directions, sigreg_loss, vicreg_loss)
from .model import check_fields, encode, encode_backward, layer_set, project, project_backward
from .tokenizer import MASK, PAD, SPECIALS


ANTICOLLAPSE = ("vicreg", "sigreg")  # ObjectiveConfig.anticollapse (flags.py lists them too)
MASK_MODES = ("replace", "drop")     # ObjectiveConfig.mask_mode: a masked word becomes MASK | goes
UNSEEN = ("train", "freeze")         # ObjectiveConfig.unseen_params (unseen_params below)
# next_token's stats key for its weighted anti-collapse term, named after the regulariser;
# "sigreg" itself already holds SIGReg's unweighted statistic (losses.sigreg_loss's stats)
ANTICOLLAPSE_KEY = {"vicreg": "vicreg", "sigreg": "sigreg_loss"}


@dataclass(frozen=True)
class ObjectiveConfig:
    """The objectives' own settings (train.TrainConfig.loss). Defaults = the replicated run."""
    mask_rate: float = 0.25         # bad views: probability that a word becomes <mask>
    sim_weight: float = 25.0        # VICReg lambda (invariance)
    var_weight: float = 25.0        # VICReg mu (variance)
    cov_weight: float = 1.0         # VICReg nu (covariance)
    anticollapse_weight: float = 1.0  # next_token: weight on the anti-collapse terms
    anticollapse: str = "vicreg"    # "vicreg" (var + cov) | "sigreg" (LeJEPA's SIGReg instead)
    sigreg_weight: float = SIGREG_WEIGHT   # SIGReg's weight, 5.26 = LeJEPA's lambda 0.05 (losses)
    sigreg_directions: int = SIGREG_DIRECTIONS  # M random unit directions, drawn every step
    sigreg_t_max: float = SIGREG_T_MAX     # Epps-Pulley integral over t in [-t_max, t_max]
    sigreg_points: int = SIGREG_POINTS     # trapezoid knots on [0, t_max]
    mask_mode: str = "replace"      # bad views: a masked word becomes <mask> | is dropped
    unseen_params: str = "train"    # parameters the loss cannot see: trained | frozen

    def __post_init__(self):
        """Raises ValueError naming the field and its valid range (the same ranges the
        command line's flags.py types enforce)."""
        check_fields(self, choices={"anticollapse": ANTICOLLAPSE, "mask_mode": MASK_MODES,
                                    "unseen_params": UNSEEN},
                     integers={"sigreg_directions": 1, "sigreg_points": 2},
                     numbers={"mask_rate": "in [0, 1)", "sim_weight": ">= 0", "var_weight": ">= 0",
                              "cov_weight": ">= 0", "anticollapse_weight": ">= 0",
                              "sigreg_weight": ">= 0", "sigreg_t_max": "> 0"})


def good_views(params, batch, cfg, rng):
    """Two different human captions of the same photo are the two views -> VICReg (or
    invariance + SIGReg).
    Both views go through ONE encode call as a 2B batch, so the parameters they share get the
    sum of both views' gradients inside encode_backward."""
    tokens = np.concatenate([batch.tokens_a, batch.tokens_b])            # (2B, T) caption a | b
    B = len(batch.tokens_a)
    z, hf, cache = encode(params, tokens, cfg.model, causal=False)        # (2B, D), (n, D)
    y, c_proj = project(params, z, cfg.model)                             # (2B, P): z, or projected
    loss, (dy_a, dy_b), stats = pair_loss(y[:B], y[B:], cfg.loss, rng)
    dz, grads_proj = project_backward(np.concatenate([dy_a, dy_b]), c_proj)
    grads = encode_backward(dz, None, cache)
    grads.update(grads_proj)                                              # {} without a projector
    return loss, grads, stats


def bad_views(params, batch, cfg, rng):
    """One caption per photo, its words masked twice independently, is the pair -> VICReg (or
    invariance + SIGReg)."""
    mask = MASKINGS[cfg.loss.mask_mode]                                   # <- replace or drop
    tokens = np.concatenate([mask(batch.tokens_a, cfg.loss.mask_rate, rng),   # <- (2B, T)
                             mask(batch.tokens_a, cfg.loss.mask_rate, rng)])  # <- a, a
    B = len(batch.tokens_a)
    z, hf, cache = encode(params, tokens, cfg.model, causal=False)        # (2B, D), (n, D)
    y, c_proj = project(params, z, cfg.model)                             # (2B, P): z, or projected
    loss, (dy_a, dy_b), stats = pair_loss(y[:B], y[B:], cfg.loss, rng)
    dz, grads_proj = project_backward(np.concatenate([dy_a, dy_b]), c_proj)
    grads = encode_backward(dz, None, cache)
    grads.update(grads_proj)                                              # {} without a projector
    return loss, grads, stats


def next_token(params, batch, cfg, rng):
    """Each caption predicts its own next word under causal attention (cross-entropy through the
    tied head), plus the same anti-collapse terms (VICReg's variance + covariance, or SIGReg) on
    the two captions of each photo, weighted by anticollapse_weight (no invariance). The head
    reads the token embedding, so tok_emb sums two gradients. The fast set runs the head's
    three calls as one fused pass that never holds all (n_t, V) logits
    (machinery/fastpath/fast.py)."""
    tokens = np.concatenate([batch.tokens_a, batch.tokens_b])            # (2B, T) caption a | b
    B = len(batch.tokens_a)
    z, hf, cache = encode(params, tokens, cfg.model, causal=True)         # <- (2B, D), (n, D)
    y, c_proj = project(params, z, cfg.model)                             # (2B, P): z, or projected
    loss, (dy_a, dy_b), stats = pair_loss(y[:B], y[B:], cfg.loss, rng,  # <- no invariance,
                                          sim_weight=0.0, weight=cfg.loss.anticollapse_weight)  # <-
    targets, has_target = next_token_targets(tokens)                      # <- (n,), (n,) as hf
    ops = layer_set(cfg.model)                                            # <- encode's layer set
    logits, c_head = ops.lm_head_forward(hf[has_target], params["tok_emb"])  # <- (n_t, V) tied
    ce_loss, dlogits, ce_stats = ops.cross_entropy(logits, targets[has_target])  # <- (n_t, V)
    dh_real, dtok_emb = ops.lm_head_backward(dlogits, c_head)             # <- (n_t, D), (V, D)
    dhf = np.zeros_like(hf)                                               # <- (n, D): no target,
    dhf[has_target] = dh_real                                             # <- no gradient
    dz, grads_proj = project_backward(np.concatenate([dy_a, dy_b]), c_proj)
    grads = encode_backward(dz, dhf, cache)                               # <-
    grads.update(grads_proj)                                              # {} without a projector
    grads["tok_emb"] += dtok_emb                                          # <- the head is tied
    stats.update(ce_stats, loss=loss + ce_loss)                           # <-
    stats[ANTICOLLAPSE_KEY[cfg.loss.anticollapse]] = loss                 # <- its weighted term
    return loss + ce_loss, grads, stats                                   # <-


def pair_loss(z_a, z_b, cfg, rng, sim_weight=None, weight=1.0):
    """The loss on the two views' embeddings z_a, z_b (B, D), per cfg.anticollapse (cfg: an
    ObjectiveConfig): "vicreg" -> losses.vicreg_loss with weights (sim_weight, weight *
    var_weight, weight * cov_weight); "sigreg" -> losses.sigreg_loss with (sim_weight, weight *
    sigreg_weight) on cfg.sigreg_directions directions drawn from rng here, in z's dtype.
    sim_weight: None = cfg.sim_weight (next_token passes 0.0).
    Returns (loss, (dz_a, dz_b), stats) as the loss returns them."""
    sim_weight = cfg.sim_weight if sim_weight is None else sim_weight
    if cfg.anticollapse == "vicreg":
        return vicreg_loss(z_a, z_b, sim_weight, weight * cfg.var_weight, weight * cfg.cov_weight)
    directions = sigreg_directions(z_a.shape[1], cfg.sigreg_directions, rng, z_a.dtype)  # (D, M)
    return sigreg_loss(z_a, z_b, directions, sim_weight, weight * cfg.sigreg_weight,
                       cfg.sigreg_t_max, cfg.sigreg_points)


def next_token_targets(tokens):
    """What each real token predicts: the token after it in its caption. tokens: (B, T) int.
    Returns targets (n,) aligned with the packed rows tokens[tokens != PAD] (PAD after a
    caption's last token) and has_target (n,) bool, True for every real token but EOS."""
    # --- exercise 11: next-token targets ---
    targets = np.full_like(tokens, PAD)                                   # (B, T)
    targets[:, :-1] = tokens[:, 1:]                                       # next token, PAD at end
    targets = targets[tokens != PAD]                                      # (n,) aligned with hf
    return targets, targets != PAD                                        # (n,), (n,)
    # --- end of exercise 11 ---


def mask_words(tokens, rate, rng):
    """Replace each word (not a special token, not padding) by <mask> with probability `rate`,
    independently, keeping at least one word per caption: if every word of a caption drew
    "mask", its word with the largest draw stays. tokens: (B, T) int; rate in [0, 1).
    Returns a new (B, T) array; `tokens` is not modified."""
    # --- exercise 10: masking words ---
    is_word = tokens >= len(SPECIALS)                                     # (B, T)
    u = rng.random(tokens.shape)                                          # (B, T) one draw each
    masked = is_word & (u < rate)                                         # (B, T)
    all_masked = masked.sum(axis=1) == is_word.sum(axis=1)               # (B,)
    keep = np.argmax(np.where(is_word, u, -1.0), axis=1)                  # (B,) the largest draw
    rows = np.flatnonzero(all_masked & is_word.any(axis=1))
    masked[rows, keep[rows]] = False
    return np.where(masked, MASK, tokens).astype(tokens.dtype)
    # --- end of exercise 10 ---


def drop_words(tokens, rate, rng):
    """bad_views with mask_mode "drop": the words mask_words would mask (the same draws from
    rng) are removed instead, and each caption's remaining tokens move left to close the gaps
    (PAD after them; a caption keeps at least one word, as in mask_words). The positions the
    encoder reads are then those of the shorter caption. tokens: (B, T) int.
    Returns a new (B, T) array; `tokens` is not modified."""
    dropped = mask_words(tokens, rate, rng) != tokens                     # (B, T) masked words
    keep = (tokens != PAD) & ~dropped                                     # (B, T)
    order = np.argsort(~keep, axis=1, kind="stable")                      # kept first, in order
    packed = np.take_along_axis(tokens, order, axis=1)                    # (B, T)
    return np.where(np.arange(tokens.shape[1]) < keep.sum(axis=1, keepdims=True), packed,
                    PAD).astype(tokens.dtype)


def unseen_params(cfg):
    """The parameters whose true gradient under cfg (a train.TrainConfig) is exactly zero: the
    one that shifts every row of VICReg's input by one vector, which changes neither the
    invariance nor the centred variance and covariance. Under VICReg (anticollapse "vicreg")
    that is projector.b_out with a projector (every objective: next_token's cross-entropy
    does not read it), else ln_f.beta under VICReg alone (good_views, bad_views; next_token's
    cross-entropy reads ln_f.beta). What such a parameter receives is rounding noise, which
    AdamW turns into lr-sized steps; cfg.loss.unseen_params = "freeze" gives it its true
    gradient, 0 (train.train_step). SIGReg reads the mean: none. Returns a tuple of names."""
    if cfg.loss.anticollapse != "vicreg":
        return ()
    if cfg.model.projector_dim:
        return ("projector.b_out",)
    return ("ln_f.beta",) if cfg.objective in ("good_views", "bad_views") else ()


MASKINGS = {"replace": mask_words, "drop": drop_words}   # ObjectiveConfig.mask_mode
OBJECTIVES = {"good_views": good_views, "bad_views": bad_views, "next_token": next_token}
# The attention each objective trains (and is evaluated) with.
CAUSAL = {"good_views": False, "bad_views": False, "next_token": True}
