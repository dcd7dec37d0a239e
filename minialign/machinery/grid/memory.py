"""How much memory one run takes, how much the machine has, and how many runs fit: the
check that refuses a --jobs count the machine cannot hold, and --jobs' default.

    run_memory_mb(cfg)        estimated peak resident memory of one run, MB (fitted, below)
    available_memory()        what new runs may use here, and where that number comes from
    check_jobs_fit / default_jobs / threads_per_run
"""
import math
import os
from pathlib import Path

import numpy as np

from ..fastpath import rows
from ..run.machine import available_cores
# Peak resident memory of one run, MB, fitted to bench's peak_rss_mb at --threads 1 (numpy 2.4,
# OpenBLAS, COCO val2017 captions, V = 5814): default size (D=256, L=4, 256 photos, 6873 real
# tokens) good_views 871 MB, next_token 1203 MB; 128 photos 485 / 644 MB; D=512 1773 / 2116
# MB; L=8 1492 MB (fit within 3%). Activations kept for the backward grow with the tokens of
# a step x D, per block and outside the blocks (embedding, final LayerNorm, pooling);
# next_token adds (tokens, V) float32 logits, probabilities and their gradient; weights,
# gradients and Adam's two moments are 4 float32 copies of the parameters.
MEM_BASE_MB = 105              # interpreter, numpy, imports, captions, evaluation: measured,
# a tiny run (synthetic world, D=32, L=1, 64 photos, 5 steps, image evaluation, a --jobs
# child) peaks at 112 MB, of which ~10 MB activations; its estimate 1.15 x 115 = 133 MB
MEM_BLOCK_BYTES = 86           # per real token x D x block
MEM_TOKEN_BYTES = 104          # per real token x D, outside the blocks
MEM_HEAD_CHUNKS = 4            # next_token: logits blocks of rows.GEMM_BLOCK rows alive at once
MEM_MARGIN = 1.15              # headroom over the fit (allocator slack, evaluation batches)
TOKENS_PER_CAPTION = 13.5      # mean real tokens of a COCO caption, BOS and EOS included
MEM_SAFETY_MB = 500            # memory left to the rest of the machine, MB
MEM_TOTAL_SHARE = 0.5          # where only the total memory is known: the share deemed available


def run_memory_mb(cfg, vocab_size=None):
    """Estimated peak resident memory of one training run of `cfg` (a train.TrainConfig), MB:
    MEM_MARGIN x (MEM_BASE_MB + activations + next_token's head + 4 copies of the weights):
    linear in batch_photos (tokens per step) and n_layers, in d_model but for the weights'
    D^2 terms. next_token's fused head (fast_layers.tied_head_cross_entropy_fast) never holds
    all (n, V) logits: its partials of dtok_emb (V, D), one per block of rows.gemm_blocks(n),
    and dtok_emb itself, plus MEM_HEAD_CHUNKS logits blocks of (rows.GEMM_BLOCK, V) (~0.16 GB
    of ~1.2 GB at the default size; measured: a next_token bench process peaks ~45 MB above a good_views one).
    vocab_size: V, else cfg.model.vocab_size. Fitted in float32; everything but the base
    doubles in float64 (ModelConfig.dtype)."""
    m = cfg.model
    V = vocab_size or m.vocab_size
    n = 2 * cfg.batch_photos * TOKENS_PER_CAPTION                  # real tokens per step
    activations = n * m.d_model * (m.n_layers * MEM_BLOCK_BYTES + MEM_TOKEN_BYTES)
    partials = len(rows.gemm_blocks(math.ceil(n))) + 1
    head = (partials * V * m.d_model + MEM_HEAD_CHUNKS * rows.GEMM_BLOCK * V) * 4
    head = head if cfg.objective == "next_token" else 0.0
    weights = 4 * 4 * (V * m.d_model + m.n_layers * (4 + 2 * m.mlp_ratio) * m.d_model ** 2)
    wide = np.dtype(m.dtype).itemsize / 4                          # 2 in float64
    return MEM_MARGIN * (MEM_BASE_MB + wide * (activations + head + weights
                                               + reference_mb(cfg, V) * 2**20) / 2**20)


