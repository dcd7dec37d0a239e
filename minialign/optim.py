"""AdamW, a warm-up + cosine learning-rate schedule, global-norm clipping. Parameters,
gradients and moments are flat dicts with the same keys, updated in place."""
import math

import numpy as np

ADAM_BETA1 = 0.9     # Kingma & Ba 2015, Algorithm 1 defaults
ADAM_BETA2 = 0.999
ADAM_EPS = 1e-8
# Only weight matrices decay; LayerNorm gains and shifts, biases and embeddings do not (GPT-2)
DECAYED_SUFFIXES = (".w_qkv", ".w_o", ".w_in", ".w_out")


def adam_init(params):
    """Zero first and second moments for every parameter, step count 0."""
    return {"m": {k: np.zeros_like(p) for k, p in params.items()},
            "v": {k: np.zeros_like(p) for k, p in params.items()},
            "t": 0}


def adam_step(params, grads, state, lr, weight_decay=0.0, beta1=ADAM_BETA1, beta2=ADAM_BETA2, eps=ADAM_EPS):
    """One AdamW update, in place (Loshchilov & Hutter 2019, Algorithm 2 with eta_t = 1):
        m <- beta1 m + (1 - beta1) g;   v <- beta2 v + (1 - beta2) g^2
        p <- p - lr * weight_decay * p  (decoupled; weight matrices only)
        p <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
    params, grads: {name: array}; state: from adam_init, updated in place; lr: step size."""
    # --- exercise 9: AdamW step ---
    state["t"] += 1
    t = state["t"]
    step = lr / (1.0 - beta1 ** t)          # bias correction of m folded into the step size
    v_scale = 1.0 / (1.0 - beta2 ** t)      # bias correction of v
    for name in sorted(params):
        p, g, m, v = params[name], grads[name], state["m"][name], state["v"][name]
        m *= beta1
        m += (1.0 - beta1) * g
        v *= beta2
        v += (1.0 - beta2) * (g * g)
        if weight_decay and name.endswith(DECAYED_SUFFIXES):
            p *= 1.0 - lr * weight_decay
        denom = np.sqrt(v * v_scale)                                      # same shape as p
        denom += eps
        p -= step * m / denom
    # --- end of exercise 9 ---


def clip_grad_norm(grads, max_norm):
    """Scale every gradient in place by min(1, max_norm / ||g||), ||g|| the global L2 norm
    (Pascanu et al. 2013). Returns ||g|| before clipping; max_norm None or 0: measure only."""
    norm = math.sqrt(sum(float(np.dot(g.ravel(), g.ravel())) for g in grads.values()))
    if max_norm and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads.values():
            g *= scale
    return norm


def lr_at(step, base_lr, warmup_steps, total_steps, min_lr_ratio=0.0):
    """Learning rate for 0-based `step`: linear warm-up from base_lr / warmup_steps to base_lr
    over the first warmup_steps, then half a cosine down to min_lr_ratio * base_lr at
    total_steps (Loshchilov & Hutter 2017, SGDR without restarts)."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return base_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)
