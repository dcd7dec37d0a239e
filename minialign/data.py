"""Captions per photo -> train/val/test split -> token tables -> batches.

A "good views" pair is two different human captions of the same photo, so everything here
is organised by photo: photos are split (never captions), and a batch draws B distinct photos
and two distinct captions of each."""
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .caption_files import read_rows
from .tokenizer import MAX_LEN, Tokenizer, clean_caption, pad_batch

SPLIT_SEED = 20170  # the photo split's seed, independent of any training seed


def split_photos(image_ids, split_seed=SPLIT_SEED):
    """Split photos (never captions) into train / val / test: val and test get min(1000, P // 5)
    photos each (5000 -> 3000/1000/1000, 10,000 -> 8000/1000/1000), by a permutation of the
    photos sorted by id, from default_rng(split_seed). Returns {"train", "val", "test"}: sorted
    int64 index arrays into image_ids. Raises ValueError for repeated ids or a split < 3."""
    P = len(image_ids)
    n = min(1000, P // 5)
    if len(np.unique(image_ids)) != P or P - 2 * n < 3 or n < 3:
        raise ValueError(f"{P} photos ({len(np.unique(image_ids))} distinct ids) with two or more "
                         f"captions; train/val/test, val and test a fifth each (>= 3), need 15")
    shuffled = np.argsort(image_ids, kind="stable")[np.random.default_rng(split_seed).permutation(P)]
    return {"train": np.sort(shuffled[2 * n:]).astype(np.int64),
            "val": np.sort(shuffled[:n]).astype(np.int64),
            "test": np.sort(shuffled[n:2 * n]).astype(np.int64)}


@dataclass(frozen=True, eq=False)
class Captions:
    """The cleaned captions of one captions file, per photo."""
    path: str
    image_ids: np.ndarray                   # (P,) int64 photo ids, ascending
    captions: tuple                         # per photo: >= 2 distinct cleaned captions


def load_captions(path):
    """A captions file (COCO JSON, JSON Lines or CSV: caption_files.py) -> Captions, in file
    order, cleaned (clean_caption); those with no letter or digit and repeats within a photo
    dropped, then photos left with < 2. FileNotFoundError / ValueError: one line, path first."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such captions file")
    by_photo = {}
    for photo, caption in read_rows(path):
        kept, caption = by_photo.setdefault(photo, []), clean_caption(caption)
        if any(ch.isalnum() for ch in caption) and caption not in kept:
            kept.append(caption)
    ids = sorted(p for p, kept in by_photo.items() if len(kept) >= 2)
    if not ids:
        raise ValueError(f"{path}: no photo has two distinct captions with words")
    return Captions(str(path), np.array(ids, dtype=np.int64), tuple(tuple(by_photo[p]) for p in ids))


# eq=False on array-holding dataclasses: == on arrays has no single truth value.
@dataclass(frozen=True, eq=False)
class CaptionTable:
    """Token ids of every caption of some photos, in one padded array for fast batching.
    Table photo p (0 <= p < P_t) owns rows offsets[p] .. offsets[p] + counts[p] - 1,
    its captions in Captions order (slot 0, 1, ...). All arrays are read-only."""
    photo_idx: np.ndarray  # (P_t,) int64 index of each table photo in Captions order
    tokens: np.ndarray     # (n_captions, L) int32 [BOS .. EOS] then PAD; L = longest caption
    lengths: np.ndarray    # (n_captions,) int64 tokens before padding
    offsets: np.ndarray    # (P_t,) int64 first row of each photo
    counts: np.ndarray     # (P_t,) int64 captions of each photo, >= 2


@dataclass(frozen=True, eq=False)
class Batch:
    """B photos and two different captions of each, padded to a common length T."""
    photos: np.ndarray     # (B,) int64 distinct table photo indices
    tokens_a: np.ndarray   # (B, T) int32 one caption of each photo
    tokens_b: np.ndarray   # (B, T) int32 a different caption of the same photo


def tokenize_photos(captions, photo_idx: np.ndarray, tok: Tokenizer,
                    max_len: int = MAX_LEN) -> tuple[CaptionTable, int]:
    """Encode all captions of the photos captions.captions[photo_idx] (e.g. a split).
    Returns (table, number of captions truncated to max_len)."""
    photo_idx = np.array(photo_idx, dtype=np.int64)  # a copy: it is made read-only below
    encoded = [tok.encode(c, max_len) for p in photo_idx for c in captions.captions[p]]
    seqs, n_truncated = [ids for ids, _ in encoded], sum(cut for _, cut in encoded)
    counts = np.array([len(captions.captions[p]) for p in photo_idx], dtype=np.int64)  # (P_t,)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)         # (P_t,)
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)                        # (n,)
    tokens = pad_batch(seqs)                                                          # (n, L)
    for a in (photo_idx, tokens, lengths, offsets, counts):
        a.setflags(write=False)
    table = CaptionTable(photo_idx=photo_idx, tokens=tokens, lengths=lengths,
                         offsets=offsets, counts=counts)
    return table, n_truncated


def sample_batch(table: CaptionTable, batch_photos: int, rng: np.random.Generator) -> Batch:
    """Draw B = batch_photos distinct photos uniformly without replacement, and for each an
    ordered pair of distinct caption slots uniformly; all randomness from rng.
    Returns Batch with tokens_a, tokens_b (B, T) int32, T = longest of the 2B captions."""
    photos = rng.choice(len(table.counts), size=batch_photos, replace=False).astype(np.int64)  # (B,)
    counts = table.counts[photos]                                               # (B,)
    slot_a = rng.integers(0, counts)                                            # (B,)
    # shift by 1..count-1 around the circle: slot_b is uniform over the other count-1 slots
    slot_b = (slot_a + 1 + rng.integers(0, counts - 1)) % counts                # (B,)
    rows_a = table.offsets[photos] + slot_a                                     # (B,)
    rows_b = table.offsets[photos] + slot_b                                     # (B,)
    T = int(max(table.lengths[rows_a].max(), table.lengths[rows_b].max()))
    return Batch(photos=photos,
                 tokens_a=table.tokens[rows_a, :T],                            # (B, T)
                 tokens_b=table.tokens[rows_b, :T])                            # (B, T)

