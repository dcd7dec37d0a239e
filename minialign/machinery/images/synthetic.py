"""A SYNTHETIC world for teaching and end-to-end tests: scenes, captions, and fake
"image embeddings", written in the same two file formats as the real data (COCO captions json,
minialign embeddings npz). Nothing here is COCO or DINOv2; every file says so.

Two worlds, named in both files ("world": "v1" or "v2"; a file without the key is v1):
  v2 (the default, synthetic_v2.py) a setting plus 2-5 objects; each caption mentions a
     subset, calibrated to COCO's caption statistics (caption_stats.py), so two captions of a
     scene are two PARTIAL views of it, as two annotators' captions of a photo are.
  v1 (this file, before #22) a setting plus 1-3 objects (kind, colour, count, size,
     position); its 5 captions are complete paraphrases from a small grammar (synonyms, word
     orders): every caption names every attribute. Kept so earlier results can be reproduced.
Both add COCO-like case and spacing noise. A scene's "image embedding" is a FIXED random
nonlinear map of the whole scene's binary factor vector (image_model, one per world) plus
Gaussian noise, so caption meaning and image geometry are related the way the real
experiment assumes.

    python -m minialign synthetic --out OUT_DIR [--world v2] [--n-scenes 2000] [--seed 0]
    python -m minialign synthetic --stats [--world v2] [--compare captions_val2017.json]
"""
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from minialign.data import SPLIT_SEED, split_photos
from minialign.machinery.images.embeddings import load_embeddings, save_embeddings
from minialign.machinery.run.files import atomic_write_bytes, read_coco_json
from minialign.metrics import MUTUAL_KNN_K, mutual_knn
from minialign.machinery.images import synthetic_v2

WORLD_SEED = 20240601  # arbitrary constant: fixes the random "image model" so every world shares it
D_IMG = 768            # width of DINOv2-base embeddings, which the synthetic ones stand in for
NOISE = 0.1            # std of the Gaussian "photo" noise added to each embedding coordinate
CAPTIONS_PER_SCENE = 5  # COCO photos have 5 captions (a few have 6 or 7)
MAX_OBJECTS = 3        # objects per scene: 1..MAX_OBJECTS, each of a different kind
HIDDEN = 512           # hidden width of the image model (arbitrary)
W1_STD = 0.35          # ~11 active factors -> pre-activation std ~ 1.2: tanh bends, not saturated
B1_STD = 0.5           # hidden bias std, so tanh is not an odd function of the factors
B2_STD = 1.0           # output offset, a stand-in for the large mean of real DINOv2 features
ATTR_SHARED = 0.5      # share of an attribute's image weights common to every kind (#12: at 0,
#   "red" on a dog and on a cup were unrelated inputs, so image neighbourhoods hinged on
#   kind-attribute conjunctions a bag of the caption's words cannot express; test split of the
#   2000-scene world, k = 10, chance 0.025: world_ceiling 0.612 -> 0.542; an unbound bag of
#   setting, kinds and attribute counts 0.170 -> 0.363; a bag of a caption's words 0.059 -> 0.116)
P_TRAILING_SPACE = 0.14  # COCO val2017: 3541 of 25,014 captions end in spaces
P_NO_PERIOD = 0.3      # many COCO captions have no final period
P_LOWERCASE = 0.15     # some COCO captions are all lower case
P_UPPERCASE = 0.03     # and a few shout; both exercise the cleaning path
MAX_IMAGE_ID = 10**6   # ids drawn from [1, 10**6) without replacement: like COCO, not row indices
CAPTIONS_NAME = "captions_synthetic.json"
EMBEDDINGS_NAME = "embeddings_synthetic.npz"

