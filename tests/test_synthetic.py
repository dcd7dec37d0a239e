"""Tests for minialign.synthetic: the SYNTHETIC worlds (v1 by name, v2 the default) and their
two files; the v2 world's caption statistics against COCO's (caption_stats)."""
import hashlib
import json
import re

import numpy as np
import pytest

from minialign.machinery.images.synthetic import (CAPTIONS_NAME, COLOURS, D_IMG, EMBEDDINGS_NAME,
                                                  KINDS, N_FACTORS, POSITIONS, SETTINGS, SIZES,
                                                  embed_scenes, make_world, sample_scene,
                                                  scene_captions, scene_factors, write_world)

N_SMALL = 300  # scenes in the file tests: enough structure, well under a second


def words_of(caption):
    """Lower-case word tokens, hyphenated words kept whole ('jet-black')."""
    return re.findall(r"[a-z\-]+", caption.lower())


def mentioned(caption, vocabulary, plural_nouns=False):
    """Canonical values of `vocabulary` that the caption names (single-word forms)."""
    words = set(words_of(caption))
    found = set()
    for value, forms in vocabulary.items():
        surface = [w for pair in forms for w in pair] if plural_nouns else forms
        if any(w in words for w in surface):
            found.add(value)
    return found


def test_world_shapes_and_ids():
    world = make_world(50, np.random.default_rng(0), d_img=32, world="v1")
    assert world["image_ids"].dtype == np.int64 and world["image_ids"].shape == (50,)
    assert len(set(world["image_ids"].tolist())) == 50
    assert world["embeddings"].shape == (50, 32) and world["embeddings"].dtype == np.float32
    assert world["factors"].shape == (50, N_FACTORS)
    assert set(np.unique(world["factors"]).tolist()) == {0.0, 1.0}
    assert all(1 <= len(s["objects"]) <= 3 for s in world["scenes"])
    with pytest.raises(ValueError, match="n_scenes"):
        make_world(0, np.random.default_rng(0))


def test_captions_differ_but_describe_the_same_attributes():
    rng = np.random.default_rng(1)
    for _ in range(200):
        scene = sample_scene(rng)
        captions = scene_captions(scene, rng)
        assert len(captions) == 5 and len(set(captions)) == 5
        kinds = {o["kind"] for o in scene["objects"]}
        colours = {o["colour"] for o in scene["objects"]}
        for caption in captions:
            text = " ".join(words_of(caption))
            assert mentioned(caption, KINDS, plural_nouns=True) == kinds, caption
            assert mentioned(caption, COLOURS) == colours, caption
            assert any(form in text for form in SETTINGS[scene["setting"]]), caption
            for obj in scene["objects"]:
                assert any(form in words_of(caption) for form in SIZES[obj["size"]]), caption
                assert any(form in text for form in POSITIONS[obj["position"]]), caption


def test_caption_surface_noise_is_present():
    world = make_world(400, np.random.default_rng(2), d_img=8, world="v1")
    captions = [c for caps in world["captions"] for c in caps]
    assert any(c.endswith(" ") for c in captions)
    assert any(c == c.lower() for c in captions)
    assert any(c[0].isupper() and c != c.upper() for c in captions)
    assert any(c.rstrip().endswith(".") for c in captions)
    assert any(not c.rstrip().endswith(".") for c in captions)


def test_image_model_is_fixed_across_worlds():
    scene = sample_scene(np.random.default_rng(3))
    f = scene_factors(scene, "v1")[None, :]                                       # (1, F)
    a = embed_scenes(f, 0.0, np.random.default_rng(4), world="v1")                 # (1, 768)
    b = embed_scenes(f, 0.0, np.random.default_rng(5), world="v1")                 # (1, 768)
    assert a.shape == (1, D_IMG) and np.array_equal(a, b)


