"""The calibrated SYNTHETIC world ("v2", the default since #22): scenes richer than any one
caption, and captions that are PARTIAL views of them, as COCO's are.

A scene is a setting plus 2-5 objects of different kinds, most salient first; each object has
a colour, a count, a size and a position. Its 5 captions each mention a SUBSET: the setting
with P_SETTING, the object of salience rank r with P_OBJECT[r] (at least one object), each
attribute of a mentioned object with P_ATTRIBUTE (times SALIENT_BOOST for the most salient),
in one of many templates, with Zipf-weighted synonyms (the common word most often, as people
use "dog" more than "hound"). So two captions of a scene share some words and miss others,
and an encoder that makes them agree must represent the scene, not the words. The image
embedding is synthetic.image_model of the WHOLE scene's factors (what no caption mentions too).

Calibration (caption_stats.py; `python -m minialign synthetic --stats --compare FILE`): the
probabilities and vocabulary sizes below were chosen ONLY to bring four caption statistics of
a 2000-scene world, seed 0, within 20% of COCO val2017's (caption_stats.COCO_VAL2017:
content words per caption 5.80, same-photo Jaccard 0.205, random-pair Jaccard 0.0105 (at
most 0.02), coverage 0.563; measured here: CALIBRATED), and keep the world's ceiling (scene
factors vs images) well above chance. No objective's score was looked at to choose them.
"""
import re

import numpy as np

CAPTIONS_PER_SCENE = 5         # as COCO
N_OBJECTS = (2, 3, 4, 5)       # objects per scene, drawn uniformly: richer than a caption
P_SETTING = 0.7                # a caption names the setting
P_OBJECT = (0.95, 0.45, 0.3, 0.2, 0.15)  # ... the object of salience rank 0, 1, ...
P_ATTRIBUTE = {"colour": 0.35, "size": 0.12, "count": 1.0, "position": 0.1}  # of a mentioned
SALIENT_BOOST = 2.0            # object; the most salient one's attributes are named more often
COUNT_P = (0.8, 0.11, 0.06, 0.03)  # counts 1, 2, 3, 4: most things come one at a time
ZIPF = 2.0                     # synonym i of a value is used with weight 1 / (i + 1) ** ZIPF
W1_STD = 0.25                  # ~18.5 active factors -> pre-activation std ~ 1.24, as v1's 0.35
#   with ~11 (synthetic.W1_STD): tanh bends, not saturated
# caption_stats of `python -m minialign synthetic --world v2` (2000 scenes, seed 0), after the
# choices above; the old world v1 has 11.87, 0.447, 0.106, 0.892. World ceiling (scene factors
# vs images, test split, k = 10, chance 0.025): 0.379 (v1: 0.542).
CALIBRATED = {"words_per_caption": 5.749, "same_photo_jaccard": 0.208,
              "random_jaccard": 0.0160, "coverage": 0.603}


def forms(spec):
    """'dog puppy hound' -> [('dog', 'dogs'), ('puppy', 'puppies'), ('hound', 'hounds')];
    an irregular plural as 'mouse:mice'. Synonyms most common first."""
    out = []
    for word in spec.split():
        singular, _, plural = word.partition(":")
        if not plural:
            plural = (singular[:-1] + "ies" if re.search(r"[^aeiou]y$", singular)
                      else singular + "es" if re.search(r"(s|x|ch|sh)$", singular)
                      else singular + "s")
        out.append((singular, plural))
    return out


KINDS = {k.split()[0]: forms(k) for k in [
    "dog puppy hound", "cat kitten kitty", "horse pony", "cow cattle:cattle", "bird sparrow",
    "duck", "elephant", "giraffe", "zebra", "bear", "car automobile sedan", "truck lorry",
    "bus coach", "bicycle bike", "motorcycle motorbike", "boat dinghy canoe", "train locomotive",
    "airplane plane jet", "cup mug", "bowl dish", "plate platter", "bottle flask",
    "vase pot", "lamp light", "chair seat stool", "bench", "table desk", "couch sofa",
    "bed mattress", "clock", "book novel", "laptop notebook computer", "phone cellphone",
    "television tv", "umbrella parasol", "kite", "ball", "skateboard", "surfboard board",
    "frisbee disc", "backpack rucksack", "suitcase luggage:luggage", "apple", "banana",
    "pizza", "sandwich sub", "cake pie", "donut doughnut", "carrot", "sink basin",
    "oven stove", "fridge refrigerator", "hat cap", "shoe sneaker", "flower daisy",
    "tree bush", "sign signpost", "basket crate", "guitar", "teapot kettle"]}
