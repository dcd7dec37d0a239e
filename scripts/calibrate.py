"""The synthetic world's calibration: four statistics of how much two captions of one photo
overlap, for the world that `python -m minialign synthetic` writes and for COCO val2017.

    python scripts/calibrate.py [--n-scenes 2000] [--seed 0] [--compare captions_val2017.json]

Every statistic reads a caption's CONTENT WORDS: its lowercase runs of letters a-z, minus
STOP_WORDS, as a set for the Jaccard and coverage statistics:
    words_per_caption   content words per caption, repeats counted
    same_photo_jaccard  |A & B| / |A | B| of two captions of one photo, averaged over the photo's
                        pairs, then over photos
    random_jaccard      the same for two captions of two different photos (RANDOM_PAIRS pairs)
    coverage            share of a caption's words that another caption of its photo also uses
Captions are read as training reads them (minialign.data.load_captions). The world's
probabilities (minialign/machinery/synthetic.py) were chosen only to bring its statistics
within BAND of COCO's (random_jaccard: at most RANDOM_JACCARD_MAX) while keeping its ceiling
well above chance. Prints a table and the verdict; exit 0 when every statistic is inside.
"""
import argparse
import itertools
import re
import sys
import tempfile

import numpy as np

from minialign.data import load_captions
from minialign.machinery.synthetic import write_world

STOP_WORDS = frozenset(
    "a an the of on in with and is are to at there this it its his her their that some near "
    "next by for from as while be being has have up into onto over under out down other each "
    "one".split())  # "one" is nearly always "one of" / "a one-way" in COCO, not a count
WORD_RE = re.compile(r"[a-z]+")
RANDOM_PAIRS, RANDOM_PAIRS_SEED = 20000, 0   # pairs of different photos for random_jaccard
KEYS = ("words_per_caption", "same_photo_jaccard", "random_jaccard", "coverage")
LABELS = ("content words per caption", "Jaccard, two captions of one photo",
          "Jaccard, captions of two random photos",
          "share of a caption's words in another caption of its photo")
# statistics_of_file of captions_val2017.json (25,014 captions of 5,000 photos)
COCO_VAL2017 = {"words_per_caption": 5.800, "same_photo_jaccard": 0.205,
                "random_jaccard": 0.0105, "coverage": 0.563}
BAND = 0.20                # each statistic within 20% of COCO's ...
RANDOM_JACCARD_MAX = 0.02  # ... but random_jaccard, which need only stay at most this


def content_words(caption):
    """'A dog on the beach.' -> ['dog', 'beach']."""
    return [w for w in WORD_RE.findall(caption.lower()) if w not in STOP_WORDS]


def jaccard(a, b):
    """|a & b| / |a | b| of two sets; 0 when both are empty."""
    return len(a & b) / len(a | b) if a | b else 0.0


def caption_statistics(photos):
    """{KEYS: float} of photos: a sequence of per-photo sequences of caption strings.
    Raises ValueError for fewer than 2 photos or a photo with fewer than 2 captions."""
    words = [[content_words(c) for c in captions] for captions in photos]
    if len(words) < 2 or min(len(w) for w in words) < 2:
        raise ValueError("caption statistics need >= 2 photos, each with >= 2 captions")
    sets = [[set(w) for w in ws] for ws in words]
    same = [np.mean([jaccard(a, b) for a, b in itertools.combinations(s, 2)]) for s in sets]
    coverage = [len(s[i] & set().union(*(s[:i] + s[i + 1:]))) / len(s[i])
                for s in sets for i in range(len(s)) if s[i]]
    flat = [(p, c) for p, s in enumerate(sets) for c in s]                     # (photo, word set)
    pairs = np.random.default_rng(RANDOM_PAIRS_SEED).integers(len(flat), size=(RANDOM_PAIRS, 2))
    random = [jaccard(flat[i][1], flat[j][1]) for i, j in pairs.tolist()
              if flat[i][0] != flat[j][0]]                                    # two different photos
    return {"words_per_caption": float(np.mean([len(w) for ws in words for w in ws])),
            "same_photo_jaccard": float(np.mean(same)),
            "random_jaccard": float(np.mean(random)), "coverage": float(np.mean(coverage))}


def statistics_of_file(path):
    return caption_statistics(load_captions(path).captions)


def outside_bands(stats, reference=COCO_VAL2017):
    """The statistics outside the bands around reference, one string each; [] if none."""
    out = []
    for key in KEYS:
        if key == "random_jaccard" and stats[key] > RANDOM_JACCARD_MAX:
            out.append(f"{key} {stats[key]:.4f} > {RANDOM_JACCARD_MAX}")
        elif key != "random_jaccard" and abs(stats[key] - reference[key]) > BAND * reference[key]:
            out.append(f"{key} {stats[key]:.3f} not within {BAND:.0%} of {reference[key]:.3f}")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-scenes", type=int, default=2000, help="scenes in the world")
    p.add_argument("--seed", type=int, default=0, help="the world's seed")
    p.add_argument("--compare", metavar="COCO_JSON",
                   help="measure this COCO captions file instead of the recorded COCO_VAL2017")
    args = p.parse_args(argv)
    coco, name = COCO_VAL2017, "COCO val2017 (recorded)"
    if args.compare:
        coco, name = statistics_of_file(args.compare), args.compare
    with tempfile.TemporaryDirectory() as tmp:
        world = statistics_of_file(write_world(tmp, args.n_scenes, args.seed)[0])
    print(f"| statistic | {name} | world, {args.n_scenes} scenes, seed {args.seed} |")
    print("|---|---:|---:|")
    for key, label in zip(KEYS, LABELS):
        digits = 4 if key == "random_jaccard" else 3
        print(f"| {label} | {coco[key]:.{digits}f} | {world[key]:.{digits}f} |")
    outside = outside_bands(world, coco)
    print("outside the bands: " + "; ".join(outside) if outside else
          f"every statistic within the bands (within {BAND:.0%} of COCO's; random-pair "
          f"Jaccard <= {RANDOM_JACCARD_MAX})")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
