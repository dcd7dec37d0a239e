import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from conftest import REAL_CAPTIONS

from minialign.data import SPLIT_SEED, sample_batch, split_photos, tokenize_photos
from minialign.machinery.run.monitor import Captions, eval_tokens, load_coco_captions
from minialign.tokenizer import EOS, MAX_LEN, PAD, build_tokenizer, clean_caption, split_words

COCO_VAL = REAL_CAPTIONS
TEST_FIRST_IDS = [139, 632, 785]    # smallest COCO ids in the val2017 test split (SPLIT_SEED)
VAL_FIRST_IDS = [724, 1000, 1296]   # smallest COCO ids in the val2017 val split


def write_json(path, data):
    path.write_text(json.dumps(data))
    return path


def ann(ann_id, image_id, caption):
    return {"id": ann_id, "image_id": image_id, "caption": caption}


# ---------------------------------------------------------------- cleaning and loading

def test_clean_caption_real_quirks():
    assert clean_caption("A man  riding\n a horse. ") == "a man riding a horse."
    assert clean_caption("  Two\tDogs\r\n") == "two dogs"
    assert clean_caption(" \n ") == ""


def test_clean_caption_unicode_and_typographic_quotes():
    # e + U+0301 combining acute (NFD, as some editors save it) -> U+00E9, the NFC form
    assert clean_caption("Cafe\u0301 Table") == "caf\u00e9 table"
    assert clean_caption("CAF\u00c9 table") == "caf\u00e9 table"
    assert clean_caption("A Dog\u2019s bed\n") == "a dog's bed"
    assert clean_caption("\u2018it\u02bcs\u2032 \u201cred\u201d") == "'it's' \"red\""
    assert clean_caption("two\u00a0dogs\u2003 sit") == "two dogs sit"    # Unicode spaces
    samples = ["Cafe\u0301", "\u0130stanbul", "A\u030a", "\u212bngstr\u00f6m", " \u201cHi\u201d "]
    for s in samples:                                                   # idempotent
        assert clean_caption(clean_caption(s)) == clean_caption(s)
    with pytest.raises(TypeError, match="must be a str"):
        clean_caption(None)


def test_captions_without_words_are_dropped_and_counted(tmp_path):
    data = {"annotations": [
        ann(1, 1, "A dog."), ann(2, 1, " . "), ann(3, 1, "?!"), ann(4, 1, ""),
        ann(5, 1, "A DOG\u2019s toy"), ann(6, 1, "a dog's toy"),        # equal after cleaning
        ann(7, 2, "Cafe\u0301"), ann(8, 2, "caf\u00e9"), ann(9, 2, "a caf\u00e9 ..."),
    ]}
    caps = load_coco_captions(write_json(tmp_path / "caps.json", data))
    assert caps.captions == (("a dog.", "a dog's toy"), ("caf\u00e9", "a caf\u00e9 ..."))
    assert caps.stats["empty_captions_dropped"] == 1
    assert caps.stats["captions_without_words_dropped"] == 2
    assert caps.stats["duplicate_captions_dropped"] == 2
    assert caps.stats["captions"] == 4
    only_punctuation = {"annotations": [ann(1, 1, " . "), ann(2, 1, "!"), ann(3, 1, "a cat")]}
    assert_error(write_json(tmp_path / "punct.json", only_punctuation), ValueError,
                 "no photo has two distinct captions with words")


def tiny_coco():
    """Photos 1-5 listed in images; captions on 1, 2, 3, 4 and unlisted photo 9."""
    annotations = [
        ann(30, 1, "A dog  runs. "),                    # repeat of id 20 after cleaning
        ann(10, 1, "A brown dog\nplays."),
        ann(20, 1, "a dog runs."),
        *[ann(46 - k, 2, f"Photo two, caption {6 - k}") for k in range(7)],  # ids reversed
        ann(50, 3, "A cat."), ann(51, 3, "a cat. "), ann(52, 3, "   "),     # 1 distinct left
        ann(60, 9, "A bird."), ann(61, 9, "Two birds."),                     # not in images
        ann(70, 4, ""), ann(71, 4, "A red car"), ann(72, 4, "A car that is red "),
        ann(73, 4, " - "),                                                    # no word
    ]
    return {"images": [{"id": i, "file_name": f"{i:012d}.jpg"} for i in range(1, 6)],
            "annotations": annotations}


