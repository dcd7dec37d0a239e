"""Tests of minialign.machinery.synthetic (the world, its two files, its ceiling) and of
scripts/calibrate.py (the world's caption statistics against COCO's)."""
import hashlib
import json
import re
import sys
from fractions import Fraction

import numpy as np
import pytest
from conftest import REAL_CAPTIONS, ROOT, shared

from minialign.data import load_captions, split_photos
from minialign.machinery import synthetic as syn
from minialign.metrics import knn_indices

sys.path.insert(0, str(ROOT / "scripts"))
import calibrate  # noqa: E402


def test_scene_factors_by_hand():
    scene = {"setting": "beach", "objects": [
        {"kind": "cat", "colour": "red", "count": 2, "size": "big", "position": "back"},
        {"kind": "dog", "colour": "striped", "count": 4, "size": "small", "position": "left"}]}
    x = syn.scene_factors(scene)
    # beach = setting 2; cat = kind 1 at 48: present 48, red 49 (colours 49-60), count 2 = 62
    # (61-64), big 66 (65-66), back 70 (67-71); dog at 24: striped 36, 4 = 40, small 41, left 43
    assert x.shape == (syn.N_FACTORS,) == (1464,) and x.dtype == np.float64
    assert np.flatnonzero(x).tolist() == [2, 24, 36, 40, 41, 43, 48, 49, 62, 66, 70]


def test_make_world_by_hand():
    """The documented streams and map, drawn again here: ids, factors, y = tanh(x w1 + b1) w2
    + b2 + NOISE eps. Catches a wrong noise scale or stream, a wrong mix of the shared rows."""
    n = 40
    world = syn.make_world(n, np.random.default_rng(5))
    assert world["captions"] == syn.make_world(n, np.random.default_rng(5))["captions"]
    assert world["captions"] != syn.make_world(n, np.random.default_rng(6))["captions"]
    ids, x, y = world["image_ids"], world["factors"], world["embeddings"]
    assert ids.dtype == np.int64 and len(set(ids.tolist())) == n and 1 <= min(ids) < max(ids) < 1e6
    assert np.array_equal(x, np.stack([syn.scene_factors(s) for s in world["scenes"]]))
    assert np.array_equal(x.sum(axis=1), [1 + 5 * len(s["objects"]) for s in world["scenes"]])
    rng = np.random.default_rng(20240601)
    w1, b1 = rng.standard_normal((1464, 512)) * 0.25, rng.standard_normal(512) * 0.5
    w2, b2 = rng.standard_normal((512, 768)) / np.sqrt(512), rng.standard_normal(768)
    shared = rng.standard_normal((23, 512)) * 0.25                            # (23, 512)
    for k in range(60):                                                       # kind k's rows
        rows = slice(24 + 24 * k + 1, 24 + 24 * (k + 1))
        w1[rows] = np.sqrt(0.5) * shared + np.sqrt(0.5) * w1[rows]
    noise_seed = int(np.random.default_rng(5).integers(0, 2**63, size=3)[2])
    eps = np.random.default_rng(noise_seed).standard_normal((n, 768))        # (n, 768)
    expected = np.tanh(x @ w1 + b1) @ w2 + b2 + 0.1 * eps
    assert y.dtype == np.float32 and y.shape == (n, 768)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    assert np.corrcoef(w1[25], w1[49])[0, 1] > 0.4   # red on a dog and on a cat: shared half


def test_captions_are_partial_views_with_cocos_surface_noise(monkeypatch):
    world = syn.make_world(300, np.random.default_rng(11))
    total = first = every = setting = 0
    for scene, captions in zip(world["scenes"], world["captions"]):
        kinds = [o["kind"] for o in scene["objects"]]
        assert 2 <= len(kinds) <= 5 and len(set(kinds)) == len(kinds)
        assert len({c.lower().strip(" .") for c in captions}) == 5   # distinct before the noise
        for caption in captions:
            words = set(re.findall(r"[a-z]+", text := caption.lower()))
            named = {k for k, forms in syn.KINDS.items() if words & {w for p in forms for w in p}}
            assert named <= set(kinds), caption      # never an object the scene lacks
            total, first = total + 1, first + (kinds[0] in named)
            every += named == set(kinds)
            setting += any(re.search(rf"\b{f}\b", text) for f in syn.SETTINGS[scene["setting"]])
    assert first / total > 0.9 and every / total < 0.3  # the most salient object; rarely all
    assert 0.6 < setting / total < 0.8                   # P_SETTING = 0.7
    flat = [c for captions in world["captions"] for c in captions]
    assert any(c.endswith(" ") for c in flat) and any(c == c.lower() for c in flat)
    assert {c.rstrip().endswith(".") for c in flat} == {True, False}
    drawn = iter(["A x.", "A x.", "B x.", "A x.", "C x.", "D x.", "E x.", "F x."])
    monkeypatch.setattr(syn, "caption", lambda scene, rng: next(drawn))   # a repeat is redrawn
    assert [c.lower().strip(" .") for c in syn.scene_captions({}, np.random.default_rng(0))] == [
        "a x", "b x", "c x", "d x", "e x"]


