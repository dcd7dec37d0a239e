"""A SYNTHETIC world: scenes, captions and fake "image embeddings" in the real data's two formats
(COCO captions JSON, embeddings .npz), both saying they are not COCO or DINOv2. A scene is a
setting plus 2-5 objects of different kinds (colour, count, size, position), most salient first.
Each of its 5 captions mentions a SUBSET (the setting with P_SETTING, the object of rank r with
P_OBJECT[r], at least one, an attribute with P_ATTRIBUTE), as two annotators' captions of a photo
(scripts/calibrate.py matches COCO's statistics). The image embedding is a FIXED random map of ALL
the scene's binary factors x (F,): y = tanh(x w1 + b1) w2 + b2 + NOISE * eps, eps ~ N(0, I)."""
import hashlib
import json
import re
from pathlib import Path

import numpy as np

from ..data import SPLIT_SEED, split_photos
from ..metrics import MUTUAL_KNN_K, knn_indices
from .images import images_of, load_embeddings
from .runs import atomic_write, read_json, savez

WORLD = "v2"           # the name both files record
WORLD_SEED = 20240601  # seeds the fixed image model, the same for every world
D_IMG, HIDDEN = 768, 512  # DINOv2-base's width, which these stand in for; the model's hidden width
W1_STD = 0.25          # ~18.5 active factors -> pre-activation std ~ 1.2: tanh bends, not saturated
B1_STD, B2_STD = 0.5, 1.0  # tanh not an odd function of x; a stand-in for DINOv2's large mean
ATTR_SHARED = 0.5      # share of an attribute's w1 row common to every kind (red on a dog ~ a cup)
NOISE = 0.1            # std of the Gaussian "photo" noise on each embedding coordinate
MAX_IMAGE_ID = 10**6   # ids drawn from [1, 10**6) without replacement: like COCO, not row indices
CAPTIONS_NAME, EMBEDDINGS_NAME = "captions_synthetic.json", "embeddings_synthetic.npz"
CAPTIONS_PER_SCENE = 5         # as COCO
N_OBJECTS = (2, 3, 4, 5)       # objects per scene, uniform: richer than a caption
P_SETTING = 0.7                # a caption names the setting
P_OBJECT = (0.95, 0.45, 0.3, 0.2, 0.15)  # ... the object of salience rank 0, 1, ...
P_ATTRIBUTE = {"colour": 0.35, "size": 0.12, "count": 1.0, "position": 0.1}  # of an object named
SALIENT_BOOST = 2.0            # ... times this for the most salient object
COUNT_P = (0.8, 0.11, 0.06, 0.03)  # counts 1, 2, 3, 4
ZIPF = 2.0                     # synonym i of a value is used with weight 1 / (i + 1) ** ZIPF
P_VERB = 0.3                   # a caption adds a predicate ("sitting") after its objects
P_DETAIL = 0.5                 # a named object gets a word no image shows ("a nice cup")
P_NO_PERIOD, P_LOWER, P_UPPER = 0.3, 0.15, 0.03          # COCO-like surface noise ...
P_TRAILING_SPACE = 0.14        # ... COCO val2017: 3541 of 25,014 captions end in a space


def _plural(word):
    return (word[:-1] + "ies" if re.search(r"[^aeiou]y$", word) else
            word + "es" if re.search(r"(s|x|ch|sh)$", word) else word + "s")


# a kind's synonyms, most common first, as (singular, plural); an irregular plural after ":"
KINDS = {k.split()[0]: [(w.partition(":")[0], w.partition(":")[2] or _plural(w))
                        for w in k.split()] for k in (
    "dog puppy hound|cat kitten kitty|horse pony|cow cattle:cattle|bird sparrow|duck|elephant|"
    "giraffe|zebra|bear|car automobile sedan|truck lorry|bus coach|bicycle bike|"
    "motorcycle motorbike|boat dinghy canoe|train locomotive|airplane plane jet|cup mug|bowl dish|"
    "plate platter|bottle flask|vase pot|lamp light|chair seat stool|bench|table desk|couch sofa|"
    "bed mattress|clock|book novel|laptop notebook computer|phone cellphone|television tv|"
    "umbrella parasol|kite|ball|skateboard|surfboard board|frisbee disc|backpack rucksack|"
    "suitcase luggage:luggage|apple|banana|pizza|sandwich sub|cake pie|donut doughnut|carrot|"
    "sink basin|oven stove|fridge refrigerator|hat cap|shoe sneaker|flower daisy|tree bush|"
    "sign signpost|basket crate|guitar|teapot kettle").split("|")}
COLOURS = {c.split()[0]: c.split() for c in (
    "red crimson scarlet|blue navy azure|green emerald olive|yellow golden|black dark|white pale|"
    "orange tangerine|purple violet|brown tan|gray grey silver|pink rosy|striped").split("|")}
