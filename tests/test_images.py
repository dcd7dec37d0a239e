"""Tests of machinery/images.py: the embeddings file, the join by image id, and the image
scores of saved caption embeddings (exact against metrics.py on inputs with ties and repeated
rows), on hand-made arrays and on a tiny trained run."""
import json
import shutil

import numpy as np
import pytest

from minialign.machinery import images
from minialign.machinery.runs import load_caption_slots
from minialign.metrics import (collapse_stats, fit_procrustes, mutual_knn, paraphrase_r_at_1,
                               rotated_recall)
from minialign.model import ModelConfig
from minialign.train import TrainConfig, train

META = {"model": "test", "count": 5, "dim": 3}


def write_embeddings(path, ids, emb, meta=META):
    arrays = {"image_ids": ids, "embeddings": emb}
    if meta is not None:
        arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    return path


def example():
    ids = np.array([802, 139, 11813, 431848, 5], dtype=np.int64)              # not sorted
    return ids, np.arange(15, dtype=np.float32).reshape(5, 3) - 4.5


@pytest.mark.parametrize("ids_dtype, emb_dtype, meta", [
    (np.int64, np.float32, META), (np.int32, np.float16, None), (np.uint64, np.float64, None)])
def test_load_sorts_rows_by_id_as_int64_float32_read_only(tmp_path, ids_dtype, emb_dtype, meta):
    """Also a file of another tool: other dtypes, no meta."""
    ids, emb = example()
    e = images.load_embeddings(write_embeddings(tmp_path / "e.npz", ids.astype(ids_dtype),
                                                emb.astype(emb_dtype), meta))
    order = np.argsort(ids)
    np.testing.assert_array_equal(e.image_ids, ids[order])
    np.testing.assert_array_equal(e.embeddings, emb[order].astype(emb_dtype).astype(np.float32))
    assert e.image_ids.dtype == np.int64 and e.embeddings.dtype == np.float32
    assert e.meta == (meta or {}) and not (e.embeddings.flags.writeable or
                                           e.image_ids.flags.writeable)


