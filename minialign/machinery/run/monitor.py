"""What a training run (train.run) does around its step: read its captions (a COCO JSON,
cleaned per photo) and prepare its inputs before the run directory is touched; embed each
split's captions (saved as captions/<split>_stepNNNNN.npz, scored by text_metrics); finish
(model.npz, the final evaluation); and print its size, a progress bar or plain lines,
collapse warnings."""
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ...data import split_photos, tokenize_photos
from ...metrics import collapse_stats, paraphrase_r_at_1
from ...model import encode, param_count
from ...objectives import CAUSAL
from ...tokenizer import build_tokenizer, clean_caption
from ...wordpiece import read_vocab
from .. import fastpath
from .files import read_coco_json, sha256_file
from .rundir import (record_divergence, save_caption_embeddings, save_model,
                     write_training_metrics)

EVAL_BATCH = 500     # captions per forward pass when embedding evaluation captions
EVAL_SLOTS = 5       # caption slots embedded per photo (COCO has >= 5 for almost every photo)
FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504: saved caption embeddings must fit
PLAIN_LOG_EVERY = 50  # steps between progress lines when stderr is not a terminal
STUDENT_COPY = "student copy: reference layers (minialign/layers.py) only"   # no fast path
PLAIN_LOG_SECONDS = 60  # ... or seconds, whichever comes first (a slow step: a line a minute)


@dataclass(frozen=True, eq=False)          # eq=False: == on arrays has no single truth value
class Captions:
    """Cleaned captions of the photos kept from one COCO captions file."""
    path: str
    image_ids: np.ndarray                   # (P,) int64 COCO image ids, sorted ascending
    captions: tuple[tuple[str, ...], ...]   # per photo: cleaned, distinct, >= 2, by annotation id
    stats: dict                             # counts of what was read, dropped and kept (ints)


def has_word(caption: str) -> bool:
    """True if the caption holds at least one letter or digit (a word, not only punctuation).
    "a dog." -> True; " . ", "", "?!" -> False. The loader drops captions without a word."""
    return any(ch.isalnum() for ch in caption)


def load_coco_captions(path) -> Captions:
    """Read a COCO captions JSON (e.g. captions_val2017.json) into per-photo clean captions.
    Captions are read in annotation-id order and cleaned (tokenizer.clean_caption: NFC,
    ASCII quotes, single spaces, lowercase); captions left empty, or holding no word (no
    letter or digit, e.g. " . ") are dropped, then repeats within a photo (first kept);
    photos left with < 2 captions are dropped, so every kept photo has >= 2 captions.
    Raises FileNotFoundError (missing file) or ValueError (not JSON, not COCO format, or no
    photo with two distinct captions), each message starting with the path."""
    path = Path(path)
    data = read_coco_json(path)                 # checked: one-line errors naming the file
    annotations = data["annotations"]

    by_photo: dict[int, list[str]] = {}
    n_empty = n_wordless = n_duplicate = 0
    for ann in sorted(annotations, key=lambda a: a["id"]):  # stable: file order breaks ties
        caption = clean_caption(ann["caption"])
        photo = by_photo.setdefault(ann["image_id"], [])
        if caption == "":
            n_empty += 1
        elif not has_word(caption):
            n_wordless += 1
        elif caption in photo:
            n_duplicate += 1
        else:
            photo.append(caption)

    kept_ids = sorted(i for i, caps in by_photo.items() if len(caps) >= 2)
    if not kept_ids:
        raise ValueError(f"{path}: no photo has two distinct captions with words")
    listed = {img.get("id") for img in data.get("images", []) if isinstance(img, dict)}
    stats = {
        "raw_images": len(data.get("images", [])),        # entries of the 'images' list
        "raw_annotations": len(annotations),              # captions in the file
        "raw_photos": len(by_photo),                      # distinct image_id among annotations
        "empty_captions_dropped": n_empty,                # nothing left after cleaning
        "captions_without_words_dropped": n_wordless,     # not empty, but no letter or digit
        "duplicate_captions_dropped": n_duplicate,        # repeats after cleaning, per photo
        "photos_dropped_under_2_captions": len(by_photo) - len(kept_ids),
        "photos_not_in_images": len(set(by_photo) - listed),  # kept anyway, if >= 2 captions
        "images_without_captions": len(listed - set(by_photo)),
        "photos": len(kept_ids),
        "captions": sum(len(by_photo[i]) for i in kept_ids),
        "max_captions_per_photo": max(len(by_photo[i]) for i in kept_ids),
    }
    image_ids = np.array(kept_ids, dtype=np.int64)        # (P,)
    image_ids.setflags(write=False)
    captions = tuple(tuple(by_photo[i]) for i in kept_ids)
    return Captions(path=str(path), image_ids=image_ids, captions=captions, stats=stats)