# canonical attribute value -> the words a caption may use for it
KINDS = {"dog": [("dog", "dogs"), ("puppy", "puppies"), ("hound", "hounds")],
         "cat": [("cat", "cats"), ("kitten", "kittens"), ("kitty", "kitties")],
         "cup": [("cup", "cups"), ("mug", "mugs")],
         "ball": [("ball", "balls")],
         "car": [("car", "cars"), ("automobile", "automobiles")],
         "bird": [("bird", "birds")],
         "apple": [("apple", "apples")],
         "book": [("book", "books"), ("novel", "novels")],
         "chair": [("chair", "chairs"), ("seat", "seats")],
         "bicycle": [("bicycle", "bicycles"), ("bike", "bikes")],
         "lamp": [("lamp", "lamps"), ("light", "lights")],
         "boat": [("boat", "boats"), ("dinghy", "dinghies")]}
COLOURS = {"red": ["red", "crimson"], "blue": ["blue", "azure"], "green": ["green", "emerald"],
           "yellow": ["yellow", "golden"], "black": ["black", "jet-black"],
           "white": ["white", "snow-white"], "orange": ["orange", "tangerine"],
           "purple": ["purple", "violet"]}
COUNTS = {1: ["a", "one", "a single"], 2: ["two", "a pair of"], 3: ["three", "a trio of"],
          4: ["four", "a group of four"]}
SIZES = {"small": ["small", "little", "tiny"], "big": ["big", "large", "huge"]}
POSITIONS = {"left": ["on the left", "to the left"], "right": ["on the right", "to the right"],
             "middle": ["in the middle", "in the centre"], "top": ["at the top", "near the top"],
             "bottom": ["at the bottom", "near the bottom"]}
SETTINGS = {"kitchen": ["kitchen"], "street": ["street", "road"], "beach": ["beach", "seashore"],
            "park": ["park"], "living room": ["living room", "lounge"],
            "office": ["office", "workspace"]}
SETTING_PREPOSITIONS = {"kitchen": "in", "street": "on", "beach": "on", "park": "in",
                        "living room": "in", "office": "in"}  # "on a beach", "in a kitchen"
VERBS = [("sits", "sit"), ("rests", "rest"), ("is", "are")]  # (singular, plural)
ATTRIBUTES = [("colour", list(COLOURS)), ("count", list(COUNTS)), ("size", list(SIZES)),
              ("position", list(POSITIONS))]
KIND_BLOCK = 1 + sum(len(values) for _, values in ATTRIBUTES)  # present bit + one-hots = 20
N_FACTORS = len(SETTINGS) + len(KINDS) * KIND_BLOCK            # 6 + 12 * 20 = 246 (v1)
DEFAULT_WORLD = "v2"   # what `synthetic` writes and `make demo` trains on (#22); v1 before it


def sample_scene(rng):
    """Draw one scene: {"setting": str, "objects": [{"kind", "colour", "count", "size",
    "position"}]}, 1..MAX_OBJECTS objects of different kinds, sorted by kind (canonical order).
    Every attribute is uniform over its values. rng: np.random.Generator."""
    n_objects = int(rng.integers(1, MAX_OBJECTS + 1))
    kinds = sorted(rng.choice(len(KINDS), size=n_objects, replace=False))   # (n_objects,)
    objects = [{"kind": list(KINDS)[k],
                **{name: values[int(rng.integers(len(values)))] for name, values in ATTRIBUTES}}
               for k in kinds]
    return {"setting": list(SETTINGS)[int(rng.integers(len(SETTINGS)))], "objects": objects}


def scene_factors(scene, world=DEFAULT_WORLD):
    """Binary latent factors of a scene of `world` ("v1" | "v2"): a setting one-hot, then one
    block per KIND (present bit, colour, count, size, position one-hots; zeros if absent).
    Kinds are distinct within a scene, so this is order-free: scenes that share "a red dog on
    the left" share those bits, mentioned by a caption or not. Returns (F,) float64 of 0s and
    1s, F = WORLDS[world].n_factors (N_FACTORS for v1)."""
    w = WORLDS[world]
    x = np.zeros(w.n_factors)                                                 # (F,)
    x[w.settings.index(scene["setting"])] = 1.0
    for obj in scene["objects"]:
        offset = len(w.settings) + w.kinds.index(obj["kind"]) * w.kind_block
        x[offset] = 1.0  # present
        offset += 1
        for name, values in w.attributes:
            x[offset + values.index(obj[name])] = 1.0
            offset += len(values)
    return x