COLOURS = {c.split()[0]: c.split() for c in [
    "red crimson scarlet", "blue navy azure", "green emerald olive", "yellow golden",
    "black dark", "white pale", "orange tangerine", "purple violet", "brown tan",
    "gray grey silver", "pink rosy", "striped"]}
COUNTS = {1: ["a", "one"], 2: ["two", "a pair of", "a couple of"],
          3: ["three", "a few"], 4: ["four", "several", "a group of"]}
SIZES = {"small": ["small", "little", "tiny"], "big": ["large", "big", "huge"]}
POSITIONS = {"left": ["on the left", "to the left"], "right": ["on the right", "to the right"],
             "middle": ["in the middle", "in the centre"],
             "back": ["in the background", "at the back"],
             "front": ["in the foreground", "up front"]}
SETTINGS = {s.split(":")[0]: s.split(":")[1].split(",") for s in [
    "kitchen:kitchen,galley", "street:street,road,avenue", "beach:beach,shore,seaside",
    "park:park,lawn", "living room:living room,lounge", "office:office,workspace",
    "field:field,meadow,pasture", "bedroom:bedroom", "bathroom:bathroom,restroom",
    "restaurant:restaurant,cafe,diner", "airport:airport,runway", "harbor:harbor,port,marina",
    "garden:garden,backyard", "forest:forest,woods", "station:station,platform",
    "market:market,bazaar", "farm:farm,barn", "river:river,stream", "lake:lake,pond",
    "snow:snow,slope", "city:city,downtown", "zoo:zoo,enclosure", "classroom:classroom,school",
    "garage:garage,driveway"]}
SETTING_PREPOSITION = {"street": "on", "beach": "on", "field": "in", "farm": "on",
                       "river": "by", "lake": "by", "snow": "in", "station": "at",
                       "airport": "at", "market": "at"}  # "in" for the others
P_VERB = 0.3                   # a caption adds a predicate ("sitting") after its objects
VERBS = ["sitting", "standing", "resting", "placed", "shown", "lying", "waiting", "kept",
         "parked", "seen", "gathered", "displayed", "arranged", "found", "set", "laid"]
P_DETAIL = 0.5                # a mentioned object gets a word no image shows ("a nice cup")
DETAILS = ("nice old new pretty cute lovely fancy plain shiny dirty clean empty full broken "
           "wooden metal plastic wet dry busy quiet colorful bright dim modern antique simple "
           "heavy lightweight cozy rustic vintage fresh messy neat odd sturdy worn polished "
           "cheap expensive favorite lone usual typical random funny strange beautiful ugly "
           "giant mini sleek shabby tidy").split()  # people's words that say little (uniform)
PICTURE = ["picture", "photo", "image", "view", "shot", "snapshot", "scene", "photograph"]
ATTRIBUTES = [("colour", list(COLOURS)), ("count", list(COUNTS)), ("size", list(SIZES)),
              ("position", list(POSITIONS))]


def pick(options, rng):
    """One of options, synonym i with weight 1 / (i + 1) ** ZIPF (the first is commonest)."""
    weights = 1.0 / np.arange(1, len(options) + 1) ** ZIPF                      # (n,)
    return options[int(rng.choice(len(options), p=weights / weights.sum()))]


def sample_scene(rng):
    """{"setting": str, "objects": [{"kind", "colour", "count", "size", "position"}]}, 2-5
    objects of different kinds, MOST SALIENT FIRST (the order captions favour). Colour, size,
    position uniform; count by COUNT_P. rng: np.random.Generator."""
    n_objects = int(rng.choice(N_OBJECTS))
    kinds = rng.choice(len(KINDS), size=n_objects, replace=False)            # (n_objects,)
    objects = [{"kind": list(KINDS)[k], "colour": list(COLOURS)[int(rng.integers(len(COLOURS)))],
                "count": int(rng.choice(list(COUNTS), p=COUNT_P)),
                "size": list(SIZES)[int(rng.integers(len(SIZES)))],
                "position": list(POSITIONS)[int(rng.integers(len(POSITIONS)))]}
               for k in kinds.tolist()]
    return {"setting": list(SETTINGS)[int(rng.integers(len(SETTINGS)))], "objects": objects}


