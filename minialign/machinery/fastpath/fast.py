"""The fast layer set: layers.py's names and signatures, run by the fast path (fast_layers.py,
fast_rows.py, rows.py). ModelConfig.layers = "fast" (the default) makes model.encode and
objectives.next_token call these instead of layers.py's; tests/test_fast.py checks that a whole
step's loss and gradients agree with the reference set (float64 ~1e-10, float32 ~1e-4).

What differs from layers.py, beyond each function's own speed-ups:
  token_rows     fast_layers.packed_layout: captions sorted by length, so each attention group
                 (captions of one length) and each caption is one contiguous slice of rows;
                 caption_rows puts the rows back in the order of tokens[tokens != PAD].
  attention_*    per group of one length (no padding, no T^2 work on it), not on a (B, T) grid.
  pool_*         a segment mean per group, not a (B, n) matrix product.
  the head       lm_head_forward -> cross_entropy -> lm_head_backward, the three calls of
                 next_token, run as ONE fused pass (fast_layers.tied_head_cross_entropy_fast)
                 that never holds the (n, V) logits (150 MB at the default batch):
                 lm_head_forward returns what the logits are made of (TiedLogits), cross_entropy
                 runs the fused pass on it and returns the products lm_head_backward needs
                 (TiedGradients), which lm_head_backward hands back. The same bits as the three
                 calls on real arrays (tests/test_fast_layers.py).
"""
from typing import NamedTuple

import numpy as np

from ...layers import last_pool_backward, last_token_rows   # a gather: layers.py's own
from .fast_layers import (cross_entropy_fast, mean_pool_backward_fast, mean_pool_forward_fast,
                          mha_backward_fast, mha_forward_fast, packed_layout,
                          tied_head_cross_entropy_fast)
from .fast_rows import (embedding_backward_rows, embedding_forward_rows, gelu_backward_fast,
                        gelu_forward_fast, layernorm_backward_rows, layernorm_forward_rows,
                        linear_backward_rows, linear_forward_rows)
from .rows import matmul_rows, matmul_tn_rows

# the per-token layers: the same arguments, the rows in blocks over the cores
embedding_forward, embedding_backward = embedding_forward_rows, embedding_backward_rows
layernorm_forward, layernorm_backward = layernorm_forward_rows, layernorm_backward_rows
linear_forward, linear_backward = linear_forward_rows, linear_backward_rows
gelu_forward, gelu_backward = gelu_forward_fast, gelu_backward_fast


def token_rows(mask, causal, dtype):
    """layers.token_rows: the rows of a batch, sorted by caption length (a PackedLayout, with
    the same flat, pos, seq and caption_rows fields)."""
    return packed_layout(mask, causal, dtype)


def attention_forward(x, w_qkv, b_qkv, w_o, b_o, rows, n_heads):
    """layers.attention_forward, one group of equal-length captions at a time."""
    return mha_forward_fast(x, w_qkv, b_qkv, w_o, b_o, rows.groups, n_heads)


def attention_backward(dy, cache):
    return mha_backward_fast(dy, cache)


def pool_forward(h, rows):
    """layers.pool_forward as a segment mean over each group's captions."""
    return mean_pool_forward_fast(h, rows)


def pool_backward(dz, cache):
    return mean_pool_backward_fast(dz, cache)


def last_pool_forward(h, rows):
    """layers.last_pool_forward on the packed layout: the same gather (layers.last_token_rows),
    each caption's length put back in batch order. last_pool_backward is layers.py's."""
    lengths = np.empty_like(rows.lengths)                                 # (B,) batch order
    lengths[rows.order] = rows.lengths
    return last_token_rows(h, rows.caption_rows, lengths)


# ---------------------------------------------------------------- the tied head, fused with CE
class TiedLogits(NamedTuple):
    """The fast set's logits hf @ tok_emb^T, not yet computed: cross_entropy makes them block
    by block. hf: (n, D); tok_emb: (V, D)."""
    hf: np.ndarray
    tok_emb: np.ndarray


class TiedGradients(NamedTuple):
    """The fast set's dlogits, already pushed through the head by the fused pass:
    dhf = dlogits @ tok_emb (n, D) and dtok_emb = dlogits^T @ hf (V, D)."""
    dhf: np.ndarray
    dtok_emb: np.ndarray


def lm_head_forward(hf, tok_emb):
    """layers.lm_head_forward, deferred: returns TiedLogits(hf, tok_emb) as the logits and as
    the cache (the fused cross_entropy below computes them)."""
    logits = TiedLogits(hf, tok_emb)
    return logits, logits


def cross_entropy(logits, targets):
    """losses.cross_entropy. On TiedLogits: the fused head + cross-entropy pass, returning
    loss, TiedGradients as dlogits, stats. On an (n, V) array: cross_entropy_fast on a copy."""
    if isinstance(logits, TiedLogits):
        loss, dhf, dtok_emb, stats = tied_head_cross_entropy_fast(logits.hf, logits.tok_emb,
                                                                  targets)
        return loss, TiedGradients(dhf, dtok_emb), stats
    return cross_entropy_fast(np.array(logits, order="C"), targets)     # it overwrites its input


def lm_head_backward(dlogits, cache):
    """layers.lm_head_backward: TiedGradients from the fused pass are the answer already; an
    (n, V) dlogits array goes through the head's two products over row blocks."""
    if isinstance(dlogits, TiedGradients):
        return dlogits.dhf, dlogits.dtok_emb
    hf, tok_emb = cache
    return matmul_rows(dlogits, tok_emb), matmul_tn_rows(dlogits, hf)   # (n, D), (V, D)