def image_model(d_img=D_IMG, seed=WORLD_SEED, attr_shared=ATTR_SHARED, world=DEFAULT_WORLD):
    """The fixed random "image model": weights of y = tanh(x w1 + b1) w2 + b2, drawn from their
    own stream seeded by WORLD_SEED, so every world (any seed) uses the same map.
    An attribute value's w1 row in kind k's block is sqrt(attr_shared) * s_value
    + sqrt(1 - attr_shared) * own_(k, value): a part s_value shared by every kind (red looks
    red on a dog and on a cup) plus a part of its own (a red dog is not a red cup); both parts
    have std W1_STD (the world's w1_std), so every row still has std W1_STD. attr_shared in
    [0, 1]; 0 = no shared part (the world before #12). world: "v1" | "v2", whose factor layout
    (F = WORLDS[world].n_factors) and w1_std the map has. Returns {"w1": (F, HIDDEN), "b1": (HIDDEN,),
    "w2": (HIDDEN, d_img), "b2": (d_img,)} float64. Raises ValueError outside [0, 1]."""
    if not 0.0 <= attr_shared <= 1.0:
        raise ValueError(f"attr_shared must be in [0, 1], got {attr_shared}")
    spec, rng = WORLDS[world], np.random.default_rng(seed)
    n_settings, block, w1_std = len(spec.settings), spec.kind_block, spec.w1_std
    w = {"w1": rng.standard_normal((spec.n_factors, HIDDEN)) * w1_std,          # (F, HIDDEN)
         "b1": rng.standard_normal(HIDDEN) * B1_STD,                             # (HIDDEN,)
         "w2": rng.standard_normal((HIDDEN, d_img)) / np.sqrt(HIDDEN),           # (HIDDEN, d_img)
         "b2": rng.standard_normal(d_img) * B2_STD}                              # (d_img,)
    # drawn after the rest, so w1's own parts, b1, w2 and b2 do not depend on attr_shared
    shared = rng.standard_normal((block - 1, HIDDEN)) * w1_std                # (block-1, HIDDEN)
    for k in range(len(spec.kinds)):
        rows = slice(n_settings + k * block + 1, n_settings + (k + 1) * block)
        w["w1"][rows] = (np.sqrt(attr_shared) * shared
                         + np.sqrt(1.0 - attr_shared) * w["w1"][rows])         # (block-1, HIDDEN)
    return w


def embed_scenes(factors, noise, rng, d_img=D_IMG, world=DEFAULT_WORLD):
    """Synthetic "image embeddings": the fixed image_model of `world` applied to scene factors,
    plus Gaussian noise of std `noise` (a different "photo" of the same scene each draw).
    factors: (N, F) float, F = WORLDS[world].n_factors; noise >= 0; rng: np.random.Generator
    (noise only).
    Returns (N, d_img) float32; per-coordinate signal std ~ 0.6 around an offset b2."""
    factors = np.asarray(factors, dtype=np.float64)                          # (N, F)
    assert factors.ndim == 2 and factors.shape[1] == WORLDS[world].n_factors, factors.shape
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    w = image_model(d_img, world=world)
    h = np.tanh(factors @ w["w1"] + w["b1"])                                 # (N, HIDDEN)
    y = h @ w["w2"] + w["b2"]                                                 # (N, d_img)
    y = y + noise * rng.standard_normal(y.shape)                             # (N, d_img)
    return y.astype(np.float32)                                               # (N, d_img)


def _with_article(phrase):
    """'a' -> 'an' before a vowel: 'a orange cup' -> 'an orange cup'."""
    return re.sub(r"^a (?=[aeiou])", "an ", phrase)