def test_shared_attributes_mean_similar_embeddings():
    """Change one attribute vs four: the one-change scene must stay closer, on average."""
    rng = np.random.default_rng(6)
    base, one_change, four_changes = [], [], []
    for _ in range(300):
        scene = sample_scene(rng)
        obj = scene["objects"][0]
        other_colour = [c for c in COLOURS if c != obj["colour"]][int(rng.integers(7))]
        other_position = [p for p in POSITIONS if p != obj["position"]][int(rng.integers(4))]
        other_setting = [s for s in SETTINGS if s != scene["setting"]][int(rng.integers(5))]
        v1 = {"setting": scene["setting"],
              "objects": [{**obj, "colour": other_colour}] + scene["objects"][1:]}
        v4 = {"setting": other_setting,
              "objects": [{**obj, "colour": other_colour, "position": other_position,
                           "size": "big" if obj["size"] == "small" else "small"}]
              + scene["objects"][1:]}
        base.append(scene_factors(scene, "v1"))
        one_change.append(scene_factors(v1, "v1"))
        four_changes.append(scene_factors(v4, "v1"))
    e0, e1, e4 = (embed_scenes(np.stack(f), 0.0, rng, world="v1")
                  for f in (base, one_change, four_changes))
    d1 = np.linalg.norm(e0 - e1, axis=1)                                      # (300,)
    d4 = np.linalg.norm(e0 - e4, axis=1)                                      # (300,)
    assert d1.mean() < 0.8 * d4.mean()
    assert np.mean(d1 < d4) > 0.9
    # random pairs: more shared factor bits -> higher correlation of centred embeddings
    f = np.stack(base)                                                        # (300, F)
    e = e0 - e0.mean(axis=0)                                                  # (300, 768)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)                          # (300, 768)
    shared = (f @ f.T)[np.triu_indices(300, 1)]                               # (P,)
    cos = (e @ e.T)[np.triu_indices(300, 1)]                                  # (P,)
    assert np.corrcoef(shared, cos)[0, 1] > 0.5


def test_write_world_files(tmp_path):
    captions_path, embeddings_path = write_world(tmp_path, n_scenes=N_SMALL, seed=0)
    assert captions_path == str(tmp_path / CAPTIONS_NAME)
    assert embeddings_path == str(tmp_path / EMBEDDINGS_NAME)
    raw = open(captions_path, "rb").read()
    coco = json.loads(raw)
    assert coco["info"]["description"] == "SYNTHETIC minialign world, not COCO"
    image_ids = [img["id"] for img in coco["images"]]
    assert len(image_ids) == N_SMALL == len(set(image_ids))
    assert all(img["file_name"] == "synthetic_%06d" % img["id"] for img in coco["images"])
    ann_ids = [a["id"] for a in coco["annotations"]]
    assert len(ann_ids) == 5 * N_SMALL == len(set(ann_ids))
    per_image = {}
    for a in coco["annotations"]:
        per_image.setdefault(a["image_id"], []).append(a["caption"])
    assert sorted(per_image) == sorted(image_ids)
    assert all(len(caps) == 5 for caps in per_image.values())

    with np.load(embeddings_path, allow_pickle=False) as npz:
        assert sorted(npz.files) == ["embeddings", "image_ids", "meta"]
        ids, emb, meta_arr = npz["image_ids"], npz["embeddings"], npz["meta"]
    assert ids.dtype == np.int64 and ids.tolist() == image_ids
    assert emb.dtype == np.float32 and emb.shape == (N_SMALL, 768)
    assert np.all(np.isfinite(emb))
    assert meta_arr.shape == () and meta_arr.dtype.kind == "U"
    meta = json.loads(str(meta_arr))
    assert meta["captions_sha256"] == hashlib.sha256(raw).hexdigest()
    assert meta["synthetic"] is True and meta["model"] == "synthetic (not DINOv2)"
    assert (meta["count"], meta["dim"], meta["dtype"]) == (N_SMALL, 768, "float32")
    assert {"preprocessing", "pooling"} <= set(meta)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CAPTIONS_NAME, EMBEDDINGS_NAME]


