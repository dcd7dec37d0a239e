"""What a training run prints: its size at the start, a plain progress line now and then
(when stderr is not a terminal; tqdm's bar otherwise), collapse warnings and the last line."""
import sys


def print_start(cfg, info):
    """The run's size: vocabulary, parameters, photos per split, captions truncated."""
    print(f"[{cfg.objective}] vocabulary {info['vocab_size']} words, {info['parameters']:,} "
          f"parameters ({info['embedding_parameters']:,} in the token embedding), photos "
          f"{info['photos']}, {info['captions_truncated']} captions truncated to "
          f"{cfg.model.max_len} tokens", flush=True)


def print_progress(cfg, step, first_step, loss, lr, elapsed):
    """The plain progress line (no terminal): step, loss, lr, ms per step, time left.
    elapsed: seconds since this process began at first_step."""
    done = step + 1 - first_step
    eta = elapsed / done * (cfg.steps - step - 1)
    print(f"[{cfg.objective}] step {step + 1}/{cfg.steps} loss {loss:.4f} lr {lr:.2e} "
          f"{1000 * elapsed / done:.0f} ms/step eta {eta / 60:.1f} min", flush=True)


def warn_if_collapsed(cfg, out, final):
    """Print and return a warning per split (val, test) whose final embeddings collapsed
    (metrics.collapse_stats): collapse is silent in the losses and the effective rank."""
    warnings = [f"[{cfg.objective}] {out}: {split} caption embeddings collapsed: per-dimension "
                f"std {final[split]['std']:.2g} < threshold "
                f"{final[split]['collapse_std_threshold']:.2g} (metrics.COLLAPSE_STD_FRACTION / "
                f"sqrt(D)); its retrieval and alignment numbers mean little"
                for split in ("val", "test") if final[split]["collapsed"]]
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return warnings


def print_done(cfg, final):
    """The last line: val and test paraphrase R@1, test effective rank and per-dim std."""
    print(f"[{cfg.objective}] done: val paraphrase R@1 {final['val']['paraphrase_R@1']:.3f}, "
          f"test {final['test']['paraphrase_R@1']:.3f} (chance {final['test']['chance']:.4f}); "
          f"test effective rank {final['test']['effective_rank']:.1f}, per-dim std "
          f"{final['test']['std']:.3g} (collapse below "
          f"{final['test']['collapse_std_threshold']:.3g})", flush=True)