def _join(items):
    """['x'] -> 'x'; ['x', 'y', 'z'] -> 'x, y and z'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _object_phrase(obj, rng):
    """'two small crimson mugs', 'on the left', plural? for one object, synonyms drawn by rng."""
    pick = lambda words: words[int(rng.integers(len(words)))]
    singular, plural = pick(KINDS[obj["kind"]])
    noun = singular if obj["count"] == 1 else plural
    words = [pick(COUNTS[obj["count"]]), pick(SIZES[obj["size"]]), pick(COLOURS[obj["colour"]]),
             noun]  # English order: count, size, colour, noun
    return _with_article(" ".join(words)), pick(POSITIONS[obj["position"]]), obj["count"] > 1


def _caption(scene, template, rng):
    """One caption of the scene from template 0..4, objects in a random order."""
    order = rng.permutation(len(scene["objects"]))                           # (n_objects,)
    phrases = [_object_phrase(scene["objects"][i], rng) for i in order]
    setting = SETTINGS[scene["setting"]][int(rng.integers(len(SETTINGS[scene["setting"]])))]
    a_setting = _with_article("a " + setting)
    prep = SETTING_PREPOSITIONS[scene["setting"]]
    items = _join([f"{np_} {pos}" for np_, pos, _ in phrases])
    if template == 0:    # In a kitchen, two red cups sit on the left.
        singular, plural = VERBS[int(rng.integers(len(VERBS)))]
        text = f"{prep} {a_setting}, " + _join([f"{np_} {plural if many else singular} {pos}"
                                            for np_, pos, many in phrases])
    elif template == 1:  # Two crimson mugs on the left in a kitchen.
        text = f"{items} {prep} {a_setting}"
    elif template == 2:  # A kitchen with two red cups on the left.
        text = f"{a_setting} with {items}"
    elif template == 3:  # There are two red cups on the left in this kitchen.
        text = f"there {'are' if phrases[0][2] else 'is'} {items} {prep} this {setting}"
    else:                # A picture of a kitchen showing two red cups on the left.
        text = f"a picture of {a_setting} showing {items}"
    return text[0].upper() + text[1:] + "."


def _coco_noise(caption, rng):
    """COCO-like surface noise: drop the period, change case, add a trailing space."""
    if rng.random() < P_NO_PERIOD:
        caption = caption[:-1]
    r = rng.random()
    if r < P_LOWERCASE:
        caption = caption.lower()
    elif r < P_LOWERCASE + P_UPPERCASE:
        caption = caption.upper()
    return caption + " " if rng.random() < P_TRAILING_SPACE else caption


def scene_captions(scene, rng):
    """CAPTIONS_PER_SCENE paraphrases of one scene: each template once, in a random order, so
    the captions always differ; every caption names every attribute. Returns a list of str."""
    templates = rng.permutation(CAPTIONS_PER_SCENE)                           # (5,)
    return [_coco_noise(_caption(scene, int(t), rng), rng) for t in templates]


def v2_captions(scene, rng):
    """synthetic_v2.scene_captions with the same COCO-like surface noise as v1's captions."""
    return [_coco_noise(c, rng) for c in synthetic_v2.scene_captions(scene, rng)]


@dataclass(frozen=True)
class World:
    """One world's vocabulary and grammar, as scene_factors, image_model and make_world read
    them. attributes: ((name, values), ...), each kind block's one-hots in this order."""
    settings: tuple
    kinds: tuple
    attributes: tuple
    w1_std: float                   # image_model's first-layer std (pre-activation std ~ 1.2)
    sample_scene: Callable          # rng -> scene dict
    scene_captions: Callable        # (scene, rng) -> CAPTIONS_PER_SCENE captions (str)

    @property
    def kind_block(self):
        return 1 + sum(len(values) for _, values in self.attributes)  # present bit + one-hots

    @property
    def n_factors(self):
        return len(self.settings) + len(self.kinds) * self.kind_block


WORLDS = {"v1": World(tuple(SETTINGS), tuple(KINDS), tuple(ATTRIBUTES), W1_STD, sample_scene,
                      scene_captions),                                    # F = 246
          "v2": World(tuple(synthetic_v2.SETTINGS), tuple(synthetic_v2.KINDS),
                      tuple(synthetic_v2.ATTRIBUTES), synthetic_v2.W1_STD,
                      synthetic_v2.sample_scene, v2_captions)}             # F = 24 + 60 * 24