def test_load_coco_captions_exact(tmp_path):
    path = write_json(tmp_path / "caps.json", tiny_coco())
    caps = load_coco_captions(path)
    assert caps.path == str(path)
    assert caps.image_ids.dtype == np.int64 and caps.image_ids.tolist() == [1, 2, 4, 9]
    assert caps.captions == (
        ("a brown dog plays.", "a dog runs."),
        tuple(f"photo two, caption {k}" for k in range(7)),
        ("a red car", "a car that is red"),
        ("a bird.", "two birds."),
    )
    assert caps.stats == {
        "raw_images": 5, "raw_annotations": 19, "raw_photos": 5,
        "empty_captions_dropped": 2, "captions_without_words_dropped": 1,
        "duplicate_captions_dropped": 2,
        "photos_dropped_under_2_captions": 1, "photos_not_in_images": 1,
        "images_without_captions": 1, "photos": 4, "captions": 13, "max_captions_per_photo": 7,
    }


def assert_error(path, exc, problem):
    with pytest.raises(exc) as err:
        load_coco_captions(path)
    assert str(path) in str(err.value) and problem in str(err.value), str(err.value)


def test_load_errors_name_file_and_problem(tmp_path):
    assert_error(tmp_path / "missing.json", FileNotFoundError, "no such file")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_error(bad, ValueError, "not a JSON file")
    cases = {
        "list.json": [ann(1, 1, "a")],
        "noann.json": {"images": []},
        "noimageid.json": {"annotations": [{"id": 1, "caption": "a"}]},
        "nocaption.json": {"annotations": [ann(1, 1, "a"), {"id": 2, "image_id": 1}]},
        "intcaption.json": {"annotations": [ann(1, 1, 5)]},
        "strid.json": {"annotations": [ann(1, "7", "a")]},
        "one.json": {"annotations": [ann(1, 1, "a dog"), ann(2, 1, "A dog "), ann(3, 2, "x")]},
    }
    problems = {
        "list.json": "no 'annotations' list", "noann.json": "no 'annotations' list",
        "noimageid.json": "annotation 0 has no 'image_id'",
        "nocaption.json": "annotation 1 has no 'caption'",
        "intcaption.json": "caption is not a string",
        "strid.json": "non-integer 'image_id'",
        "one.json": "no photo has two distinct",
    }
    for name, data in cases.items():
        assert_error(write_json(tmp_path / name, data), ValueError, problems[name])


# ---------------------------------------------------------------- split

def test_split_sizes_and_dependence_on_id_set_only():
    ids = np.arange(100_000, 110_000, dtype=np.int64) * 3
    split = split_photos(ids)
    assert {k: len(v) for k, v in split.items()} == {"train": 8000, "val": 1000, "test": 1000}
    assert np.array_equal(np.sort(np.concatenate(list(split.values()))), np.arange(10_000))
    # the same ids in another order select the same photos
    order = np.random.default_rng(1).permutation(len(ids))
    shuffled = split_photos(ids[order])
    for name in split:
        assert np.all(np.diff(shuffled[name]) > 0)
        assert np.array_equal(np.sort(ids[order][shuffled[name]]), ids[split[name]])
    other = split_photos(ids, split_seed=SPLIT_SEED + 1)
    assert not np.array_equal(other["val"], split["val"])
    assert {k: len(v) for k, v in split_photos(ids[:15]).items()} == \
        {"train": 9, "val": 3, "test": 3}
    assert [len(v) for v in split_photos(ids[:20], n_val=4, n_test=5).values()] == [11, 4, 5]
    with pytest.raises(ValueError, match="at least 3"):
        split_photos(ids[:14])
    with pytest.raises(ValueError, match="distinct"):
        split_photos(np.array([1, 2, 2, 3] * 5))


# ---------------------------------------------------------------- table and sampler

def toy_captions(n_photos=20, seed=0):
    """Photo p has 2..7 distinct captions of 1..12 words; every caption text is unique."""
    rng = np.random.default_rng(seed)
    captions = []
    for p in range(n_photos):
        n = int(rng.integers(2, 8)) if p != 2 else 7
        captions.append(tuple(f"photo {p} caption {k}" + " w" * int(rng.integers(0, 10))
                              for k in range(n)))
    return Captions(path="toy", image_ids=np.arange(n_photos, dtype=np.int64) * 10,
                    captions=tuple(captions), stats={})


def toy_table():
    caps = toy_captions()
    tok = build_tokenizer([c for cs in caps.captions for c in cs])
    table, n_truncated = tokenize_photos(caps, np.arange(2, 20), tok)
    assert n_truncated == 0
    return caps, tok, table