def reference_mb(cfg, V):
    """What the reference layer set (ModelConfig.layers = "reference") holds beyond the fast
    one, MB, an upper bound (not measured): per block, attention on the padded (2B, T, D) grid
    with T = max_len (scores and probabilities (2B, H, T, T), the q | k | v grid (2B, T, 3D)
    and its gradient), and next_token's (n, V) logits, probabilities and dlogits at once."""
    m = cfg.model
    if m.layers != "reference":
        return 0.0
    B2, T, n = 2 * cfg.batch_photos, m.max_len, 2 * cfg.batch_photos * TOKENS_PER_CAPTION
    attention = m.n_layers * B2 * (2 * m.n_heads * T * T + 8 * T * m.d_model) * 4
    head = 3 * n * V * 4 if cfg.objective == "next_token" else 0.0
    return (attention + head) / 2**20


def mem_available_mb(meminfo="/proc/meminfo"):
    """MemAvailable of the machine, MB (Linux's estimate of what new processes can use without
    swapping), or None where /proc/meminfo does not say."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024                 # kB -> MB
    except (OSError, ValueError, IndexError):
        pass
    return None


def sysconf_mb(sysconf, pages):
    """os.sysconf(pages) x the page size, MB, or None where this platform has no such name."""
    try:
        return sysconf(pages) * sysconf("SC_PAGE_SIZE") / 2**20
    except (ValueError, OSError, TypeError):
        return None


def available_memory(meminfo="/proc/meminfo", sysconf=getattr(os, "sysconf", None)):
    """(MB new runs may use, where that number comes from) for --jobs: Linux's MemAvailable;
    else the free pages (os.sysconf SC_AVPHYS_PAGES: BSD, Solaris); else MEM_TOTAL_SHARE of
    the physical memory (SC_PHYS_PAGES: macOS, whose free pages leave out its file cache); else
    (None, None): not known (Windows, no os.sysconf), --jobs is not checked against memory."""
    found = mem_available_mb(meminfo)
    if found is not None:
        return found, "MemAvailable"
    if sysconf is not None:
        free = sysconf_mb(sysconf, "SC_AVPHYS_PAGES")
        if free is not None:
            return free, "free memory"
        total = sysconf_mb(sysconf, "SC_PHYS_PAGES")
        if total is not None:
            return MEM_TOTAL_SHARE * total, (f"{MEM_TOTAL_SHARE:.0%} of {total:,.0f} MB in "
                                             "all: what is free is not known here")
    return None, None


def check_jobs_fit(jobs, per_run_mb, available_mb):
    """Raise ValueError (one line: the count, the estimate, what is available) when `jobs`
    runs of per_run_mb each, plus MEM_SAFETY_MB, exceed available_mb (None: not checked)."""
    if available_mb is not None and jobs * per_run_mb + MEM_SAFETY_MB > available_mb:
        fit = max(0, int((available_mb - MEM_SAFETY_MB) // per_run_mb))
        raise ValueError(f"--jobs {jobs}: {jobs} runs need ~{jobs * per_run_mb:,.0f} MB "
                         f"(~{per_run_mb:,.0f} MB each, estimated) but this machine has "
                         f"{available_mb:,.0f} MB available (MemAvailable, {MEM_SAFETY_MB} MB "
                         f"kept free); use --jobs {max(1, fit)} or fewer")


def default_jobs(cores, per_run_mb, available_mb, runs):
    """The default --jobs: one run per core (one BLAS thread each: two runs side by side give
    more steps per second than one run on two threads), at most the runs of the grid, at most
    what fits in memory (check_jobs_fit), at least 1."""
    fit = cores if available_mb is None else int((available_mb - MEM_SAFETY_MB) // per_run_mb)
    return max(1, min(cores, runs, fit))


def threads_per_run(jobs, cores=None):
    """Cores each of `jobs` concurrent runs computes on: cores // jobs, at least 1."""
    return max(1, (cores or available_cores()) // jobs)