def world_of(coco):
    """The world version a captions file (its parsed json) was written by: info["world"],
    "v1" for files from before #22 (which did not record it)."""
    return (coco.get("info") or {}).get("world", "v1")


def make_world(n_scenes, rng, d_img=D_IMG, noise=NOISE, world=DEFAULT_WORLD):
    """A SYNTHETIC world of n_scenes scenes of `world` ("v1" | "v2"). rng: np.random.Generator,
    split into three streams (scenes + ids, caption wording, embedding noise) so changing one
    does not shift the others.
    Returns {"image_ids": (N,) int64 distinct in [1, MAX_IMAGE_ID), "scenes": list of N dicts,
    "captions": N lists of 5 str, "factors": (N, F) float64,
    "embeddings": (N, d_img) float32}. Raises ValueError for n_scenes outside [1, 10**5] or an
    unknown world."""
    if not 1 <= n_scenes <= 10**5:
        raise ValueError(f"n_scenes must be in [1, 100000], got {n_scenes}")
    if world not in WORLDS:
        raise ValueError(f"unknown world {world!r}; choose one of {', '.join(WORLDS)}")
    spec = WORLDS[world]
    seeds = rng.integers(0, 2**63, size=3)                                    # (3,) one per stream
    rng_scene, rng_text, rng_noise = (np.random.default_rng(int(s)) for s in seeds)
    scenes = [spec.sample_scene(rng_scene) for _ in range(n_scenes)]
    image_ids = rng_scene.choice(np.arange(1, MAX_IMAGE_ID), size=n_scenes, replace=False)  # (N,)
    captions = [spec.scene_captions(scene, rng_text) for scene in scenes]
    factors = np.stack([scene_factors(scene, world) for scene in scenes])     # (N, F)
    embeddings = embed_scenes(factors, noise, rng_noise, d_img, world)        # (N, d_img)
    return {"image_ids": image_ids.astype(np.int64), "scenes": scenes, "captions": captions,
            "factors": factors, "embeddings": embeddings}


def write_world(out_dir, n_scenes=2000, seed=0, force=False, noise=NOISE, world=DEFAULT_WORLD):
    """Write a SYNTHETIC world as out_dir/captions_synthetic.json (COCO captions format) and
    out_dir/embeddings_synthetic.npz (minialign.embeddings format: image_ids (N,) int64,
    embeddings (N, 768) float32, meta: 0-d str of JSON incl. captions_sha256 of the captions
    file's bytes, "synthetic": true and "world"; the captions' "info" names the world too).
    world: "v1" | "v2" (make_world). Each file goes to a temporary name, then os.replace.
    Same seed -> same bytes. Annotations are in a shuffled order and image ids are random
    (not row indices), so loaders must group captions by image_id and join on ids.
    Returns (captions_path, embeddings_path). Raises FileExistsError naming an existing output
    unless force=True."""
    paths = (os.path.join(out_dir, CAPTIONS_NAME), os.path.join(out_dir, EMBEDDINGS_NAME))
    for path in paths:
        if os.path.exists(path) and not force:
            raise FileExistsError(f"{path} already exists; pass force=True (--force) to overwrite it")
    rng_world, rng_file = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    made = make_world(n_scenes, rng_world, D_IMG, noise, world)
    images = [{"id": int(i), "file_name": "synthetic_%06d" % i, "synthetic_scene": scene}
              for i, scene in zip(made["image_ids"], made["scenes"])]
    pairs = [(int(i), c) for i, caps in zip(made["image_ids"], made["captions"]) for c in caps]
    order = rng_file.permutation(len(pairs))                                  # (5N,) file order
    annotations = [{"image_id": pairs[j][0], "id": ann_id, "caption": pairs[j][1]}
                   for ann_id, j in enumerate(order.tolist(), start=1)]
    coco = {"info": {"description": "SYNTHETIC minialign world, not COCO", "version": "1.0",
                     "seed": seed, "n_scenes": n_scenes, "noise": noise, "world": world},
            "licenses": [], "images": images, "annotations": annotations, "type": "captions"}
    captions_bytes = json.dumps(coco).encode("utf-8")
    meta = {"model": "synthetic (not DINOv2)",
            "preprocessing": "none (no pixels): binary scene factors -> fixed random tanh "
                             f"MLP (minialign.synthetic, WORLD_SEED={WORLD_SEED}, ATTR_SHARED="
                             f"{ATTR_SHARED}, world {world}) + Gaussian noise",
            "pooling": "none (one vector per scene)", "dtype": "float32",
            "count": n_scenes, "dim": D_IMG,
            "captions_sha256": hashlib.sha256(captions_bytes).hexdigest(),
            "synthetic": True, "seed": seed, "noise": noise, "world": world}
    os.makedirs(out_dir, exist_ok=True)
    atomic_write_bytes(paths[0], captions_bytes)
    # the real format's writer: atomic, fixed zip timestamps (same seed -> same bytes)
    save_embeddings(paths[1], made["image_ids"], made["embeddings"], meta, force=force)
    return paths


