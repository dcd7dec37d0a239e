"""The three training objectives, side by side. Each takes the same batch (B photos, two
different captions each), encodes 2B captions and differs only in how the pair (or the target)
is built; every line that differs from good_views ends in `# <-`.

    objective(params, batch, cfg, rng) -> (loss, grads, stats)

batch: data.Batch (tokens_a, tokens_b (B, T) int32); cfg: train.TrainConfig (cfg.model, cfg.loss);
rng: numpy Generator (bad_views' masks). The text model never sees anything from images.
"""
from dataclasses import dataclass

import numpy as np

from .losses import vicreg_loss
from .model import encode, encode_backward, layer_set
from .tokenizer import MASK, PAD, SPECIALS


@dataclass(frozen=True)
class ObjectiveConfig:
    """The objectives' settings (TrainConfig.loss). Defaults: the replicated run."""
    mask_rate: float = 0.25         # bad views: probability that a word becomes <mask>
    sim_weight: float = 25.0        # VICReg lambda (invariance)
    var_weight: float = 25.0        # VICReg mu (variance)
    cov_weight: float = 1.0         # VICReg nu (covariance)
    anticollapse_weight: float = 1.0  # next_token: weight on variance + covariance


def good_views(params, batch, cfg, rng):
    tokens = np.concatenate([batch.tokens_a, batch.tokens_b])            # (2B, T) caption a | b
    B = len(batch.tokens_a)
    z, hf, cache = encode(params, tokens, cfg.model, causal=False)        # (2B, D), (n, D)
    loss, (dz_a, dz_b), stats = vicreg_loss(z[:B], z[B:], cfg.loss.sim_weight,
                                            cfg.loss.var_weight, cfg.loss.cov_weight)
    grads = encode_backward(np.concatenate([dz_a, dz_b]), None, cache)
    return loss, grads, stats


def bad_views(params, batch, cfg, rng):
    tokens = np.concatenate([mask_words(batch.tokens_a, cfg.loss.mask_rate, rng),   # <- (2B, T)
                             mask_words(batch.tokens_a, cfg.loss.mask_rate, rng)])  # <- a, a
    B = len(batch.tokens_a)
    z, hf, cache = encode(params, tokens, cfg.model, causal=False)        # (2B, D), (n, D)
    loss, (dz_a, dz_b), stats = vicreg_loss(z[:B], z[B:], cfg.loss.sim_weight,
                                            cfg.loss.var_weight, cfg.loss.cov_weight)
    grads = encode_backward(np.concatenate([dz_a, dz_b]), None, cache)
    return loss, grads, stats


def next_token(params, batch, cfg, rng):
    tokens = np.concatenate([batch.tokens_a, batch.tokens_b])            # (2B, T) caption a | b
    B = len(batch.tokens_a)
    z, hf, cache = encode(params, tokens, cfg.model, causal=True)         # <- (2B, D), (n, D)
    w = cfg.loss.anticollapse_weight                                      # <- no invariance
    loss, (dz_a, dz_b), stats = vicreg_loss(z[:B], z[B:], 0.0,            # <-
                                            w * cfg.loss.var_weight, w * cfg.loss.cov_weight)
    targets, has_target = next_token_targets(tokens)                      # <- (n,), (n,) as hf
    L = layer_set(cfg.model)                                              # <- encode's layer set
    logits, c_head = L.lm_head_forward(hf[has_target], params["tok_emb"])  # <- (n_t, V) tied
    ce_loss, dlogits, ce_stats = L.cross_entropy(logits, targets[has_target])  # <- (n_t, V)
    dh_real, dtok_emb = L.lm_head_backward(dlogits, c_head)               # <- (n_t, D), (V, D)
    dhf = np.zeros_like(hf)                                               # <- (n, D): no target,
    dhf[has_target] = dh_real                                             # <- no gradient
    grads = encode_backward(np.concatenate([dz_a, dz_b]), dhf, cache)     # <-
    grads["tok_emb"] += dtok_emb                                          # <- the head is tied
    stats.update(ce_stats, vicreg=loss, loss=loss + ce_loss)              # <-
    return loss + ce_loss, grads, stats                                   # <-


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


# Named variants (machinery/variants.py) add themselves to both when imported.
OBJECTIVES = {"good_views": good_views, "bad_views": bad_views, "next_token": next_token}
CAUSAL = {"good_views": False, "bad_views": False, "next_token": True}   # attention trained with
