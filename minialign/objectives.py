"""The three training objectives. Read them side by side: each takes the same batch (B photos,
two different captions each), encodes 2B captions, and differs only in how the pair (or the
target) is built:

    good_views  the pair is two different human captions of one photo
    bad_views   the pair is one caption, its words masked twice independently
    next_token  the target is each caption's next word, read causally; the two captions of a
                photo get only VICReg's anti-collapse terms (variance, covariance)

Shared steps sit on the same lines in the same order; every line that differs from good_views
ends in `# <-`. Signature:
    objective(params, batch, cfg, rng) -> (loss, grads, stats)
batch: data.Batch with tokens_a, tokens_b (B, T) int32; cfg: train.TrainConfig (uses cfg.model,
cfg.mask_rate, the VICReg weights and cfg.anticollapse_weight); rng: numpy Generator (only
bad_views draws from it). The text model never sees anything from images.
"""
import numpy as np

from .losses import cross_entropy, vicreg_loss
from .model import encode, encode_backward, lm_head_backward, lm_head_forward
from .tokenizer import MASK, PAD, SPECIALS


def good_views(params, batch, cfg, rng):
    """Two different human captions of the same photo are the two views -> VICReg."""
    tokens = np.concatenate([batch.tokens_a, batch.tokens_b])            # (2B, T) caption a | b
    B = len(batch.tokens_a)
    z, h, cache = encode(params, tokens, cfg.model, causal=False)         # (2B, D), (n, D)
    loss, (dz_a, dz_b), stats = vicreg_loss(z[:B], z[B:], cfg.sim_weight, cfg.var_weight,
                                            cfg.cov_weight)
    grads = encode_backward(np.concatenate([dz_a, dz_b]), None, cache)
    return loss, grads, stats


def bad_views(params, batch, cfg, rng):
    """One caption per photo, its words masked twice independently, is the pair -> VICReg."""
    tokens = np.concatenate([mask_words(batch.tokens_a, cfg.mask_rate, rng),   # <- (2B, T)
                             mask_words(batch.tokens_a, cfg.mask_rate, rng)])  # <- a masked twice
    B = len(batch.tokens_a)
    z, h, cache = encode(params, tokens, cfg.model, causal=False)         # (2B, D), (n, D)
    loss, (dz_a, dz_b), stats = vicreg_loss(z[:B], z[B:], cfg.sim_weight, cfg.var_weight,
                                            cfg.cov_weight)
    grads = encode_backward(np.concatenate([dz_a, dz_b]), None, cache)
    return loss, grads, stats


def next_token(params, batch, cfg, rng):
    """Each caption predicts its own next word under causal attention (cross-entropy), plus the
    same VICReg variance + covariance terms on the two captions of each photo (no invariance)."""
    tokens = np.concatenate([batch.tokens_a, batch.tokens_b])            # (2B, T) caption a | b
    B = len(batch.tokens_a)
    z, h, cache = encode(params, tokens, cfg.model, causal=True)          # <- (2B, D), (n, D)
    w = cfg.anticollapse_weight                                           # <- no invariance term:
    loss, (dz_a, dz_b), stats = vicreg_loss(z[:B], z[B:], 0.0, w * cfg.var_weight,  # <-
                                            w * cfg.cov_weight)
    dh, ce_loss, ce_stats, dtok_emb = _next_token_head(params["tok_emb"], h, tokens)  # <-
    grads = encode_backward(np.concatenate([dz_a, dz_b]), dh, cache)      # <-
    grads["tok_emb"] += dtok_emb                                          # <- the head is tied
    stats.update(ce_stats, loss=loss + ce_loss, vicreg=loss)
    return loss + ce_loss, grads, stats


def _next_token_head(tok_emb, h, tokens):
    """Cross-entropy of predicting tokens[b, t+1] from the hidden state of tokens[b, t], over the
    real tokens whose next token is real (not padding). tok_emb: (V, D); h: (n, D) packed as
    tokens[tokens != PAD]; tokens: (B, T). Returns dh (n, D), the loss, its stats and the
    head's dtok_emb (V, D)."""
    targets = np.full_like(tokens, PAD)                                   # (B, T)
    targets[:, :-1] = tokens[:, 1:]                                       # next token, PAD at end
    targets = targets[tokens != PAD]                                      # (n,) aligned with h
    has_target = targets != PAD                                           # (n,) all but EOS
    logits, c_head = lm_head_forward(h[has_target], tok_emb)              # (n_t, V)
    loss, dlogits, stats = cross_entropy(logits, targets[has_target])
    dh_real, dtok_emb = lm_head_backward(dlogits, c_head)                 # (n_t, D), (V, D)
    dh = np.zeros_like(h)                                                 # (n, D)
    dh[has_target] = dh_real
    return dh, loss, stats, dtok_emb


def mask_words(tokens, rate, rng):
    """Replace each word (not a special token, not padding) by <mask> with probability `rate`,
    independently, keeping at least one word per caption: if every word of a caption drew
    "mask", its word with the largest draw stays. tokens: (B, T) int; rate in [0, 1).
    Returns a new (B, T) array; `tokens` is not modified."""
    is_word = tokens >= len(SPECIALS)                                     # (B, T)
    u = rng.random(tokens.shape)                                          # (B, T) one draw each
    masked = is_word & (u < rate)                                         # (B, T)
    all_masked = masked.sum(axis=1) == is_word.sum(axis=1)               # (B,)
    keep = np.argmax(np.where(is_word, u, -1.0), axis=1)                  # (B,) the largest draw
    rows = np.flatnonzero(all_masked & is_word.any(axis=1))
    masked[rows, keep[rows]] = False
    return np.where(masked, MASK, tokens).astype(tokens.dtype)


OBJECTIVES = {"good_views": good_views, "bad_views": bad_views, "next_token": next_token}
# The attention each objective trains (and is evaluated) with.
CAUSAL = {"good_views": False, "bad_views": False, "next_token": True}