def test_tokenize_photos_layout():
    caps, tok, table = toy_table()
    assert table.photo_idx.tolist() == list(range(2, 20))
    assert table.counts.tolist() == [len(caps.captions[p]) for p in range(2, 20)]
    assert table.offsets[0] == 0 and np.array_equal(table.offsets[1:], np.cumsum(table.counts)[:-1])
    p = 5                                           # table photo 5 is Captions photo 7
    for slot, caption in enumerate(caps.captions[7]):
        row = table.tokens[table.offsets[p] + slot]
        assert tok.decode(row) == caption
        assert table.lengths[table.offsets[p] + slot] == len(split_words(caption)) + 2
    assert table.tokens.shape[1] == table.lengths.max()
    _, n_truncated = tokenize_photos(caps, np.arange(20), tok, max_len=6)
    assert n_truncated == sum(len(split_words(c)) + 2 > 6 for cs in caps.captions for c in cs) > 0
    with pytest.raises(ValueError, match="distinct"):
        tokenize_photos(caps, np.array([1, 1]), tok)


def check_padded(tokens):
    """PAD only after EOS, never inside a caption; returns each row's length."""
    lengths = (tokens != PAD).sum(axis=1)
    for row, n in zip(tokens, lengths):
        assert np.all(row[n:] == PAD) and row[n - 1] == EOS
    return lengths


def test_sample_batch_pairs_distinct_captions_of_one_photo():
    caps, tok, table = toy_table()
    batch = sample_batch(table, 12, np.random.default_rng(3))
    assert batch.photos.dtype == np.int64 and len(np.unique(batch.photos)) == 12
    assert batch.tokens_a.dtype == batch.tokens_b.dtype == np.int32
    assert batch.tokens_a.shape == batch.tokens_b.shape and batch.tokens_a.shape[0] == 12
    for i, p in enumerate(batch.photos):
        photo_caps = caps.captions[table.photo_idx[p]]
        text_a, text_b = tok.decode(batch.tokens_a[i]), tok.decode(batch.tokens_b[i])
        assert text_a in photo_caps and text_b in photo_caps and text_a != text_b
    lengths = np.concatenate([check_padded(batch.tokens_a), check_padded(batch.tokens_b)])
    assert batch.tokens_a.shape[1] == lengths.max()   # trimmed to the batch's longest
    batch.tokens_a[:] = PAD                            # batches are copies, not table views
    assert np.all(table.tokens[:, 0] != PAD)


def test_sample_batch_determinism():
    _, _, table = toy_table()
    a = sample_batch(table, 8, np.random.default_rng(42))
    b = sample_batch(table, 8, np.random.default_rng(42))
    c = sample_batch(table, 8, np.random.default_rng(43))
    for name in ("photos", "tokens_a", "tokens_b"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.photos, c.photos)
    with pytest.raises(ValueError, match="batch_photos"):
        sample_batch(table, 19, np.random.default_rng(0))


def test_sample_batch_slot_pairs_uniform():
    caps = Captions(path="toy", image_ids=np.arange(3, dtype=np.int64),
                    captions=tuple((f"p{p} zero", f"p{p} one", f"p{p} two") for p in range(3)),
                    stats={})
    tok = build_tokenizer([c for cs in caps.captions for c in cs])
    table, _ = tokenize_photos(caps, np.arange(3), tok)
    rng = np.random.default_rng(0)
    pairs = {}
    for _ in range(3000):                # every photo every time: 3000 pair draws per photo
        batch = sample_batch(table, 3, rng)
        for i, p in enumerate(batch.photos):
            key = (p, tok.decode(batch.tokens_a[i]), tok.decode(batch.tokens_b[i]))
            pairs[key] = pairs.get(key, 0) + 1
    assert len(pairs) == 3 * 6           # all ordered pairs of distinct slots, no a == b
    assert all(a != b for _, a, b in pairs)
    assert 400 < min(pairs.values()) and max(pairs.values()) < 600   # expected 500, sd 20


def test_eval_tokens_slots():
    caps, tok, table = toy_table()
    tokens, photos = eval_tokens(table, 0)
    assert photos.tolist() == list(range(18)) and tokens.dtype == np.int32
    assert tokens.shape[1] == check_padded(tokens).max()
    tokens, photos = eval_tokens(table, 5)
    assert photos.tolist() == np.flatnonzero(table.counts >= 6).tolist() and len(photos) > 0
    assert [tok.decode(t) for t in tokens] == [caps.captions[table.photo_idx[p]][5] for p in photos]
    with pytest.raises(ValueError, match="more than 7"):
        eval_tokens(table, 7)