def test_write_world_is_byte_deterministic(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    files_a = write_world(a, n_scenes=N_SMALL, seed=7)
    files_b = write_world(b, n_scenes=N_SMALL, seed=7)
    files_c = write_world(c, n_scenes=N_SMALL, seed=8)
    for fa, fb, fc in zip(files_a, files_b, files_c):
        assert open(fa, "rb").read() == open(fb, "rb").read()
        assert open(fa, "rb").read() != open(fc, "rb").read()


def test_write_world_refuses_overwrite(tmp_path):
    write_world(tmp_path, n_scenes=20, seed=0)
    before = open(tmp_path / CAPTIONS_NAME, "rb").read()
    with pytest.raises(FileExistsError, match=CAPTIONS_NAME):
        write_world(tmp_path, n_scenes=20, seed=1)
    assert open(tmp_path / CAPTIONS_NAME, "rb").read() == before
    (tmp_path / CAPTIONS_NAME).unlink()
    with pytest.raises(FileExistsError, match=EMBEDDINGS_NAME):
        write_world(tmp_path, n_scenes=20, seed=1)
    assert not (tmp_path / CAPTIONS_NAME).exists()  # nothing written when refusing
    write_world(tmp_path, n_scenes=20, seed=1, force=True)
    assert open(tmp_path / CAPTIONS_NAME, "rb").read() != before


def test_default_world_size():
    """The default 2000-scene world builds in well under the test budget."""
    world = make_world(2000, np.random.default_rng(0))
    assert world["embeddings"].shape == (2000, D_IMG)
    assert len(set(world["image_ids"].tolist())) == 2000


def test_files_load_with_the_real_loaders(tmp_path):
    """The synthetic files pass the same readers as COCO + DINOv2 files."""
    from minialign.machinery.run.monitor import load_coco_captions
    from minialign.machinery.images.embeddings import join_on_ids, load_embeddings
    captions_path, embeddings_path = write_world(tmp_path, n_scenes=N_SMALL, seed=0)
    captions = load_coco_captions(captions_path)
    emb = load_embeddings(embeddings_path)
    assert captions.stats["photos"] == N_SMALL and captions.stats["captions"] == 5 * N_SMALL
    assert emb.meta["synthetic"] is True and emb.embeddings.shape == (N_SMALL, D_IMG)
    caption_index, emb_index, report = join_on_ids(captions.image_ids, emb)
    assert report["matched_images"] == N_SMALL and len(caption_index) == N_SMALL


def test_world_ceiling_scores_the_evaluations_test_split():
    from minialign.data import split_photos
    from minialign.machinery.images.synthetic import world_ceiling
    from minialign.metrics import mutual_knn
    world = make_world(N_SMALL, np.random.default_rng(7), d_img=64, world="v1")
    ids, factors, img = world["image_ids"], world["factors"], world["embeddings"]
    test = split_photos(ids)["test"]                                          # (60,)
    assert len(test) == N_SMALL // 5
    by_id = test[np.argsort(ids[test])]                                       # (60,)
    expected = mutual_knn(factors[by_id], img[by_id], k=10)
    assert world_ceiling(ids, factors, img) == expected
    assert 0.3 < expected < 1.0  # the map keeps neighbourhoods, far above chance 10 / 59
    # its own factors as "images": identical neighbourhoods
    assert world_ceiling(ids, factors, factors) == 1.0
    # scene rows shuffled against their images: back near chance (10 / 59 = 0.17)
    shuffled = img[np.random.default_rng(8).permutation(N_SMALL)]             # (N, 64)
    assert world_ceiling(ids, factors, shuffled) < 0.3
    assert world_ceiling(ids, factors, img, k=3) == mutual_knn(factors[by_id], img[by_id], k=3)
    with pytest.raises(ValueError, match="one row per scene"):
        world_ceiling(ids[:-1], factors, img)


def test_world_ceiling_of_files_matches_the_world(tmp_path):
    from minialign.machinery.images.synthetic import world_ceiling, world_ceiling_of_files
    captions_path, embeddings_path = write_world(tmp_path, n_scenes=N_SMALL, seed=3)
    rng_world, _ = (np.random.default_rng(s) for s in np.random.SeedSequence(3).spawn(2))
    world = make_world(N_SMALL, rng_world)  # write_world's own stream
    expected = world_ceiling(world["image_ids"], world["factors"], world["embeddings"])
    assert world_ceiling_of_files(captions_path, embeddings_path) == expected
    coco = json.loads(open(captions_path).read())
    for image in coco["images"]:
        del image["synthetic_scene"]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(coco))
    with pytest.raises(ValueError, match="synthetic_scene"):
        world_ceiling_of_files(plain, embeddings_path)


