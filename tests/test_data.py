"""Captions -> split -> tables -> batches (data.py): the loader and its one-line errors, the split
by photo, the sampler's pairs; the real val2017 file (../shared) pinned where it matters."""
import json

import numpy as np
import pytest

from minialign.data import (SPLIT_SEED, Captions, load_captions, sample_batch, split_photos,
                            tokenize_photos)
from minialign.tokenizer import EOS, MAX_LEN, PAD, build_tokenizer, split_words


def ann(ann_id, image_id, caption):
    return {"id": ann_id, "image_id": image_id, "caption": caption}


def test_load_captions_exactly(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"annotations": [
        ann(30, 1, "A dog  runs. "), ann(10, 1, "A brown dog\nplays."), ann(20, 1, "a dog runs."),
        *[ann(46 - k, 2, f"Photo two, caption {6 - k}") for k in range(7)],   # ids reversed
        ann(50, 3, "A cat."), ann(51, 3, "a cat. "), ann(52, 3, "   "),       # 1 distinct left
        ann(70, 4, ""), ann(71, 4, "A Caf\u0065\u0301 \u2019red\u2019"), ann(73, 4, " - "),
        ann(72, 4, "A car that is red "), ann(60, 9, "A bird."), ann(61, 9, "Two birds.")]}))
    caps = load_captions(path)
    assert caps.path == str(path)
    assert caps.image_ids.dtype == np.int64 and caps.image_ids.tolist() == [1, 2, 4, 9]
    assert caps.captions == (("a brown dog plays.", "a dog runs."),       # annotation-id order
                             tuple(f"photo two, caption {k}" for k in range(7)),
                             ("a caf\u00e9 'red'", "a car that is red"), ("a bird.", "two birds."))


@pytest.mark.parametrize("content", [
    "{not json", "[1, 2]", '{"images": []}', '{"annotations": [{"id": 1, "caption": "a"}]}',
    json.dumps({"annotations": [ann(1, 1, 5), ann(2, 1, "a dog")]}),
    json.dumps({"annotations": [ann(1, 1, "a dog"), ann(2, 1, "A dog "), ann(3, 2, "x")]}),
    json.dumps({"annotations": [ann(1, 1, "caf\u00e9 au lait"), ann(2, 1, "a caf\u00e9")]},
               ensure_ascii=False)])
def test_a_bad_captions_file_is_one_line_naming_it(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content.encode("cp1252" if "\u00e9" in content else "utf-8"))  # Latin-1
    with pytest.raises(ValueError) as err:
        load_captions(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'none.json'}: "):
        load_captions(tmp_path / "none.json")


def test_split_by_photo_depends_on_the_set_of_ids_only():
    ids = np.arange(100_000, 110_000, dtype=np.int64) * 3
    split = split_photos(ids)
    assert {k: len(v) for k, v in split.items()} == {"train": 8000, "val": 1000, "test": 1000}
    assert np.array_equal(np.sort(np.concatenate(list(split.values()))), np.arange(10_000))
    order = np.random.default_rng(1).permutation(len(ids))
    shuffled = split_photos(ids[order])                     # the same ids in another order
    for name in split:
        assert split[name].dtype == np.int64 and np.all(np.diff(shuffled[name]) > 0)
        assert np.array_equal(np.sort(ids[order][shuffled[name]]), ids[split[name]])
    assert not np.array_equal(split_photos(ids, SPLIT_SEED + 1)["val"], split["val"])
    assert [len(v) for v in split_photos(ids[:15]).values()] == [9, 3, 3]
    for bad in (ids[:14], np.array([1, 2, 2, 3] * 5)):
        with pytest.raises(ValueError):
            split_photos(bad)


def toy_table(seed=0):
    """Photos with 2..7 distinct captions of 2..12 words, every caption text unique."""
    rng = np.random.default_rng(seed)
    captions = tuple(tuple(f"photo {p} caption {k}" + " w" * int(rng.integers(0, 10))
                           for k in range(int(rng.integers(2, 8)) if p != 2 else 7))
                     for p in range(20))
    caps = Captions(path="toy", image_ids=np.arange(20, dtype=np.int64) * 10, captions=captions)
    tok = build_tokenizer([c for cs in captions for c in cs])
    return caps, tok, tokenize_photos(caps, np.arange(2, 20), tok)[0]