COUNTS = {1: ["a", "one"], 2: ["two", "a pair of", "a couple of"],
          3: ["three", "a few"], 4: ["four", "several", "a group of"]}
SIZES = {"small": ["small", "little", "tiny"], "big": ["large", "big", "huge"]}
POSITIONS = {"left": ["on the left", "to the left"], "right": ["on the right", "to the right"],
             "middle": ["in the middle", "in the centre"], "back": ["in the background",
             "at the back"], "front": ["in the foreground", "up front"]}
SETTINGS = {s.split(",")[0]: s.split(",") for s in (
    "kitchen,galley|street,road,avenue|beach,shore,seaside|park,lawn|living room,lounge|"
    "office,workspace|field,meadow,pasture|bedroom|bathroom,restroom|restaurant,cafe,diner|"
    "airport,runway|harbor,port,marina|garden,backyard|forest,woods|station,platform|"
    "market,bazaar|farm,barn|river,stream|lake,pond|snow,slope|city,downtown|zoo,enclosure|"
    "classroom,school|garage,driveway").split("|")}
SETTING_PREPOSITION = {"street": "on", "beach": "on", "farm": "on", "river": "by", "lake": "by",
                       "station": "at", "airport": "at", "market": "at"}  # "in" for the others
VERBS = ("sitting standing resting placed shown lying waiting kept parked seen gathered "
         "displayed arranged found set laid").split()
DETAILS = ("nice old new pretty cute lovely fancy plain shiny dirty clean empty full broken "
           "wooden metal plastic wet dry busy quiet colorful bright dim modern antique simple "
           "heavy lightweight cozy rustic vintage fresh messy neat odd sturdy worn polished "
           "cheap expensive favorite lone usual typical random funny strange beautiful ugly "
           "giant mini sleek shabby tidy").split()  # people's words that say little (uniform)
PICTURE = "picture photo image view shot snapshot scene photograph".split()
ATTRIBUTES = [("colour", list(COLOURS)), ("count", list(COUNTS)), ("size", list(SIZES)),
              ("position", list(POSITIONS))]
KIND_BLOCK = 1 + sum(len(values) for _, values in ATTRIBUTES)   # present bit + one-hots = 24
N_FACTORS = len(SETTINGS) + len(KINDS) * KIND_BLOCK             # 24 + 60 * 24 = 1464


def pick(options, rng, p=None):
    """One of options, i with weight 1 / (i + 1) ** ZIPF, or with probability p[i]."""
    w = 1 / np.arange(1, len(options) + 1) ** ZIPF
    return options[rng.choice(len(options), p=w / w.sum() if p is None else p)]


def sample_scene(rng):
    """{"setting", "objects": [{"kind", "colour", "count", "size", "position"}, ...]}: 2-5
    objects of different kinds, most salient first; count by COUNT_P, the rest uniform."""
    n_objects = int(rng.choice(N_OBJECTS))
    kinds = rng.choice(len(KINDS), size=n_objects, replace=False)               # (n_objects,)
    objects = [{"kind": list(KINDS)[k], "colour": str(rng.choice(list(COLOURS))),
                "count": pick(list(COUNTS), rng, COUNT_P), "size": str(rng.choice(list(SIZES))),
                "position": str(rng.choice(list(POSITIONS)))} for k in kinds.tolist()]
    return {"setting": str(rng.choice(list(SETTINGS))), "objects": objects}


def scene_factors(scene):
    """(N_FACTORS,) float64 of 0s and 1s: the setting's one-hot, then one KIND_BLOCK per kind
    (present bit, colour, count, size, position one-hots; zeros if the kind is absent)."""
    x = np.zeros(N_FACTORS)                                                     # (F,)
    x[list(SETTINGS).index(scene["setting"])] = 1.0
    for obj in scene["objects"]:
        offset = len(SETTINGS) + list(KINDS).index(obj["kind"]) * KIND_BLOCK
        x[offset] = 1.0
        for name, values in ATTRIBUTES:
            x[offset + 1 + values.index(obj[name])] = 1.0
            offset += len(values)
    return x


def _with_article(phrase):
    return re.sub(r"^a (?=[aeiou])", "an ", phrase)       # 'a orange cup' -> 'an orange cup'


def _object_phrase(obj, boost, rng):
    """'two old small crimson mugs to the left': the count always, the other attributes with
    P_ATTRIBUTE * boost, a DETAILS word with P_DETAIL."""
    said = {name: rng.random() < min(1.0, p * boost) for name, p in P_ATTRIBUTE.items()}
    singular, plural = pick(KINDS[obj["kind"]], rng)
    words = [pick(COUNTS[obj["count"]], rng)]
    words += [rng.choice(DETAILS)] if rng.random() < P_DETAIL else []
    words += [pick(SIZES[obj["size"]], rng)] if said["size"] else []
    words += [pick(COLOURS[obj["colour"]], rng)] if said["colour"] else []
    words += [singular if obj["count"] == 1 else plural]   # English order: count, size, colour
    words += [pick(POSITIONS[obj["position"]], rng)] if said["position"] else []
    return _with_article(" ".join(words))