def unbound_bag(factors):
    """Setting one-hot, kinds present, and attribute-value counts summed over the objects:
    what a bag of a caption's content words can say, without which object has which value."""
    from minialign.machinery.images.synthetic import KIND_BLOCK
    ns = len(SETTINGS)
    blocks = factors[:, ns:].reshape(len(factors), len(KINDS), KIND_BLOCK)    # (N, 12, 20)
    return np.concatenate([factors[:, :ns], blocks[:, :, 0],
                           blocks[:, :, 1:].sum(axis=1)], axis=1)            # (N, 6 + 12 + 19)


def test_image_model_shares_part_of_each_attribute_across_kinds():
    from minialign.machinery.images.synthetic import ATTR_SHARED, KIND_BLOCK, W1_STD, image_model
    old = np.random.default_rng(20240601).standard_normal((N_FACTORS, 512)) * W1_STD
    assert np.array_equal(image_model(attr_shared=0.0, world="v1")["w1"], old)  # the world before #12
    w1 = image_model(world="v1")["w1"]                                               # (F, HIDDEN)
    assert np.array_equal(w1[:len(SETTINGS)], old[:len(SETTINGS)])  # settings untouched
    present = [len(SETTINGS) + k * KIND_BLOCK for k in range(len(KINDS))]
    assert np.array_equal(w1[present], old[present])                 # kinds' own rows untouched
    red_dog, red_cat = (len(SETTINGS) + list(KINDS).index(k) * KIND_BLOCK + 1
                        for k in ("dog", "cat"))  # the first colour row of each kind's block
    assert abs(np.corrcoef(w1[red_dog], w1[red_cat])[0, 1] - ATTR_SHARED) < 0.1  # 512 samples
    assert abs(np.corrcoef(old[red_dog], old[red_cat])[0, 1]) < 0.1
    assert abs(w1[len(SETTINGS):].std() / W1_STD - 1) < 0.02         # rows keep their scale
    with pytest.raises(ValueError, match="attr_shared"):
        image_model(attr_shared=1.5)


def test_shared_attributes_make_image_neighbourhoods_follow_what_captions_say():
    """At attr_shared = 0 the image neighbourhoods hinge on kind-attribute conjunctions; with
    the shared part, a bag of the captions' content (no binding) aligns far better, while the
    bound factors still align best (measured on the 2000-scene world: 0.17 -> 0.36)."""
    from minialign.machinery.images.synthetic import ATTR_SHARED, image_model
    from minialign.metrics import mutual_knn
    world = make_world(1000, np.random.default_rng(9), d_img=8, world="v1")
    factors = world["factors"][:300]                                          # (300, F)
    def images(attr_shared):
        w = image_model(attr_shared=attr_shared, world="v1")
        return np.tanh(factors @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]      # (300, 768)
    before, after = images(0.0), images(ATTR_SHARED)
    bag = unbound_bag(factors)                                                # (300, 37)
    assert mutual_knn(bag, after) > mutual_knn(bag, before) + 0.1
    assert mutual_knn(factors, after) > mutual_knn(bag, after)


# ---------------------------------------------------------------- the calibrated world (#22)
def test_default_world_is_within_cocos_caption_statistics_bands(tmp_path):
    """The default world, as `python -m minialign synthetic` writes it, is within the bands of
    caption_stats: against the real COCO val2017 captions beside the checkout when present,
    else against the values recorded from them (COCO_VAL2017)."""
    from conftest import REAL_CAPTIONS
    from minialign.machinery.images import caption_stats
    from minialign.machinery.images.synthetic_v2 import CALIBRATED
    captions, _ = write_world(tmp_path, n_scenes=2000, seed=0)
    stats = caption_stats.statistics_of_file(captions)
    coco = (caption_stats.statistics_of_file(REAL_CAPTIONS) if REAL_CAPTIONS.exists()
            else caption_stats.COCO_VAL2017)
    assert caption_stats.outside_bands(stats, coco) == []
    assert all(abs(stats[k] - CALIBRATED[k]) < 1e-3 for k in caption_stats.KEYS), stats
    old, _ = write_world(tmp_path / "v1", n_scenes=2000, seed=0, world="v1")
    assert len(caption_stats.outside_bands(caption_stats.statistics_of_file(old), coco)) == 4


def test_recorded_coco_statistics_are_measured(real_captions_path):
    from minialign.machinery.images import caption_stats
    measured = caption_stats.statistics_of_file(real_captions_path)
    for key, recorded in caption_stats.COCO_VAL2017.items():
        assert abs(measured[key] - recorded) < 5e-4, (key, measured[key])