def test_tokenize_photos_layout():
    caps, tok, table = toy_table()
    assert table.photo_idx.tolist() == list(range(2, 20))
    assert table.counts.tolist() == [len(caps.captions[p]) for p in range(2, 20)]
    assert table.offsets.tolist() == [0, *np.cumsum(table.counts)[:-1]]
    for slot, caption in enumerate(caps.captions[7]):       # table photo 5 is photo 7
        row = table.offsets[5] + slot
        assert tok.decode(table.tokens[row]) == caption
        assert table.lengths[row] == len(split_words(caption)) + 2
    assert table.tokens.dtype == np.int32 and table.tokens.shape[1] == table.lengths.max()
    assert not table.tokens.flags.writeable
    _, n_truncated = tokenize_photos(caps, np.arange(20), tok, max_len=6)
    assert n_truncated == sum(len(split_words(c)) + 2 > 6 for cs in caps.captions for c in cs) > 0


def test_sample_batch_pairs_two_different_captions_of_each_photo():
    caps, tok, table = toy_table()
    for seed in range(10):
        batch = sample_batch(table, 12, np.random.default_rng(seed))
        assert batch.photos.dtype == np.int64 and len(np.unique(batch.photos)) == 12
        assert batch.tokens_a.dtype == batch.tokens_b.dtype == np.int32
        for i, p in enumerate(batch.photos):
            texts = caps.captions[table.photo_idx[p]]
            a, b = tok.decode(batch.tokens_a[i]), tok.decode(batch.tokens_b[i])
            assert a in texts and b in texts and a != b
        tokens = np.concatenate([batch.tokens_a, batch.tokens_b])
        lengths = (tokens != PAD).sum(axis=1)
        assert tokens.shape[1] == lengths.max()              # cut to the batch's longest
        assert all((r[n:] == PAD).all() and r[n - 1] == EOS for r, n in zip(tokens, lengths))
    again = sample_batch(table, 12, np.random.default_rng(9))
    assert np.array_equal(again.tokens_b, batch.tokens_b)    # all randomness from rng


def test_sample_batch_draws_every_ordered_pair_alike():
    caps = Captions(path="toy", image_ids=np.arange(3, dtype=np.int64),
                    captions=tuple((f"p{p} zero", f"p{p} one", f"p{p} two") for p in range(3)))
    tok = build_tokenizer([c for cs in caps.captions for c in cs])
    table, _ = tokenize_photos(caps, np.arange(3), tok)
    rng, pairs = np.random.default_rng(0), {}
    for _ in range(1200):                                    # 1200 draws per photo
        batch = sample_batch(table, 3, rng)
        for i, p in enumerate(batch.photos):
            key = (p, batch.tokens_a[i, 2], batch.tokens_b[i, 2])   # photo, slot word, slot word
            pairs[key] = pairs.get(key, 0) + 1
    assert len(pairs) == 3 * 6 and all(a != b for _, a, b in pairs)  # ordered, distinct slots
    assert 140 < min(pairs.values()) and max(pairs.values()) < 260   # expected 200, sd 13


def test_the_real_val2017_file(real_captions_path):
    coco = load_captions(real_captions_path)
    assert len(coco.image_ids) == 5000 and np.all(np.diff(coco.image_ids) > 0)
    assert sum(len(c) for c in coco.captions) == 25_005         # 25,014 less 9 repeats
    assert min(len(c) for c in coco.captions) == 4 and max(len(c) for c in coco.captions) == 7
    split = split_photos(coco.image_ids)
    assert {k: len(v) for k, v in split.items()} == {"train": 3000, "val": 1000, "test": 1000}
    # the split itself: changing it silently would change every reported number
    assert coco.image_ids[split["test"][:3]].tolist() == [139, 632, 785]
    assert coco.image_ids[split["val"][:3]].tolist() == [724, 1000, 1296]
    train_text = [c for p in split["train"] for c in coco.captions[p]]
    tok = build_tokenizer(train_text)
    assert tok.vocab_size == 5814 and build_tokenizer(train_text, min_count=2).vocab_size == 3388
    encoded = [tok.encode(c, MAX_LEN) for cs in coco.captions for c in cs]
    assert not any(cut for _, cut in encoded) and max(len(ids) for ids, _ in encoded) == 56
