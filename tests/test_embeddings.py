"""The embeddings file format: exact round trip, every refusal names the file, atomic writes."""
import hashlib
import json

import numpy as np
import pytest

from minialign.machinery.images.embeddings import (describe_join, join_on_ids, load_embeddings,
                                                   save_embeddings, sha256_file)

META = {"model": "test-model", "preprocessing": {"size": {"shortest_edge": 64}},
        "pooling": "CLS token of last_hidden_state (after final LayerNorm)",
        "captions_sha256": "0" * 64}


def example_arrays(n=4, d=3):
    rng = np.random.default_rng(0)
    image_ids = np.array([139, 802, 11813, 431848][:n], dtype=np.int64)   # (n,)
    embeddings = rng.standard_normal((n, d)).astype(np.float32)           # (n, d)
    return image_ids, embeddings


def write_raw(path, image_ids, embeddings, meta):
    """An .npz laid out like ours but written without save_embeddings' checks."""
    np.savez(path, image_ids=image_ids, embeddings=embeddings, meta=np.array(json.dumps(meta)))
    return path


def full_meta(embeddings):
    return {**META, "dtype": "float32", "count": int(embeddings.shape[0]),
            "dim": int(embeddings.shape[1])}


def test_round_trip_is_exact(tmp_path):
    image_ids, embeddings = example_arrays()
    path = save_embeddings(tmp_path / "e.npz", image_ids, embeddings, META)
    emb = load_embeddings(path)
    assert emb.path == path
    assert emb.image_ids.dtype == np.int64 and emb.embeddings.dtype == np.float32
    np.testing.assert_array_equal(emb.image_ids, image_ids)
    assert emb.embeddings.tobytes() == embeddings.tobytes()
    assert emb.meta == full_meta(embeddings)
    assert not emb.embeddings.flags.writeable and not emb.image_ids.flags.writeable
    assert list(tmp_path.iterdir()) == [path]          # no temporary file left over


def test_same_arrays_give_same_bytes(tmp_path):
    image_ids, embeddings = example_arrays()
    a = save_embeddings(tmp_path / "a.npz", image_ids, embeddings, META)
    b = save_embeddings(tmp_path / "b.npz", image_ids, embeddings, META)
    assert sha256_file(a) == sha256_file(b)


def test_float64_is_stored_as_float32(tmp_path):
    image_ids, embeddings = example_arrays()
    emb = load_embeddings(save_embeddings(tmp_path / "e.npz", image_ids,
                                          embeddings.astype(np.float64), META))
    assert emb.embeddings.dtype == np.float32 and emb.meta["dtype"] == "float32"


def test_existing_file_is_refused_and_untouched(tmp_path):
    image_ids, embeddings = example_arrays()
    path = save_embeddings(tmp_path / "e.npz", image_ids, embeddings, META)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="e.npz"):
        save_embeddings(path, image_ids, embeddings + 1, META)
    assert path.read_bytes() == before
    save_embeddings(path, image_ids, embeddings + 1, META, force=True)
    np.testing.assert_array_equal(load_embeddings(path).embeddings, embeddings + 1)


@pytest.mark.parametrize("case", ["nan_row", "duplicate_ids", "wrong_rank", "int_dtype",
                                  "row_mismatch", "meta_missing_key", "meta_count_wrong",
                                  "meta_not_json"])
def test_save_refuses_bad_input_and_leaves_old_file(tmp_path, case):
    image_ids, embeddings = example_arrays()
    path = save_embeddings(tmp_path / "e.npz", image_ids, embeddings, META)
    before = path.read_bytes()
    meta = dict(META)
    if case == "nan_row":
        embeddings = embeddings.copy(); embeddings[1, 0] = np.nan
    elif case == "duplicate_ids":
        image_ids = image_ids.copy(); image_ids[2] = image_ids[0]
    elif case == "wrong_rank":
        embeddings = embeddings[:, :, None]
    elif case == "int_dtype":
        embeddings = embeddings.astype(np.int32)
    elif case == "row_mismatch":
        image_ids = image_ids[:-1]
    elif case == "meta_missing_key":
        del meta["pooling"]
    elif case == "meta_count_wrong":
        meta["count"] = 99
    elif case == "meta_not_json":
        meta["model"] = object()
    with pytest.raises(ValueError, match="e.npz"):
        save_embeddings(path, image_ids, embeddings, meta, force=True)
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]          # no temporary file left over