def prepare(cfg):
    """Captions -> split -> tokenizer (cfg.tokenizer: words from the train captions only, or
    wordpiece: the cfg.vocab file) -> token tables per split.
    Checks here every precondition that can fail before step 1 (it runs before the run
    directory is touched): the captions file (load_coco_captions), enough photos for the
    split, 2 <= batch_photos <= train photos; val and test photos all have >= 2 captions (the
    loader keeps no other photo), as the evaluation's paraphrase R@1 needs slots 0 and 1.
    Returns a dict with captions, split, tokenizer, tables {split: CaptionTable}, n_truncated.
    Raises FileNotFoundError / ValueError, each message one line starting with cfg.captions
    (or cfg.vocab: read_vocab)."""
    captions = load_coco_captions(cfg.captions)
    try:
        split = split_photos(captions.image_ids, cfg.split_seed)
    except ValueError as err:               # "11 photos cannot give ...": say which file
        raise ValueError(f"{cfg.captions}: {err}") from None
    train_text = [c for i in split["train"] for c in captions.captions[i]]
    tok = (read_vocab(cfg.vocab) if cfg.tokenizer == "wordpiece" else
           build_tokenizer(train_text, cfg.min_count))
    tables, n_truncated = {}, 0
    for name, idx in split.items():
        tables[name], n = tokenize_photos(captions, idx, tok, cfg.model.max_len)
        n_truncated += n
    for name in ("val", "test"):
        assert tables[name].counts.min() >= 2, f"{cfg.captions}: a {name} photo has < 2 captions"
    if not 2 <= cfg.batch_photos <= len(split["train"]):
        raise ValueError(f"{cfg.captions}: batch_photos={cfg.batch_photos}, but the train split "
                         f"has {len(split['train'])} photos (need 2 <= batch_photos <= that)")
    return {"captions": captions, "split": split, "tokenizer": tok, "tables": tables,
            "n_truncated": n_truncated}


def run_info(cfg, params, data):
    """config.json's "info": vocabulary, parameter counts, photos per split, caption stats, and
    the captions (and wordpiece's vocabulary) file's sha256 (resume compares the file by it,
    not by how it is spelled)."""
    return {"vocab_size": cfg.model.vocab_size, "parameters": param_count(params),
            "embedding_parameters": int(params["tok_emb"].size),
            "captions_truncated": data["n_truncated"],
            "photos": {k: len(v) for k, v in data["split"].items()},
            "caption_stats": data["captions"].stats,
            "captions_sha256": sha256_file(cfg.captions),
            **({"vocab_sha256": sha256_file(cfg.vocab)} if cfg.vocab else {})}


def eval_tokens(table, slot):
    """The caption in slot `slot` (0-based, Captions order) of every photo of a
    data.CaptionTable that has more than `slot` captions. Returns (tokens (B, T) int32 padded
    to the longest of them, photos (B,) int64 table photo indices, ascending). Raises
    ValueError if slot < 0 or no photo has that many captions."""
    if slot < 0:
        raise ValueError(f"slot must be >= 0, got {slot}")
    photos = np.flatnonzero(table.counts > slot).astype(np.int64)  # (B,)
    if len(photos) == 0:
        raise ValueError(f"no photo has more than {slot} captions")
    rows = table.offsets[photos] + slot                            # (B,)
    T = int(table.lengths[rows].max())
    return table.tokens[rows, :T], photos                          # (B, T), (B,)


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