# ---------------------------------------------------------------- the real COCO val2017 file

@pytest.fixture(scope="module")
def coco():
    if not COCO_VAL.is_file():
        pytest.skip(f"real COCO captions not found at {COCO_VAL}")
    return load_coco_captions(COCO_VAL)


def test_real_file_counts(coco):
    assert len(coco.image_ids) == 5000 and np.all(np.diff(coco.image_ids) > 0)
    assert coco.stats["raw_annotations"] == 25_014
    # 9 captions repeat another caption of their photo once whitespace and case are cleaned
    assert coco.stats["duplicate_captions_dropped"] == 9
    assert coco.stats["captions"] == sum(len(c) for c in coco.captions) == 25_005
    assert coco.stats["empty_captions_dropped"] == coco.stats["photos_dropped_under_2_captions"] == 0
    assert coco.stats["captions_without_words_dropped"] == 0      # every COCO caption has words
    assert min(len(c) for c in coco.captions) == 4 and coco.stats["max_captions_per_photo"] == 7
    assert all(c == clean_caption(c) for cs in coco.captions for c in cs)


def test_real_file_split(coco):
    split = split_photos(coco.image_ids)
    assert {k: len(v) for k, v in split.items()} == {"train": 3000, "val": 1000, "test": 1000}
    assert np.array_equal(np.sort(np.concatenate(list(split.values()))), np.arange(5000))
    np.random.default_rng(0).random(100)      # a training seed's draws do not reach the split
    again = split_photos(coco.image_ids.copy())
    assert all(np.array_equal(split[k], again[k]) for k in split)
    # pin the split itself: changing it silently would change every reported number
    assert coco.image_ids[split["test"][:3]].tolist() == TEST_FIRST_IDS
    assert coco.image_ids[split["val"][:3]].tolist() == VAL_FIRST_IDS


def test_real_file_tokenizer(coco):
    split = split_photos(coco.image_ids)
    train_text = [c for p in split["train"] for c in coco.captions[p]]
    tok = build_tokenizer(train_text)
    assert tok.vocab_size == 5814 and build_tokenizer(train_text, min_count=2).vocab_size == 3388
    encoded = [tok.encode(c, MAX_LEN) for cs in coco.captions for c in cs]
    seqs, n_truncated = [ids for ids, _ in encoded], sum(cut for _, cut in encoded)
    assert n_truncated == 0 and max(len(s) for s in seqs) == 56


# ---------------------------------------------------------------- captions as people save them
SAVED = {"images": [{"id": 7}, {"id": 9}], "annotations": [
    ann(1, 7, "A Caf\u00e9 with cr\u00e8me br\u00fbl\u00e9e"),
    ann(2, 7, "na\u00efve  Zo\u00eb\u2019s cat "), ann(3, 9, "Two\tdogs on a jalape\u00f1o"),
    ann(4, 9, "a dog.\r\n"), ann(5, 9, "\u00c5ngstr\u00f6m")]}
PRETTY = json.dumps(SAVED, ensure_ascii=False, indent=2)
EDITORS = {                            # how editors and tools on Windows and macOS save it
    "UTF-8, no escapes": PRETTY.encode(),
    "UTF-8 with BOM (Notepad)": b"\xef\xbb\xbf" + PRETTY.encode(),
    "UTF-8 with BOM, CRLF": b"\xef\xbb\xbf" + PRETTY.replace("\n", "\r\n").encode(),
    "UTF-16 LE with BOM (Notepad 'Unicode')": b"\xff\xfe" + PRETTY.encode("utf-16-le"),
    "UTF-16 BE with BOM": b"\xfe\xff" + PRETTY.encode("utf-16-be"),
    "UTF-16 LE without BOM": PRETTY.encode("utf-16-le"),
    "UTF-32 LE with BOM": b"\xff\xfe\x00\x00" + PRETTY.encode("utf-32-le"),
    "CRLF": PRETTY.replace("\n", "\r\n").encode(),
    "CR (classic Mac)": PRETTY.replace("\n", "\r").encode(),
    "tabs, trailing blank lines": (json.dumps(SAVED, ensure_ascii=False, indent="\t")
                                   + "\n \t\n").encode(),
    "NFD (macOS)": unicodedata.normalize("NFD", PRETTY).encode(),
}