def test_save_refusal_writes_nothing(tmp_path):
    image_ids, embeddings = example_arrays()
    embeddings[0, 0] = np.inf
    with pytest.raises(ValueError, match="1 of 4 embedding rows"):
        save_embeddings(tmp_path / "e.npz", image_ids, embeddings, META)
    assert list(tmp_path.iterdir()) == []


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.npz"):
        load_embeddings(tmp_path / "nothere.npz")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "flipped_byte", "npy"])
def test_corrupt_file(tmp_path, damage):
    image_ids, embeddings = example_arrays()
    good = save_embeddings(tmp_path / "good.npz", image_ids, embeddings, META).read_bytes()
    path = tmp_path / "bad.npz"
    if damage == "garbage":
        path.write_bytes(b"definitely not a zip archive" * 10)
    elif damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "flipped_byte":  # inside the first entry's data: the CRC check fails
        path.write_bytes(good[:150] + bytes([good[150] ^ 0xFF]) + good[151:])
    elif damage == "npy":
        with open(path, "wb") as f:
            np.save(f, embeddings)
    with pytest.raises(ValueError, match="bad.npz"):
        load_embeddings(path)


@pytest.mark.parametrize("case, message", [
    ("nan_row", "2 of 4 embedding rows hold NaN or Inf"),
    ("wrong_rank", "must be 2-D"),
    ("int_dtype", "must be floating point"),
    ("dim_mismatch", "dim"),
    ("count_mismatch", "count"),
    ("duplicate_ids", "occur more than once"),
    ("ids_rank", "1-D integer"),
    ("missing_key", "lacks arrays ['image_ids']"),
    ("meta_missing_key", "meta lacks"),
    ("meta_not_json", "not valid JSON"),
    ("meta_pickled", "cannot read"),
])
def test_load_refuses_bad_content(tmp_path, case, message):
    image_ids, embeddings = example_arrays()
    meta = full_meta(embeddings)
    path = tmp_path / "bad.npz"
    if case == "nan_row":
        embeddings[1, 2], embeddings[3, 0] = np.nan, np.inf
    elif case == "wrong_rank":
        embeddings = embeddings.reshape(4, 3, 1)
    elif case == "int_dtype":
        embeddings, meta["dtype"] = embeddings.astype(np.int32), "int32"
    elif case == "dim_mismatch":
        meta["dim"] = 768
    elif case == "count_mismatch":
        meta["count"] = 5
    elif case == "duplicate_ids":
        image_ids[3] = image_ids[1]
    elif case == "ids_rank":
        image_ids = image_ids.reshape(2, 2)
    elif case == "meta_missing_key":
        del meta["captions_sha256"]
    if case == "missing_key":           # a file without meta is accepted (see below)
        np.savez(path, embeddings=embeddings, meta=np.array(json.dumps(meta)))
    elif case == "meta_not_json":
        np.savez(path, image_ids=image_ids, embeddings=embeddings, meta=np.array("{not json"))
    elif case == "meta_pickled":
        np.savez(path, image_ids=image_ids, embeddings=embeddings,
                 meta=np.array(meta, dtype=object))
    else:
        write_raw(path, image_ids, embeddings, meta)
    with pytest.raises(ValueError, match="bad.npz") as info:
        load_embeddings(path)
    assert message in str(info.value)


def test_join_reports_one_sided_ids(tmp_path):
    image_ids, embeddings = example_arrays()                 # ids 139, 802, 11813, 431848
    emb = load_embeddings(save_embeddings(tmp_path / "e.npz", image_ids, embeddings, META))
    caption_image_ids = np.array([802, 5, 139, 802, 7, 431848])  # 5, 7: no embedding
    caption_index, emb_index, report = join_on_ids(caption_image_ids, emb)
    np.testing.assert_array_equal(caption_index, [0, 2, 3, 5])
    np.testing.assert_array_equal(caption_image_ids[caption_index], emb.image_ids[emb_index])
    assert report == {"file": str(tmp_path / "e.npz"), "matched_captions": 4,
                      "matched_images": 3, "caption_ids_only": 2,
                      "caption_ids_only_examples": [5, 7], "embedding_ids_only": 1,
                      "embedding_ids_only_examples": [11813]}
    assert "4 captions of 3 photos" in describe_join(report)