def world_ceiling(image_ids, factors, embeddings, k=MUTUAL_KNN_K, split_seed=SPLIT_SEED):
    """The world's own ceiling of mutual k-NN (metrics.mutual_knn): the alignment between the
    TEST scenes' factor vectors (what every caption of a scene states) and their image
    embeddings, on the photos and k the evaluation scores (data.split_photos of image_ids with
    split_seed, which depends only on the set of ids), in ascending id order as the evaluation
    holds them (factor vectors tie often and ties go to the lower row). A text encoder that
    recovered the factors exactly, with the factors' cosine geometry, would score this.
    image_ids: (N,) distinct ints; factors: (N, N_FACTORS) 0/1; embeddings: (N, D_img) float,
    row i of each = scene i (make_world's keys). Returns a float in [0, 1] (chance
    ~ k / (N_test - 1)). Raises ValueError for mismatched rows (and as split_photos and
    mutual_knn: too few scenes, k >= N_test)."""
    image_ids, factors = np.asarray(image_ids), np.asarray(factors, dtype=np.float64)
    if not len(image_ids) == len(factors) == len(embeddings):
        raise ValueError(f"image_ids, factors and embeddings must have one row per scene, got "
                         f"{len(image_ids)}, {len(factors)} and {len(embeddings)}")
    test = split_photos(image_ids, split_seed)["test"]                        # (N_test,)
    test = test[np.argsort(image_ids[test], kind="stable")]  # (N_test,) by id, as evaluated
    return mutual_knn(factors[test], np.asarray(embeddings)[test], k=k)


def world_ceiling_of_files(captions_path, embeddings_path, k=MUTUAL_KNN_K,
                           split_seed=SPLIT_SEED):
    """world_ceiling of a world written by write_world: the factors are rebuilt from each
    image's "synthetic_scene" in the captions file, joined to the embeddings file on image id.
    Returns a float in [0, 1]. Raises ValueError, naming the file, if the captions file holds
    no synthetic scenes or an id lacks an embedding (and as world_ceiling)."""
    coco = read_coco_json(captions_path)
    images = [im for im in coco.get("images", [])
              if isinstance(im, dict) and "synthetic_scene" in im]
    if not images:
        raise ValueError(f"{captions_path}: no image has a synthetic_scene; not a world "
                         f"written by `python -m minialign synthetic`")
    emb = load_embeddings(embeddings_path)
    row_of = {int(i): r for r, i in enumerate(emb.image_ids.tolist())}
    missing = [im["id"] for im in images if int(im["id"]) not in row_of]
    if missing:
        raise ValueError(f"{embeddings_path}: no embedding for {len(missing)} scene(s) of "
                         f"{captions_path}, e.g. image id {missing[0]}")
    image_ids = np.array([int(im["id"]) for im in images], dtype=np.int64)   # (N,)
    factors = np.stack([scene_factors(im["synthetic_scene"], world_of(coco))
                        for im in images])                                    # (N, F)
    embeddings = emb.embeddings[[row_of[int(i)] for i in image_ids]]         # (N, D_img)
    return world_ceiling(image_ids, factors, embeddings, k, split_seed)