@pytest.mark.parametrize("name", EDITORS)
def test_captions_load_alike_however_an_editor_saved_them(name, tmp_path):
    """The same captions in any encoding JSON allows (UTF-8/16/32, BOM or none), any line
    ending, NFC or NFD: exactly the captions json.dumps's file gives."""
    python = load_coco_captions(write_json(tmp_path / "python.json", SAVED))
    assert python.captions == (("a caf\u00e9 with cr\u00e8me br\u00fbl\u00e9e",
                                "na\u00efve zo\u00eb's cat"),
                               ("two dogs on a jalape\u00f1o", "a dog.", "\u00e5ngstr\u00f6m"))
    (tmp_path / "saved.json").write_bytes(EDITORS[name])
    saved = load_coco_captions(tmp_path / "saved.json")
    assert saved.captions == python.captions and saved.stats == python.stats
    assert saved.image_ids.tolist() == python.image_ids.tolist() == [7, 9]


def test_a_latin1_captions_file_is_refused_in_one_line(tmp_path):
    """cp1252 / Latin-1 ("ANSI") bytes are not UTF-8: refused, not guessed (the same bytes in
    another 8-bit code page are other captions)."""
    path = tmp_path / "ansi.json"
    path.write_bytes(PRETTY.encode("cp1252"))
    offset = PRETTY.encode("cp1252").index(b"\xe9")
    assert_error(path, ValueError, f"{path}: not a COCO captions JSON file: byte 0xe9 at offset "
                                   f"{offset} is not UTF-8 (saved as Latin-1 / cp1252 / 'ANSI'? "
                                   f"save it as UTF-8)")
    path.write_bytes(b"\xff\xfe" + PRETTY.encode("utf-16-le")[:-1])   # cut mid-character
    assert_error(path, ValueError, "is not UTF-16 (cut short or damaged?)")


def test_a_run_trains_alike_on_captions_saved_by_notepad_or_macos(tmp_path, capsys):
    """`train` on a world's captions as json.dumps wrote them, and on the same captions saved
    as Notepad's "Unicode" (UTF-16 LE with BOM), CRLF, accents in NFD, tab indents: the same
    losses at every step and the same final metrics, exactly. The same captions in cp1252 bytes
    are one line, exit 2, nothing written."""
    from minialign.__main__ import main
    from minialign.machinery.images.synthetic import write_world
    captions, _ = write_world(tmp_path / "world", n_scenes=120, seed=0, world="v1")
    coco = json.loads(Path(captions).read_text())
    for k, a in enumerate(coco["annotations"][:60]):          # accented words in some captions
        a["caption"] += " " + ("caf\u00e9", "cr\u00e8me br\u00fbl\u00e9e", "na\u00efve")[k % 3]
    text = json.dumps(coco, ensure_ascii=False, indent="\t")
    files = {"python": json.dumps(coco).encode(),
             "notepad": b"\xff\xfe" + unicodedata.normalize("NFD", text).replace(
                 "\n", "\r\n").encode("utf-16-le")}
    runs = {}
    for name, data in files.items():
        (tmp_path / f"{name}.json").write_bytes(data)
        out = tmp_path / name
        assert main(["train", "--objective", "bad_views", "--captions", str(tmp_path /
                     f"{name}.json"), "--out", str(out), "--steps", "4", "--batch-photos", "16",
                     "--warmup-steps", "1", "--eval-every", "2", "--d-model", "16",
                     "--n-layers", "1", "--n-heads", "2", "--threads", "1"]) in (0, None)
        rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        info = json.loads((out / "config.json").read_text())["info"]
        runs[name] = ([{k: v for k, v in r.items() if k != "seconds"} for r in rows],
                      json.loads((out / "metrics.json").read_text())["final"],
                      {k: v for k, v in info.items() if k != "captions_sha256"})
    assert runs["notepad"] == runs["python"] and len(runs["python"][0]) == 4
    assert runs["python"][2]["vocab_size"] > 100
    capsys.readouterr()
    (tmp_path / "ansi.json").write_bytes(text.encode("cp1252"))
    assert main(["train", "--objective", "bad_views", "--captions", str(tmp_path / "ansi.json"),
                 "--out", str(tmp_path / "ansi")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"minialign train: error: {tmp_path / 'ansi.json'}: not a COCO "
                          f"captions JSON file: byte 0xe9 at offset ") and err.count("\n") == 1
    assert not (tmp_path / "ansi").exists()