def test_join_without_common_ids_names_file(tmp_path):
    image_ids, embeddings = example_arrays()
    emb = load_embeddings(save_embeddings(tmp_path / "e.npz", image_ids, embeddings, META))
    with pytest.raises(ValueError, match="e.npz"):
        join_on_ids(np.array([1, 2, 3]), emb)


def test_sha256_file_matches_hashlib(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(bytes(range(256)) * 5000)               # > 1 MiB: several chunks
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("ids_dtype, emb_dtype", [(np.int64, np.float32), (np.int32, np.float16),
                                                  (np.uint32, np.float64), (np.uint64, np.float32)])
def test_file_without_meta_from_another_tool_is_read_with_a_note(tmp_path, capsys, ids_dtype,
                                                                  emb_dtype):
    image_ids, embeddings = example_arrays()
    path = tmp_path / "plain.npz"
    np.savez(path, image_ids=image_ids.astype(ids_dtype), embeddings=embeddings.astype(emb_dtype))
    emb = load_embeddings(path)
    name = np.dtype(emb_dtype).name
    assert capsys.readouterr().err == (f"note: {path}: has no meta entry (model, preprocessing "
                                       f"unknown); using its 4 x 3 {name} embeddings as float32\n")
    assert emb.meta == {"model": "unknown (no meta in file)", "revision": None,
                        "preprocessing": None, "pooling": None, "captions_sha256": None, "dtype": name,
                        "count": 4, "dim": 3}
    assert emb.image_ids.dtype == np.int64 and emb.embeddings.dtype == np.float32
    np.testing.assert_array_equal(emb.image_ids, image_ids)
    np.testing.assert_array_equal(emb.embeddings, embeddings.astype(emb_dtype).astype(np.float32))


@pytest.mark.parametrize("emb_dtype", [np.float16, np.float64])
def test_float16_and_float64_with_meta_are_cast_to_float32(tmp_path, emb_dtype):
    image_ids, embeddings = example_arrays()
    meta = {**full_meta(embeddings), "dtype": np.dtype(emb_dtype).name}
    path = write_raw(tmp_path / "e.npz", image_ids.astype(np.int32), embeddings.astype(emb_dtype),
                     meta)
    emb = load_embeddings(path)
    assert emb.embeddings.dtype == np.float32 and emb.meta["dtype"] == np.dtype(emb_dtype).name
    np.testing.assert_array_equal(emb.embeddings, embeddings.astype(emb_dtype).astype(np.float32))


@pytest.mark.parametrize("case, message", [
    ("nan_row", "1 of 4 embedding rows hold NaN or Inf (image ids [802] ...)"),
    ("wrong_rank", "embeddings must be 2-D (N, D), got shape (4, 3, 1)"),
    ("length_mismatch", "4 image_ids but 3 embedding rows"),
    ("duplicate_ids", "1 image ids occur more than once (e.g. [802])"),
    ("int_embeddings", "embeddings must be floating point, got dtype int32"),
    ("float_ids", "image_ids must be a 1-D integer array, got shape (4,) dtype float64"),
    ("no_embeddings", "lacks arrays ['embeddings'] (has ['image_ids'])"),
    ("meta_malformed", "meta must be a JSON object, got list"),
])
def test_file_without_meta_is_still_checked(tmp_path, capsys, case, message):
    image_ids, embeddings = example_arrays()
    arrays = {"image_ids": image_ids, "embeddings": embeddings}
    if case == "nan_row":
        embeddings[1, 0] = np.nan
    elif case == "wrong_rank":
        arrays["embeddings"] = embeddings.reshape(4, 3, 1)
    elif case == "length_mismatch":
        arrays["embeddings"] = embeddings[:3]
    elif case == "duplicate_ids":
        image_ids[3] = image_ids[1]
    elif case == "int_embeddings":
        arrays["embeddings"] = embeddings.astype(np.int32)
    elif case == "float_ids":
        arrays["image_ids"] = image_ids.astype(np.float64)
    elif case == "no_embeddings":
        del arrays["embeddings"]
    elif case == "meta_malformed":                       # present but wrong: never "no meta"
        arrays["meta"] = np.array("[1, 2]")
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError) as info:
        load_embeddings(path)
    assert str(info.value) == f"{path}: {message}"
    assert capsys.readouterr().err == ""                  # refused before any note