def test_content_words_and_statistics_by_hand():
    from minialign.machinery.images.caption_stats import caption_statistics, content_words
    assert content_words("A dog is sitting on the beach.") == ["dog", "sitting", "beach"]
    photos = [["a red dog", "a dog on grass"], ["two cats", "cats asleep"]]
    stats = caption_statistics(photos)
    assert stats["words_per_caption"] == (2 + 2 + 2 + 2) / 4
    assert stats["same_photo_jaccard"] == (1 / 3 + 1 / 3) / 2      # {dog} of 3 words; {cats}
    assert stats["coverage"] == 0.5                                 # each caption: 1 of 2 words
    assert stats["random_jaccard"] == 0.0                           # the photos share no word
    with pytest.raises(ValueError, match=">= 2 captions"):
        caption_statistics([["one caption"], ["two", "three"]])


def test_v2_captions_are_partial_views_of_the_whole_scene():
    """Each v2 caption names a subset of its scene (the most salient object most often); the
    factors, and so the image, hold every object, mentioned or not."""
    from minialign.machinery.images import synthetic_v2 as v2
    world = make_world(300, np.random.default_rng(11), d_img=8)                # v2: default
    named_first = named_all = total = 0
    for scene, captions in zip(world["scenes"], world["captions"]):
        assert 2 <= len(scene["objects"]) <= 5 and len(set(captions)) == 5
        for caption in captions:
            words = set(re.findall(r"[a-z]+", caption.lower()))
            said = [any(f in words for pair in v2.KINDS[o["kind"]] for f in pair)
                    for o in scene["objects"]]
            named_first += said[0]
            named_all += all(said)
            total += 1
    assert named_first / total > 0.9 and named_all / total < 0.3
    assert world["factors"].shape[1] == 24 + 60 * 24
    assert np.array_equal(world["factors"].sum(axis=1),
                          [1 + 5 * len(s["objects"]) for s in world["scenes"]])


def test_world_version_is_recorded_and_read_back(tmp_path):
    from minialign.machinery.images.synthetic import world_of
    for world in ("v1", "v2"):
        captions, embeddings = write_world(tmp_path / world, n_scenes=20, seed=0, world=world)
        coco = json.loads(open(captions).read())
        assert world_of(coco) == world == coco["info"]["world"]
        with np.load(embeddings) as npz:
            assert json.loads(str(npz["meta"]))["world"] == world
    assert world_of({"info": {}}) == "v1"                 # files from before #22
    with pytest.raises(ValueError, match="unknown world"):
        make_world(5, np.random.default_rng(0), world="v3")


def test_synthetic_stats_command(tmp_path, capsys):
    """`synthetic --stats` prints the world's four statistics beside COCO's (recorded, or
    measured from --compare) and whether they are within the bands; without --out it writes
    nothing."""
    from minialign.machinery.images import caption_stats
    from minialign.machinery import cli
    assert cli.main(["synthetic", "--stats", "--n-scenes", "300"]) == 0
    out = capsys.readouterr().out
    assert "| statistic | COCO val2017 (recorded) | world v2, 300 scenes, seed 0 |" in out
    assert "| content words per caption | 5.800 |" in out and "within the bands" in out
    reference, _ = write_world(tmp_path / "reference", n_scenes=100, seed=1, world="v1")
    assert cli.main(["synthetic", "--out", str(tmp_path / "w"), "--world", "v1", "--n-scenes",
                     "100", "--stats", "--compare", reference]) == 0
    out = capsys.readouterr().out
    stats = caption_stats.statistics_of_file(tmp_path / "w" / CAPTIONS_NAME)
    assert f"| {caption_stats.LABELS['coverage']} | " in out and f"{stats['coverage']:.3f} |" in out
    assert f"{reference} | world v1, 100 scenes, seed 0 |" in out
    assert "outside the bands: random_jaccard" in out                    # v1 overlaps: 0.1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reference", "w"]
    assert cli.main(["synthetic"]) == 2
    assert "--out is required (or --stats" in capsys.readouterr().err
    assert cli.main(["synthetic", "--out", str(tmp_path / "x"), "--compare", reference]) == 2
    assert "--compare: only with --stats" in capsys.readouterr().err