def test_write_world_files_same_seed_same_bytes_and_no_overwrite(tmp_path):
    a = captions_path, embeddings_path = syn.write_world(tmp_path / "a", n_scenes=30, seed=7)
    assert (captions_path.name, embeddings_path.name) == (syn.CAPTIONS_NAME, syn.EMBEDDINGS_NAME)
    raw = captions_path.read_bytes()
    coco = json.loads(raw)
    assert coco["info"]["description"].startswith("SYNTHETIC") and coco["info"]["world"] == "v2"
    ids = [im["id"] for im in coco["images"]]
    assert all(im["file_name"] == "synthetic_%06d" % im["id"] for im in coco["images"])
    assert sorted(a["id"] for a in coco["annotations"]) == list(range(1, 151))
    in_file = [a["image_id"] for a in coco["annotations"]]        # shuffled: loaders must group
    assert sorted(in_file) == sorted(ids * 5) and in_file[:5] != [ids[0]] * 5
    with np.load(embeddings_path, allow_pickle=False) as npz:
        assert npz.files == ["image_ids", "embeddings", "meta"]
        image_ids, emb, meta = npz["image_ids"], npz["embeddings"], npz["meta"]
    assert image_ids.dtype == np.int64 and image_ids.tolist() == ids
    assert emb.dtype == np.float32 and emb.shape == (30, 768) and np.isfinite(emb).all()
    assert meta.shape == () and meta.dtype.kind == "U"
    meta = json.loads(str(meta))
    assert meta["captions_sha256"] == hashlib.sha256(raw).hexdigest()
    assert meta["synthetic"] is True and meta["model"] == "synthetic (not DINOv2)"
    assert {"preprocessing", "pooling"} <= set(meta)          # the keys the loader requires
    assert (meta["count"], meta["dim"], meta["dtype"], meta["world"]) == (30, 768, "float32", "v2")
    assert load_captions(captions_path).image_ids.tolist() == sorted(ids)  # as training reads
    b = syn.write_world(tmp_path / "b", n_scenes=30, seed=7)
    c = syn.write_world(tmp_path / "c", n_scenes=30, seed=8)
    for fa, fb, fc in zip(a, b, c):
        assert fa.read_bytes() == fb.read_bytes() != fc.read_bytes()
    (tmp_path / "c" / syn.CAPTIONS_NAME).unlink()
    with pytest.raises(FileExistsError, match=syn.EMBEDDINGS_NAME):
        syn.write_world(tmp_path / "c", n_scenes=30, seed=7)
    assert not (tmp_path / "c" / syn.CAPTIONS_NAME).exists()   # nothing written when refused
    syn.write_world(tmp_path / "c", n_scenes=30, seed=7, force=True)
    assert [f.read_bytes() for f in a] == [f.read_bytes() for f in c]


