"""What a training run measures and prints besides its step: the caption embeddings of each
split (embedded, saved as captions/<split>_stepNNNNN.npz, scored by metrics.text_metrics), the
end of a run (model.npz, the final evaluation), its size, progress lines and collapse warnings."""
import sys
import time

import numpy as np

from ..data import eval_tokens
from ..metrics import text_metrics
from ..model import encode
from ..objectives import CAUSAL
from .rundir import record_divergence, save_caption_embeddings, save_model, write_metrics

EVAL_BATCH = 500     # captions per forward pass when embedding evaluation captions
EVAL_SLOTS = 5       # caption slots embedded per photo (COCO has >= 5 for almost every photo)
FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504: saved caption embeddings must fit


def embed(params, tokens, cfg, causal):
    """Caption embeddings z (B, D), float32, computed EVAL_BATCH captions at a time, each chunk
    trimmed to its own longest caption."""
    out = []
    for i in range(0, len(tokens), EVAL_BATCH):
        chunk = tokens[i:i + EVAL_BATCH]
        chunk = chunk[:, :max(1, int((chunk != 0).sum(axis=1).max()))]
        out.append(encode(params, chunk, cfg, causal)[0])
    return np.concatenate(out)                                            # (B, D)


def embed_split(params, table, cfg, causal):
    """Embeddings of a split's captions, slot by slot: {s: (photos (P_s,) int64 table photo
    indices, ascending; z (P_s, D) float32)} for s = 0 .. S-1, S = min(EVAL_SLOTS, most
    captions of any photo of the table). Slot s holds the photos with more than s captions
    (a photo without an s-th caption is absent from slot s); slots 0 and 1 hold every photo."""
    n_slots = min(EVAL_SLOTS, int(table.counts.max()))
    slots = {}
    for s in range(n_slots):
        tokens, photos = eval_tokens(table, s)                  # (P_s, T), (P_s,); P_s >= 1
        slots[s] = (photos, embed(params, tokens, cfg, causal))
    return slots


def evaluate(params, cfg, data, out, step, splits):
    """Embed the captions of `splits` (of "val", "test", "train") with the current params, save
    them (captions/<split>_stepNNNNN.npz) and return {"step", split: text_metrics} for val and
    test. Raises Diverged (record_divergence) if an embedding is not finite or beyond float16."""
    entry = {"step": step}
    for split in splits:
        table = data["tables"][split]
        with np.errstate(over="ignore", invalid="ignore"):
            slots = embed_split(params, table, cfg.model, CAUSAL[cfg.objective])
        if not all(np.abs(z).max() < FLOAT16_MAX for _, z in slots.values()):  # NaN too
            record_divergence(out, step, cfg.lr, f"{split} caption embeddings beyond "
                              f"float16's range (saved as float16) or not finite")
        save_caption_embeddings(out, split, step, slots,
                                data["captions"].image_ids[table.photo_idx])
        if split != "train":
            entry[split] = text_metrics(slots)
    return entry


def finish(params, cfg, data, out, metrics, t_start):
    """After the last step: model.npz, the final evaluation of every split, a warning for
    collapsed embeddings, metrics.json with "final". Returns the metrics dict."""
    save_model(out, params, data["tokenizer"])
    final = evaluate(params, cfg, data, out, cfg.steps, ("val", "test", "train"))
    metrics["evals"].append(final)
    write_metrics(out, metrics)
    warnings = warn_if_collapsed(cfg, out, final)    # collapse is silent in the losses
    metrics.update(final=final, warnings=warnings, wall_seconds=time.perf_counter() - t_start,
                   ms_per_step=1000 * (time.perf_counter() - t_start) / max(1, cfg.steps))
    write_metrics(out, metrics)
    print_done(cfg, final)
    return metrics


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