def _with_article(phrase):
    """'a' -> 'an' before a vowel: 'a orange cup' -> 'an orange cup'."""
    return re.sub(r"^a (?=[aeiou])", "an ", phrase)


def _join(items):
    """['x'] -> 'x'; ['x', 'y', 'z'] -> 'x, y and z'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _object_phrase(obj, boost, rng):
    """'two old small crimson mugs to the left': the count always, each other attribute with
    its P_ATTRIBUTE (times boost), a DETAILS word with P_DETAIL, synonyms by pick.
    Returns (phrase, plural?)."""
    said = {name: rng.random() < min(1.0, p * boost) for name, p in P_ATTRIBUTE.items()}
    singular, plural = pick(KINDS[obj["kind"]], rng)
    words = [pick(COUNTS[obj["count"]], rng)]
    words += [DETAILS[int(rng.integers(len(DETAILS)))]] if rng.random() < P_DETAIL else []
    words += [pick(SIZES[obj["size"]], rng)] if said["size"] else []
    words += [pick(COLOURS[obj["colour"]], rng)] if said["colour"] else []
    words += [singular if obj["count"] == 1 else plural]   # English order: count, size, colour
    phrase = _with_article(" ".join(words))
    if said["position"]:
        phrase += " " + pick(POSITIONS[obj["position"]], rng)
    return phrase, obj["count"] > 1


def mentioned_objects(scene, rng):
    """Indices of the objects one caption mentions: rank r with P_OBJECT[r], at least the most
    salient one if the draw names none. Returns a list of ints, salience order."""
    said = [r for r in range(len(scene["objects"])) if rng.random() < P_OBJECT[r]]
    return said or [0]


def caption(scene, rng):
    """One partial caption of the scene (module docstring), in one of 6 templates."""
    objs = [_object_phrase(scene["objects"][r], SALIENT_BOOST if r == 0 else 1.0, rng)
            for r in mentioned_objects(scene, rng)]
    order = rng.permutation(len(objs))                                         # (n_said,)
    items = _join([objs[i][0] for i in order])
    many = objs[order[0]][1] or len(objs) > 1
    setting = None
    if rng.random() < P_SETTING:
        name = pick(SETTINGS[scene["setting"]], rng)
        setting = f"{SETTING_PREPOSITION.get(scene['setting'], 'in')} " + _with_article(f"a {name}")
    verb = f" {VERBS[int(rng.integers(len(VERBS)))]}" if rng.random() < P_VERB else ""
    where = verb + (f" {setting}" if setting else "")
    template = int(rng.integers(6))
    if template == 0:    # two red cups and a dog [sitting] in a kitchen
        text = f"{items}{where}"
    elif template == 1:  # there are two red cups [sitting] in a kitchen
        text = f"there {'are' if many else 'is'} {items}{where}"
    elif template == 2:  # a picture of two red cups [sitting] in a kitchen
        text = _with_article(f"a {PICTURE[int(rng.integers(len(PICTURE)))]} of {items}{where}")
    elif template == 3 and setting:  # in a kitchen, two red cups [sitting]
        text = f"{setting}, {items}{verb}"
    elif template == 4 and setting:  # a kitchen with two red cups [sitting]
        text = _with_article(f"a {setting.split(' ', 2)[2]} with {items}{verb}")
    else:                # two red cups and a dog, [sitting] in a kitchen
        text = f"{items},{where}" if where else items
    return text[0].upper() + text[1:] + "."


def scene_captions(scene, rng):
    """CAPTIONS_PER_SCENE partial captions of one scene, distinct (a repeat is drawn again,
    at most 50 times: a 2-object scene has fewer captions than that). Returns a list of str."""
    captions = []
    for _ in range(50 * CAPTIONS_PER_SCENE):
        text = caption(scene, rng)
        if text not in captions:
            captions.append(text)
        if len(captions) == CAPTIONS_PER_SCENE:
            break
    return captions