def caption(scene, rng):
    """One partial caption of the scene (the module docstring), before surface noise."""
    mentioned = [r for r in range(len(scene["objects"])) if rng.random() < P_OBJECT[r]] or [0]
    phrases = [_object_phrase(scene["objects"][r], SALIENT_BOOST if r == 0 else 1.0, rng)
               for r in mentioned]
    said = [phrases[i] for i in rng.permutation(len(phrases))]
    items = said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]  # x, y and z
    many = len(said) > 1 or scene["objects"][mentioned[0]]["count"] > 1
    name = pick(SETTINGS[scene["setting"]], rng) if rng.random() < P_SETTING else None
    prep = SETTING_PREPOSITION.get(scene["setting"], "in")
    setting = name and f"{prep} {_with_article('a ' + name)}"
    verb = f" {rng.choice(VERBS)}" if rng.random() < P_VERB else ""
    where = verb + (f" {setting}" if setting else "")
    template = int(rng.integers(6))
    if template == 0:    # two red cups and a dog [sitting] in a kitchen
        text = f"{items}{where}"
    elif template == 1:  # there are two red cups [sitting] in a kitchen
        text = f"there {'are' if many else 'is'} {items}{where}"
    elif template == 2:  # a picture of two red cups [sitting] in a kitchen
        text = _with_article(f"a {rng.choice(PICTURE)} of {items}{where}")
    elif template == 3 and setting:  # in a kitchen, two red cups [sitting]
        text = f"{setting}, {items}{verb}"
    elif template == 4 and setting:  # a kitchen with two red cups [sitting]
        text = _with_article(f"a {name} with {items}{verb}")
    else:                # two red cups and a dog, [sitting] in a kitchen
        text = f"{items},{where}" if where else items
    return text[0].upper() + text[1:] + "."


def scene_captions(scene, rng):
    """CAPTIONS_PER_SCENE distinct captions (a repeat is drawn again, 250 draws at most), then
    COCO's surface noise on each: no period, lower or upper case, a trailing space."""
    captions, draws = [], 0
    while len(captions) < CAPTIONS_PER_SCENE and draws < 250:
        text, draws = caption(scene, rng), draws + 1
        captions += [] if text in captions else [text]
    for i, text in enumerate(captions):
        text = text[:-1] if rng.random() < P_NO_PERIOD else text
        r = rng.random()
        text = text.lower() if r < P_LOWER else text.upper() if r < P_LOWER + P_UPPER else text
        captions[i] = text + " " if rng.random() < P_TRAILING_SPACE else text
    return captions


def make_world(n_scenes, rng):
    """{"image_ids": (N,) int64 distinct, "scenes", "captions": N lists of 5 str, "factors":
    (N, F) float64 x, "embeddings": (N, D_IMG) float32 y}. rng seeds scenes and ids, wording,
    noise; the image model is drawn from default_rng(WORLD_SEED)."""
    rng_scene, rng_text, rng_noise = (np.random.default_rng(int(s))
                                      for s in rng.integers(0, 2**63, size=3))
    scenes = [sample_scene(rng_scene) for _ in range(n_scenes)]
    image_ids = rng_scene.choice(np.arange(1, MAX_IMAGE_ID), size=n_scenes, replace=False)
    captions = [scene_captions(scene, rng_text) for scene in scenes]
    x = np.stack([scene_factors(scene) for scene in scenes])                    # (N, F)
    model = np.random.default_rng(WORLD_SEED)
    w1 = model.standard_normal((N_FACTORS, HIDDEN)) * W1_STD                    # (F, HIDDEN)
    b1 = model.standard_normal(HIDDEN) * B1_STD
    w2 = model.standard_normal((HIDDEN, D_IMG)) / np.sqrt(HIDDEN)               # (HIDDEN, D_IMG)
    b2 = model.standard_normal(D_IMG) * B2_STD
    shared = model.standard_normal((KIND_BLOCK - 1, HIDDEN)) * W1_STD           # (23, HIDDEN)
    blocks = w1[len(SETTINGS):].reshape(len(KINDS), KIND_BLOCK, HIDDEN)         # a view of w1
    blocks[:, 1:] = np.sqrt(ATTR_SHARED) * shared + np.sqrt(1 - ATTR_SHARED) * blocks[:, 1:]
    y = np.tanh(x @ w1 + b1) @ w2 + b2                                          # (N, D_IMG)
    y = y + NOISE * rng_noise.standard_normal(y.shape)                          # (N, D_IMG)
    return {"image_ids": image_ids.astype(np.int64), "scenes": scenes, "captions": captions,
            "factors": x, "embeddings": y.astype(np.float32)}


