"""The open question: does the gap between good views and next-token prediction grow or shrink
with encoder size? A sweep over width D and depth L (heads and MLP scaled with D), the three
objectives and seeds; this module holds its sizes, parameter counts and the trend the data
supports. Running the runs is replicate's machinery (run directories, resume, --jobs, Slurm).

The trend: every finished (size, seed) pair with both objectives gives one gap
g = metric(good_views) - metric(next_token). An ordinary least-squares line
g = a + b log10(parameters) through all of them gives the slope b (gap per decade of
parameters) and its standard error se(b) = sqrt(RSS / (n - 2) / sum (x - mean x)^2). The
verdict is "grows" when b > 2 se(b), "shrinks" when b < -2 se(b), else "not resolved at these
sizes" (also with fewer than 3 points or fewer than 2 distinct sizes).
"""
import math

import numpy as np

from ...model import DEFAULT_LAYERS, ModelConfig

WIDTHS = (64, 128, 256, 512)
DEPTHS = (2, 4, 8)
HEAD_WIDTH = 64   # Dh: heads = D / 64 (at least 1), as GPT-2 and BERT keep per-head width fixed
MLP_RATIO = 4     # F = 4 D at every size
SLOPE_SIGMAS = 2  # |b| > 2 se(b): the slope's sign is called
CENTER = (256, 4) # the replication's encoder (D, L): where a "plus" sweep's two arms cross
GRIDS = ("plus", "cross")


def sweep_sizes(widths=WIDTHS, depths=DEPTHS, grid="plus", center=CENTER):
    """The (D, L) pairs of a sweep, smallest transformer body (D^2 L) first, each once.
    grid "plus": every width at the center's depth and every depth at the center's width
    (the default: D in {64, 128, 256, 512} at L = 4 and L in {2, 4, 8} at D = 256, 6 sizes);
    "cross": every width x every depth (4 x 3 = 12 sizes). Raises ValueError for another grid."""
    if grid == "cross":
        sizes = {(d, n) for d in widths for n in depths}
    elif grid == "plus":
        sizes = {(d, center[1]) for d in widths} | {(center[0], n) for n in depths}
    else:
        raise ValueError(f"sweep grid {grid!r}: must be one of {', '.join(GRIDS)}")
    return tuple(sorted(sizes, key=lambda s: (s[0] * s[0] * s[1], s)))


def size_config(d_model, n_layers, vocab_size, max_len, layers=DEFAULT_LAYERS, dtype="float32"):
    """The ModelConfig of one sweep point: D = d_model, L = n_layers, H = max(1, D // 64),
    F = 4 D, on the layer set `layers`, in `dtype`. Raises ValueError (ModelConfig's) for a D
    that H does not divide."""
    return ModelConfig(vocab_size=vocab_size, max_len=max_len, d_model=d_model,
                       n_layers=n_layers, n_heads=max(1, d_model // HEAD_WIDTH),
                       mlp_ratio=MLP_RATIO, layers=layers, dtype=dtype)


def count_params(cfg):
    """Scalars in model.init_params(cfg) without allocating them:
    V D + T_max D (embeddings) + L (4 D + 3 D^2 + 3 D + D^2 + D + 2 D F + F + D) + 2 D."""
    D, F = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    block = 4 * D + (3 * D * D + 3 * D) + (D * D + D) + (D * F + F) + (F * D + D)
    return cfg.vocab_size * D + cfg.max_len * D + cfg.n_layers * block + 2 * D


def gap_trend(points):
    """points: list of (parameters, gap) over finished (size, seed) pairs.
    Returns {"slope": b per decade or None, "se": se(b) or None, "n": points, "sizes":
    distinct parameter counts, "verdict": "grows" | "shrinks" | "not resolved at these
    sizes"} (module docstring: the fit and the rule)."""
    x = np.log10(np.array([p for p, _ in points], dtype=np.float64))
    g = np.array([gap for _, gap in points], dtype=np.float64)
    out = {"slope": None, "se": None, "n": len(points), "sizes": len(set(x.tolist())),
           "verdict": "not resolved at these sizes"}
    if len(points) < 3 or out["sizes"] < 2:
        return out
    xc = x - x.mean()
    b = float(xc @ (g - g.mean()) / (xc @ xc))
    residual = g - g.mean() - b * xc
    se = math.sqrt(float(residual @ residual) / (len(points) - 2) / float(xc @ xc))
    out.update(slope=b, se=se)
    if b > SLOPE_SIGMAS * se:
        out["verdict"] = "grows"
    elif b < -SLOPE_SIGMAS * se:
        out["verdict"] = "shrinks"
    return out


def signed(x, digits):
    """x with its sign, `digits` decimals: "+0.0123", "-0.5000"; a value that rounds to zero
    is "+0.0000" (a slope of -1e-17 from rounding would otherwise print as "-0.0000")."""
    return f"{round(x, digits) + 0.0:+.{digits}f}"          # -0.0 + 0.0 is +0.0


def trend_sentence(trend, metric):
    """One line for results.md, computed from gap_trend's dict."""
    gap = f"The good_views − next_token gap in {metric}"
    if trend["slope"] is None:
        return (f"{gap}: not resolved at these sizes ({trend['n']} finished size/seed pairs "
                f"over {trend['sizes']} sizes; the fit needs at least 3 pairs over 2 sizes).")
    verdict = (f"is {trend['verdict']}" if trend["verdict"].startswith("not")
               else f"{trend['verdict']} with encoder size")
    return (f"{gap} {verdict}: slope {signed(trend['slope'], 4)} ± {trend['se']:.4f} per "
            f"tenfold increase in parameters (a least-squares line through {trend['n']} size/seed "
            f"pairs, {trend['sizes']} sizes; called only when |slope| > {SLOPE_SIGMAS} "
            f"standard errors).")