def test_world_ceiling_by_hand():
    """25 scenes; the 5 test scenes (in id order) get factors A..E and 2-d images at angles 0,
    15, 40, 100, 210. Factor cosines: AB 1/2, AC BC 2/sqrt(6), AD BD 1/sqrt(6), CD 2/3, DE
    1/sqrt(3), E 0 with A B C. k = 2: factor k-NN A{C,B} B{C,A} C{A,B} (a tie) D{C,E} E{D,A} (a
    tie: A lowest); image k-NN (by angle) A{B,C} B{A,C} C{B,A} D{C,B} E{D,A}: mean overlap
    (1+1+1+.5+1)/5. k = 1: factors C C A C D (C->A by the tie), images B A B C D: 2 of 5."""
    ids = np.arange(101, 126)
    test = split_photos(ids)["test"]                                          # sorted, so by id
    factors, images = np.tile([1.0, 0, 0, 0], (25, 1)), np.ones((25, 2))  # others: any
    factors[test] = [[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 1]]
    angles = np.radians([0, 15, 40, 100, 210])
    images[test] = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    assert syn.world_ceiling(ids, factors, images, k=2) == pytest.approx(0.9, abs=1e-12)
    assert syn.world_ceiling(ids, factors, images, k=1) == pytest.approx(0.4, abs=1e-12)


def test_world_ceiling_ranks_exact_cosines():
    """On a world's test split the factor k-NN is the exact one (cosines as fractions, ties to
    the lower row), whatever the BLAS; chance when the images are shuffled."""
    world = syn.make_world(300, np.random.default_rng(7))
    ids, f, img = world["image_ids"], world["factors"], world["embeddings"]
    test = split_photos(ids)["test"]
    test = test[np.argsort(ids[test])]                                        # (60,) by id
    gram = (f[test] @ f[test].T).astype(int)
    exact = [sorted((j for j in range(60) if j != i),
                    key=lambda j: (-Fraction(int(gram[i, j]) ** 2, int(gram[j, j])), j))[:10]
             for i in range(60)]
    overlap = [len(set(a) & set(b)) for a, b in zip(exact, knn_indices(img[test], 10).tolist())]
    ceiling = syn.world_ceiling(ids, f, img)
    assert ceiling == pytest.approx(np.mean(overlap) / 10, abs=1e-12)
    assert 0.3 < ceiling < 1.0                        # far above chance 10 / 59
    shuffled = img[np.random.default_rng(8).permutation(300)]
    assert 0.0 <= syn.world_ceiling(ids, f, shuffled) < 0.3


def test_world_ceiling_of_files(tmp_path):
    captions, embeddings = syn.write_world(tmp_path, n_scenes=150, seed=3)
    rng_world, _ = (np.random.default_rng(s) for s in np.random.SeedSequence(3).spawn(2))
    world = syn.make_world(150, rng_world)             # write_world's own stream
    expected = syn.world_ceiling(world["image_ids"], world["factors"], world["embeddings"])
    assert syn.world_ceiling_of_files(captions, embeddings) == expected
    (tmp_path / "v1.json").write_text(captions.read_text().replace('world": "v2', 'world": "v1'))
    with pytest.raises(ValueError, match="v1.json: not a world v2 file"):
        syn.world_ceiling_of_files(tmp_path / "v1.json", embeddings)


def test_caption_statistics_by_hand():
    assert calibrate.content_words("A dog is sitting on the beach.") == ["dog", "sitting", "beach"]
    stats = calibrate.caption_statistics([["a red dog", "a dog on grass", "dog"],
                                          ["two cats", "cats asleep", "a cat"]])
    assert stats["words_per_caption"] == (2 + 2 + 1 + 2 + 2 + 1) / 6
    # pairs: {red,dog} {dog,grass} {dog}: 1/3 1/2 1/2; {two,cats} {cats,asleep} {cat}: 1/3 0 0
    assert stats["same_photo_jaccard"] == pytest.approx(((1 / 3 + 1) / 3 + (1 / 3) / 3) / 2)
    assert stats["coverage"] == pytest.approx((0.5 + 0.5 + 1 + 0.5 + 0.5 + 0) / 6)
    assert stats["random_jaccard"] == 0.0             # the photos share no word
    with pytest.raises(ValueError, match=">= 2 captions"):
        calibrate.caption_statistics([["one caption"], ["two", "three"]])


def test_default_world_is_within_cocos_bands(capsys):
    """`python scripts/calibrate.py`: the demo's world against the values recorded from COCO
    val2017, and against the real captions (which give those values) when ../shared has them."""
    assert calibrate.main(["--n-scenes", "2000", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "| content words per caption | 5.800 |" in out and "within the bands" in out
    measured = calibrate.statistics_of_file(shared(REAL_CAPTIONS))
    for key, recorded in calibrate.COCO_VAL2017.items():
        assert abs(measured[key] - recorded) < 5e-4, (key, measured[key])