@pytest.mark.parametrize("case, message", [
    ("garbage", "not an .npz (zip) archive"), ("truncated", "not an .npz (zip) archive"),
    ("npy", "not an .npz (zip) archive"), ("meta_not_json", "meta must be"),
    ("meta_list", "meta must be"), ("meta_pickled", "cannot read"),
    ("nan_row", "2 of 5 embedding rows hold NaN or Inf"),
    ("repeated", "occur more than once (e.g. [139])"),
    ("no_ids", "got embeddings (5, 3) float32, meta's"), ("rank", "embeddings (5, 3, 1) float32"),
    ("int_embeddings", "embeddings (5, 3) int32"), ("rows", "embeddings (4, 3) float32"),
    ("float_ids", "got image_ids (5,) float64"), ("count", "count = 6, dim = 3"),
    ("dim", "count = 5, dim = 768"),
])
def test_a_bad_file_is_one_line_naming_it(tmp_path, case, message):
    ids, emb = example()
    path, arrays, meta = tmp_path / "bad.npz", {"image_ids": ids, "embeddings": emb}, dict(META)
    arrays.update({"rank": {"embeddings": emb.reshape(5, 3, 1)}, "rows": {"embeddings": emb[:4]},
                   "int_embeddings": {"embeddings": emb.astype(np.int32)},
                   "float_ids": {"image_ids": ids.astype(float)},
                   "repeated": {"image_ids": np.array([802, 139, 7, 139, 5])}}.get(case, {}))
    if case == "nan_row":
        emb[1, 2], emb[3, 0] = np.nan, np.inf
    meta.update({"count": {"count": 6}, "dim": {"dim": 768}}.get(case, {}))
    good = write_embeddings(tmp_path / "good.npz", ids, emb).read_bytes()
    if case in ("garbage", "truncated"):
        path.write_bytes(b"not a zip" * 9 if case == "garbage" else good[:len(good) // 2])
    elif case == "npy":
        with open(path, "wb") as f:
            np.save(f, emb)
    elif case.startswith("meta_"):
        np.savez(path, meta={"meta_not_json": np.array("{not json"), "meta_list": np.array(
            "[1, 2]"), "meta_pickled": np.array(META, dtype=object)}[case], **arrays)
    elif case == "no_ids":
        np.savez(path, embeddings=emb, meta=np.array(json.dumps(META)))
    else:
        write_embeddings(path, arrays["image_ids"], arrays["embeddings"], meta)
    with pytest.raises(ValueError) as info:
        images.load_embeddings(path)
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)
    with pytest.raises(FileNotFoundError, match="absent.npz: no such embeddings file"):
        images.load_embeddings(tmp_path / "absent.npz")


def slots_of(ids, zs, rng):
    """Saved-file slots: each slot lists its photos in its own order."""
    out = []
    for z in zs:
        order = rng.permutation(len(z))
        out.append((ids[order], z[order].astype(np.float32)))
    return out


def test_captions_that_are_their_images_score_one_whatever_the_rows_order(tmp_path):
    """Catches a join by row position instead of image id (each slot lists its photos in its
    own order), and chance levels of the wrong N."""
    rng = np.random.default_rng(1)
    ids, img = rng.choice(10**6, 90, replace=False), rng.standard_normal((90, 6)) + 1.0
    emb = images.load_embeddings(write_embeddings(tmp_path / "e.npz", ids, img, meta=None))
    test, train = ids[:30], ids[30:]
    rows = lambda part: img[[list(ids).index(i) for i in part]]
    scores = images.score_split(slots_of(test, [3 * rows(test), 3 * rows(test)], rng), emb,
                                slots_of(train, [3 * rows(train), rows(train)], rng))
    assert {k: scores[k] for k in ("mutual_knn", "R@1", "R@10", "paraphrase_R@1")} == {
        "mutual_knn": 1.0, "R@1": 1.0, "R@10": 1.0, "paraphrase_R@1": 1.0}
    assert scores["chance"] == {"paraphrase_R@1": 1 / 30, "mutual_knn": 10 / 29,
                                "R@1": 1 / 30, "R@5": 5 / 30, "R@10": 10 / 30}


def test_score_split_equals_the_metrics_on_photos_with_every_slot(tmp_path):
    """Exact against metrics.py with ties and repeated rows: catches slot 0 (not the mean over
    slots), photos missing a slot scored, the rotation fitted on another slot or on the test
    photos, and the text side on the wrong rows."""
    rng = np.random.default_rng(2)
    ids = np.arange(100, 160) * 7
    img = rng.integers(-2, 3, size=(60, 8)).astype(np.float32) + 0.5
    img[10:14] = img[0]                                         # repeated image rows: ties
    emb = images.load_embeddings(write_embeddings(
        tmp_path / "e.npz", np.concatenate([ids, [3]]), np.vstack([img, img[:1]]), meta=None))
    zs = [rng.integers(-2, 3, size=(60, 4)).astype(np.float32) + 0.25 for _ in range(3)]
    zs[1][::2] = zs[0][::2]                     # half the photos' two captions agree ...
    zs[1][5:9] = zs[1][4]                       # ... and repeated caption rows tie
    test = slots_of(ids[:30], [z[:30] for z in zs], rng)
    train = slots_of(ids[30:], [z[30:] for z in zs], rng)
    test[2] = (test[2][0][1:], test[2][1][1:])      # one photo without slot 2: not scored
    kept = np.sort(test[2][0])                                  # (29,) photos with every slot
    by_id = lambda slot, want: slot[1][np.argsort(slot[0])][np.searchsorted(np.sort(slot[0]),
                                                                           want)]
    img_of = lambda want: img[np.searchsorted(ids, want)]
    rotation = fit_procrustes(train[0][1], img_of(train[0][0]))
    recalls = [rotated_recall(rotation, by_id(s, kept), img_of(kept)) for s in test]
    scores = images.score_split(test, emb, train)
    assert scores["mutual_knn"] == np.mean([mutual_knn(by_id(s, kept), img_of(kept))
                                            for s in test])
    for k in (1, 5, 10):
        assert scores[f"R@{k}"] == np.mean([r[f"R@{k}"] for r in recalls])
    assert scores["paraphrase_R@1"] == paraphrase_r_at_1(test[0][1], by_id(test[1], test[0][0]))
    assert scores["std"] == collapse_stats(test[0][1])["std"] and scores["photos"] == 30
    assert scores["chance"]["mutual_knn"] == 10 / 28 and scores["chance"]["R@1"] == 1 / 29
    text = images.score_split(test, None, train)
    assert "mutual_knn" not in text and text["paraphrase_R@1"] == scores["paraphrase_R@1"]


def test_missing_photos_and_narrow_embeddings_are_one_line_naming_the_file(tmp_path):
    rng = np.random.default_rng(3)
    ids = np.arange(40)
    slots = slots_of(ids[:20], [rng.standard_normal((20, 4)) for _ in range(2)], rng)
    part = images.load_embeddings(write_embeddings(tmp_path / "part.npz", ids[2:],
                                                   rng.standard_normal((38, 4)), meta=None))
    with pytest.raises(ValueError, match=r"^\S*part.npz: 2 of the 20 photos of the split have "
                                         r"no embedding \(e.g. image ids \[0, 1\]\)"):
        images.score_split(slots, part)
    few = [(ids[2:12], z[np.argsort(i)][2:12]) for i, z in slots]
    with pytest.raises(ValueError, match="10 photos have every caption slot; mutual kNN@10 "
                                         "needs at least 11"):
        images.score_split(few, part)
    narrow = images.load_embeddings(write_embeddings(tmp_path / "narrow.npz", ids,
                                                     rng.standard_normal((40, 3)), meta=None))
    with pytest.raises(ValueError, match=r"narrow.npz: image embeddings are 3-d, narrower"):
        images.score_split(slots, narrow)


@pytest.fixture(scope="module")
def run(tmp_path_factory, captions):
    """A 4-step run evaluated at steps 0, 2, 4, and embeddings of its photos and 5 more."""
    root = tmp_path_factory.mktemp("run")
    cfg = TrainConfig(objective="good_views", captions=str(captions), steps=4, batch_photos=8,
                      eval_every=2, warmup_steps=1, model=ModelConfig(
                          d_model=16, n_layers=1, n_heads=2, layers="reference"))
    train(cfg, root / "run", progress=False)
    ids = np.concatenate([3 * np.arange(120) + 7, [1, 2, 4, 5, 6]])
    img = np.random.default_rng(4).standard_normal((125, 24))
    return root / "run", images.load_embeddings(write_embeddings(root / "e.npz", ids, img,
                                                                 meta=None))


def reference_scores(run_dir, step, img_of):
    """The image scores computed straight from the saved files with metrics.py."""
    load = lambda split: [(ids, z.astype(np.float32)) for ids, z in load_caption_slots(
        run_dir / "captions" / f"{split}_step{step:05d}.npz")]
    (train_ids, train_z), test = load("train")[0], load("test")
    rotation = fit_procrustes(train_z, img_of(train_ids))
    return {"mutual_knn": np.mean([mutual_knn(z, img_of(i)) for i, z in test]),
            "R@1": np.mean([rotated_recall(rotation, z, img_of(i))["R@1"] for i, z in test])}


def test_score_run_is_metrics_on_the_saved_files(run):
    run_dir, emb = run
    img_of = lambda ids: emb.embeddings[np.searchsorted(emb.image_ids, ids)]
    final = images.score_run(run_dir, emb)
    assert final["step"] == 4 and {"val", "test"} <= set(final)
    expected = reference_scores(run_dir, 4, img_of)
    assert {k: final["test"][k] for k in expected} == expected
    written = json.loads((run_dir / "metrics.json").read_text())["final"]["test"]
    for key in ("paraphrase_R@1", "std", "effective_rank", "collapsed"):
        assert final["test"][key] == written[key]              # what training computed
    assert images.score_run(run_dir, emb, step=0)["test"]["mutual_knn"] == \
        reference_scores(run_dir, 0, img_of)["mutual_knn"]
    curve = images.curve(run_dir, emb)
    assert curve == {"step": [0, 2, 4], "mutual_knn": [
        images.score_run(run_dir, emb, step=s)["val"]["mutual_knn"] for s in (0, 2, 4)]}
    assert "test" not in images.score_run(run_dir, emb, step=2)


def test_run_errors_and_a_run_without_step_0_test(run, tmp_path):
    run_dir, emb = run
    with pytest.raises(ValueError, match="no captions saved at step 3"):
        images.score_run(run_dir, emb, step=3)
    (tmp_path / "empty").mkdir()
    for name in ("absent", "empty"):
        with pytest.raises(ValueError, match=f"{name}: not a run directory"):
            images.score_run(tmp_path / name, emb)
    other = images.load_embeddings(write_embeddings(tmp_path / "other.npz", np.arange(50) + 10**6,
                                                    np.ones((50, 24)), meta=None))
    with pytest.raises(ValueError, match=r"other.npz: 24 of the 24 photos of \S+ val have no"):
        images.score_run(run_dir, other)
    old = shutil.copytree(run_dir, tmp_path / "old")
    (old / "captions" / "test_step00000.npz").unlink()          # runs before: val only at 0
    assert "test" not in images.score_run(old, emb, step=0)


def test_evaluate_prints_the_text_side_or_the_image_scores(run, capsys):
    run_dir, emb = run
    rows = images.run_evaluate([run_dir])
    out = capsys.readouterr().out
    assert "paraphrase_R@1" in out and "mutual_knn" not in out and rows[0]["split"] == "test"
    assert f"| {rows[0]['paraphrase_R@1']:.3f} |" in out.splitlines()[2]
    rows = images.run_evaluate([run_dir], emb.path)
    out = capsys.readouterr().out
    assert "mutual kNN@10" in out and f"| {rows[0]['mutual_knn']:.3f} |" in out.splitlines()[3]
    assert rows[0]["R@1_chance"] == 1 / 24 and rows[0]["objective"] == "good_views"