def text_metrics(slots):
    """Text-side metrics of one split. slots: {s: (photos (P_s,), z (P_s, D))}, caption slot s
    of each photo (embed_split, or a saved captions file), slots 0 and 1 holding every photo.
    Returns {"paraphrase_R@1" (metrics.paraphrase_r_at_1, slot 0 as queries, slot 1 as
    gallery), "chance" (1 / P), "caption_slots" (how many), **metrics.collapse_stats(slot 0)}."""
    (p0, z0), (p1, z1) = slots[0], slots[1]
    assert np.array_equal(p0, p1), "every photo has at least two captions"
    return {"paraphrase_R@1": paraphrase_r_at_1(z0, z1), "chance": 1.0 / len(p0),
            "caption_slots": len(slots), **collapse_stats(z0)}


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
        # Score what was saved (float16): `evaluate` reads these files and gets the same numbers.
        slots = {s: (photos, z.astype(np.float16).astype(np.float32))
                 for s, (photos, z) in slots.items()}                     # (P_s,), (P_s, D)
        if split != "train":
            entry[split] = text_metrics(slots)
    return entry


def evaluate_val(params, cfg, data, out, step, metrics, progress):
    """An evaluation during training: the val captions (evaluate), appended to metrics.json,
    one line through `progress` (a Progress)."""
    entry = evaluate(params, cfg, data, out, step, ("val",))
    metrics["evals"].append(entry)
    write_training_metrics(out, metrics)
    progress.write(f"[{cfg.objective}] step {step} val paraphrase R@1 "
                   f"{entry['val']['paraphrase_R@1']:.3f}")


def finish(params, cfg, data, out, metrics, t_start):
    """After the last step: model.npz, the final evaluation of every split, a warning for
    collapsed embeddings, metrics.json with "final". Returns the metrics dict."""
    save_model(out, params, data["tokenizer"])
    final = evaluate(params, cfg, data, out, cfg.steps, ("val", "test", "train"))
    metrics["evals"].append(final)
    write_training_metrics(out, metrics)
    warnings = warn_if_collapsed(cfg, out, final)    # collapse is silent in the losses
    metrics.update(final=final, warnings=warnings, wall_seconds=time.perf_counter() - t_start,
                   ms_per_step=1000 * (time.perf_counter() - t_start) / max(1, cfg.steps))
    write_training_metrics(out, metrics)
    print_done(cfg, final)
    return metrics


def print_start(cfg, info):
    """The run's size: vocabulary, parameters, photos per split, captions truncated; and on
    stderr a warm-up that outlasts the run (here, once every input is checked and the run
    directory is locked: a refused command prints its error alone)."""
    unit = "WordPiece tokens" if cfg.tokenizer == "wordpiece" else "words"
    print(f"[{cfg.objective}] vocabulary {info['vocab_size']} {unit}, {info['parameters']:,} "
          f"parameters ({info['embedding_parameters']:,} in the token embedding), photos "
          f"{info['photos']}, {info['captions_truncated']} captions truncated to "
          f"{cfg.model.max_len} tokens", flush=True)
    if not fastpath.PRESENT:
        print(STUDENT_COPY, flush=True)
    if cfg.warmup_steps >= cfg.steps:
        print(f"warning: --warmup-steps {cfg.warmup_steps} >= --steps {cfg.steps}: the learning "
              f"rate never reaches its peak {cfg.lr}", file=sys.stderr, flush=True)


class Progress:
    """A run's progress, as a context manager: a tqdm bar (show=True), plain lines every
    PLAIN_LOG_EVERY steps or PLAIN_LOG_SECONDS, whichever comes first, and at the first step
    (show=False; print_progress), or by whether stderr is a terminal (show=None). The bar is
    closed on leaving, whatever happened."""

    def __init__(self, cfg, first_step, show=None):
        self.cfg, self.first_step, self.t0 = cfg, first_step, time.perf_counter()
        self.last_line = self.t0                   # when the last plain line was printed
        self.plain = not (sys.stderr.isatty() if show is None else show)
        self.bar = tqdm(total=cfg.steps, initial=first_step, desc=cfg.objective,
                        disable=self.plain, dynamic_ncols=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()

    def step(self, step, loss, lr):
        """After 0-based `step`: the bar's loss and count, or now and then a plain line."""
        self.bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        self.bar.update(1)
        now = time.perf_counter()
        if self.plain and ((step + 1) % PLAIN_LOG_EVERY == 0 or step == self.first_step
                           or now - self.last_line >= PLAIN_LOG_SECONDS):
            print_progress(self.cfg, step, self.first_step, loss, lr, now - self.t0)
            self.last_line = now

    def write(self, line):
        """A line on stdout that does not break the bar."""
        self.bar.write(line, file=sys.stdout)


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
