"""Captions -> split -> tables -> batches (data.py): the loader and its one-line errors, the split
by photo, the sampler's pairs; the real val2017 file (../shared) pinned where it matters."""
import csv
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
        *[ann(46 - k, 2, f"Photo two, caption {k}") for k in range(7)],   # ids reversed
        ann(50, 3, "A cat."), ann(51, 3, "a cat. "), ann(52, 3, " . "),       # 1 distinct left
        ann(71, 4, "A Caf\u0065\u0301 \u2019red\u2019"), ann(73, 4, " - "),
        ann(72, 4, "A car that is red "), ann(60, 9, "A bird."), {"image_id": 9, "caption": "x"}]}))
    caps = load_captions(path)
    assert caps.path == str(path)
    assert caps.image_ids.dtype == np.int64 and caps.image_ids.tolist() == [1, 2, 4, 9]
    assert caps.captions == (("a dog runs.", "a brown dog plays."),        # file order, not ids
                             tuple(f"photo two, caption {k}" for k in range(7)),
                             ("a caf\u00e9 'red'", "a car that is red"), ("a bird.", "x"))


ROWS = [(100 + p // 3, f'Photo {p // 3}, caption {p % 3}: a "dog" at the caf\u00e9')
        for p in range(60)]


def test_coco_json_csv_and_jsonl_give_the_same_tables(tmp_path):
    coco = tmp_path / "c.json"                          # no annotation ids: file order
    coco.write_text(json.dumps({"annotations": [{"image_id": i, "caption": c} for i, c in ROWS]}))
    lines = [json.dumps({"caption": c, "image_id": str(i)}, ensure_ascii=False) for i, c in ROWS]
    (tmp_path / "c.jsonl").write_text("\ufeff" + "\n\n".join(lines) + "\n", encoding="utf-8")
    with open(tmp_path / "c.csv", "w", encoding="utf-8-sig", newline="") as f:  # BOM, \r\n
        f.write("file,caption,image_id\r\n\r\n")
        csv.writer(f).writerows((f"{i}.jpg", c, i) for i, c in ROWS)      # "a, ""dog""" quoted
    loaded = [load_captions(tmp_path / name) for name in ("c.json", "c.jsonl", "c.csv")]
    assert all(c.captions == loaded[0].captions and np.array_equal(c.image_ids, loaded[0].image_ids)
               for c in loaded) and len(loaded[0].image_ids) == 20
    assert loaded[0].captions[0][1] == 'photo 0, caption 1: a "dog" at the caf\u00e9'
    tok = build_tokenizer([c for cs in loaded[0].captions for c in cs])
    tables = [tokenize_photos(c, split_photos(c.image_ids)["train"], tok)[0] for c in loaded]
    for t in tables[1:]:
        assert all(np.array_equal(getattr(t, k), getattr(tables[0], k))
                   for k in ("photo_idx", "tokens", "lengths", "offsets", "counts"))


@pytest.mark.parametrize("name, content, error", [
    ("c.csv", "image_id,caption\n1,a dog\n2\n", ":3: expected 2 columns (image_id,caption), got 1"),
    ("c.csv", "image_id,caption\n1,a dog, brown\n", ":2: expected 2 columns (image_id,caption), "
     "got 3 (a caption with a comma goes in quotes)"),
    ("c.csv", 'image_id,caption\n1,"a\ndog"\n\n1.5,b\n', ":5: expected an image_id of digits, "
     "got '1.5'"),
    ("c.csv", "\ufeffimage_id,caption\r\n1,a dog\r\n2,\r\n", ":3: expected a caption, got ''"),
    ("c.csv", "photo,text\n1,a\n", ":1: expected a header naming the columns image_id and "
     "caption, got 'photo,text'"),
    ("c.csv", 'image_id,caption\n1,"a dog\n2,b\n', ":3: expected CSV (unexpected end of data)"),
    ("c.jsonl", '{"image_id": 1, "caption": "a"}\n\n{"image_id": 2}\n',
     ":3: expected a caption, got None"),
    ("c.jsonl", '\ufeff{"image_id": "1", "caption": "a"}\n{"image_id": "x1", "caption": "b"}',
     ":2: expected an image_id of digits, got 'x1'"),
    ("c.jsonl", '{"image_id": true, "caption": "a"}', ":1: expected an image_id of digits, "
     "got True"),
    ("c.jsonl", '{"image_id": 1, "caption": " "}', ":1: expected a caption, got ' '"),
    ("c.jsonl", '\n{"image_id": 1 "caption": "a"}', ":2: expected JSON (Expecting ',' delimiter "
     "at column 16)"),
    ("c.jsonl", "[1, 2]", ':1: expected {"image_id": 139, "caption": "A dog runs."}, got [1, 2]'),
    ("c.json", '{"annotations":\n [1,,]}', ":2: expected JSON (Expecting value at column 5)"),
    ("c.json", '{"images": []}', ': expected COCO\'s {"annotations": [{"image_id": 139, '
     '"caption": "A dog runs."}, ...]}'),
    ("c.json", json.dumps({"annotations": [ann(1, 1, "a"), {"id": 2, "caption": "b"}]}),
     ": annotations[1]: expected an image_id of digits, got None"),
    ("c.json", '{"annotations": [{"image_id": 1, "caption": "caf\u00e9"}]}', ": expected UTF-8 "
     "text ('utf-8' codec can't decode byte 0xe9 in position 48: invalid continuation byte)"),
    ("c.txt", "image_id,caption\n1,a\n", ": expected a captions file ending in .json (COCO), "
     ".jsonl or .csv")])
def test_a_bad_captions_file_is_one_line_naming_it(tmp_path, name, content, error):
    path = tmp_path / name
    path.write_bytes(content.encode("cp1252" if "\u00e9" in content else "utf-8"))  # Latin-1
    with pytest.raises(ValueError) as err:
        load_captions(path)
    assert str(err.value) == f"{path}{error}"
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