def write_world(out, n_scenes=2000, seed=0, force=False):
    """Write out/captions_synthetic.json (COCO format plus each image's "synthetic_scene") and
    out/embeddings_synthetic.npz; same seed, same bytes. Returns the two paths."""
    paths = (Path(out) / CAPTIONS_NAME, Path(out) / EMBEDDINGS_NAME)
    for path in [p for p in paths if p.exists() and not force]:
        raise FileExistsError(f"{path}: already exists; pass --force to overwrite it")
    rng_world, rng_file = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    world = make_world(n_scenes, rng_world)
    ids = world["image_ids"].tolist()
    pairs = [(i, c) for i, caps in zip(ids, world["captions"]) for c in caps]
    order = rng_file.permutation(len(pairs)).tolist()                           # (5N,) file order
    coco = {"info": {"description": "SYNTHETIC minialign world, not COCO", "version": "1.0",
                     "seed": seed, "n_scenes": n_scenes, "noise": NOISE, "world": WORLD},
            "licenses": [],
            "images": [{"id": i, "file_name": "synthetic_%06d" % i, "synthetic_scene": s}
                       for i, s in zip(ids, world["scenes"])],
            "annotations": [{"image_id": pairs[j][0], "id": n, "caption": pairs[j][1]}
                            for n, j in enumerate(order, start=1)],
            "type": "captions"}
    captions_bytes = json.dumps(coco).encode()
    meta = {"model": "synthetic (not DINOv2)", "pooling": "none (one vector per scene)",
            "preprocessing": "none (no pixels): binary scene factors -> fixed random tanh MLP "
                             f"(minialign.synthetic, WORLD_SEED={WORLD_SEED}, ATTR_SHARED="
                             f"{ATTR_SHARED}, world {WORLD}) + Gaussian noise",
            "dtype": "float32", "count": n_scenes, "dim": D_IMG,
            "captions_sha256": hashlib.sha256(captions_bytes).hexdigest(),
            "synthetic": True, "seed": seed, "noise": NOISE, "world": WORLD}
    atomic_write(paths[0], captions_bytes)
    savez(paths[1], image_ids=world["image_ids"], embeddings=world["embeddings"],
          meta=np.array(json.dumps(meta, sort_keys=True)))
    return paths


def world_ceiling(image_ids, factors, embeddings, k=MUTUAL_KNN_K, split_seed=SPLIT_SEED):
    """Mutual k-NN (metrics.mutual_knn) in [0, 1] of the TEST scenes' factors (N, F) of 0s and
    1s with their embeddings (N, D): what a text encoder that recovered every scene would score."""
    test = split_photos(image_ids, split_seed)["test"]                          # (N_test,)
    test = test[np.argsort(image_ids[test], kind="stable")]
    knn_image = knn_indices(embeddings[test], k)             # (N_test, k); checks 1 <= k < N_test
    # the factors' k-NN ranked by cos^2 * n_i = G_ij^2 / n_j, G = f f^T exact integers, n_j = G_jj:
    # equal cosines are equal floats on any BLAS, and a stable sort gives ties to the lower row
    gram = factors[test] @ factors[test].T                                      # (N_test, N_test)
    key = gram**2 / np.diag(gram)[None, :]                                      # (N_test, N_test)
    np.fill_diagonal(key, -np.inf)                                              # never itself
    knn_text = np.argsort(-key, axis=1, kind="stable")[:, :k]                   # (N_test, k)
    overlap = [len(set(a) & set(b)) for a, b in zip(knn_text.tolist(), knn_image.tolist())]
    return float(np.mean(np.array(overlap) / k))


def world_ceiling_of_files(captions_path, embeddings_path, k=MUTUAL_KNN_K, split_seed=SPLIT_SEED):
    """world_ceiling of the world write_world wrote: factors from each image's
    "synthetic_scene", joined to the embeddings on image id. ValueError naming the file."""
    coco = read_json(captions_path)
    if not isinstance(coco, dict) or (coco.get("info") or {}).get("world") != WORLD:
        raise ValueError(f"{captions_path}: not a world {WORLD} file of `minialign synthetic`")
    ids = np.array([im["id"] for im in coco["images"]], dtype=np.int64)
    factors = np.stack([scene_factors(im["synthetic_scene"]) for im in coco["images"]])
    embeddings = images_of(load_embeddings(embeddings_path), ids, captions_path)  # (N, D)
    return world_ceiling(ids, factors, embeddings, k, split_seed)
