"""How much two captions of one photo overlap: four statistics of a captions file, to calibrate
the synthetic world against COCO (`python -m minialign synthetic --stats --compare FILE`).

Every statistic reads a caption's CONTENT WORDS: its lowercase runs of letters a-z, minus
STOP_WORDS (articles, prepositions, pronouns, forms of "be"/"have"), as a set for the Jaccard
and coverage statistics:

    words_per_caption   content words per caption, repeats counted
    same_photo_jaccard  Jaccard |A & B| / |A | B| of the content-word sets of two captions of
                        one photo, averaged over every pair of a photo, then over photos
    random_jaccard      the same of two captions of two different photos (RANDOM_PAIRS pairs
                        drawn with RANDOM_PAIRS_SEED): the overlap of words alone
    coverage            share of a caption's content words that some OTHER caption of the same
                        photo also uses (the union of the photo's other captions), averaged
                        over captions: how partial one caption is as a view of the photo

Captions are read as training reads them (monitor.load_coco_captions: cleaned, repeats within
a photo dropped, photos with >= 2 captions); numpy and that loader only.
"""
import itertools
import re

import numpy as np

from ..run.monitor import load_coco_captions

STOP_WORDS = frozenset(
    "a an the of on in with and is are to at there this it its his her their that some near "
    "next by for from as while be being has have up into onto over under out down other each "
    "one".split())  # "one" is nearly always "one of" / "a one-way" in COCO, not a count
WORD_RE = re.compile(r"[a-z]+")
RANDOM_PAIRS = 20000      # caption pairs of different photos drawn for random_jaccard
RANDOM_PAIRS_SEED = 0     # their fixed draw, so the statistic is the same on every run
KEYS = ("words_per_caption", "same_photo_jaccard", "random_jaccard", "coverage")
LABELS = {"words_per_caption": "content words per caption",
          "same_photo_jaccard": "Jaccard, two captions of one photo",
          "random_jaccard": "Jaccard, captions of two random photos",
          "coverage": "share of a caption's words in another caption of its photo"}

# COCO val2017 (captions_val2017.json, 25,014 captions of 5,000 photos; 25,005 kept after the
# loader drops 9 repeats), measured with statistics_of_file on 2026-12-01 (issue #22's table,
# with its own stop list: 5.8, 0.208, 0.011, 0.56). The bands the synthetic world must meet.
COCO_VAL2017 = {"words_per_caption": 5.800, "same_photo_jaccard": 0.205,
                "random_jaccard": 0.0105, "coverage": 0.563}
BAND = 0.20               # each statistic within 20% of COCO's ...
RANDOM_JACCARD_MAX = 0.02  # ... except random_jaccard, which need only stay at most this


def content_words(caption):
    """The content words of one caption, in order: 'A dog on the beach.' -> ['dog', 'beach']."""
    return [w for w in WORD_RE.findall(caption.lower()) if w not in STOP_WORDS]


def jaccard(a, b):
    """|a & b| / |a | b| of two sets; 0 when both are empty."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def caption_statistics(photos):
    """The four statistics (module docstring) of photos: a sequence of per-photo sequences of
    caption strings, each photo with >= 2 captions. Returns {KEYS: float}. Raises ValueError
    for fewer than 2 photos or a photo with fewer than 2 captions."""
    words = [[content_words(c) for c in captions] for captions in photos]
    if len(words) < 2 or min(len(w) for w in words) < 2:
        raise ValueError("caption statistics need >= 2 photos, each with >= 2 captions")
    sets = [[set(w) for w in ws] for ws in words]
    same = [np.mean([jaccard(a, b) for a, b in itertools.combinations(s, 2)]) for s in sets]
    coverage = [len(s[i] & set().union(*(s[:i] + s[i + 1:]))) / len(s[i])
                for s in sets for i in range(len(s)) if s[i]]
    flat = [(p, c) for p, s in enumerate(sets) for c in s]              # (photo, word set)
    rng = np.random.default_rng(RANDOM_PAIRS_SEED)
    pairs = rng.integers(len(flat), size=(RANDOM_PAIRS, 2))              # (RANDOM_PAIRS, 2)
    random = [jaccard(flat[i][1], flat[j][1]) for i, j in pairs.tolist()
              if flat[i][0] != flat[j][0]]                             # two different photos
    return {"words_per_caption": float(np.mean([len(w) for ws in words for w in ws])),
            "same_photo_jaccard": float(np.mean(same)),
            "random_jaccard": float(np.mean(random)), "coverage": float(np.mean(coverage))}


def statistics_of_file(path):
    """caption_statistics of a COCO captions json, read as training reads it."""
    return caption_statistics(load_coco_captions(path).captions)


def outside_bands(stats, reference=COCO_VAL2017):
    """The statistics of `stats` outside the bands around `reference` (BAND; random_jaccard:
    at most RANDOM_JACCARD_MAX), as one string each; [] when every one is inside."""
    out = []
    for key in KEYS:
        if key == "random_jaccard":
            if stats[key] > RANDOM_JACCARD_MAX:
                out.append(f"{key} {stats[key]:.4f} > {RANDOM_JACCARD_MAX}")
        elif abs(stats[key] - reference[key]) > BAND * reference[key]:
            out.append(f"{key} {stats[key]:.3f} not within {BAND:.0%} of {reference[key]:.3f}")
    return out


def format_statistics(columns):
    """A markdown table: one row per statistic, one column per {name: stats} entry."""
    names = list(columns)
    lines = ["| statistic | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key in KEYS:
        digits = 4 if key == "random_jaccard" else 3
        lines.append(f"| {LABELS[key]} | "
                     + " | ".join(f"{columns[n][key]:.{digits}f}" for n in names) + " |")
    return "\n".join(lines)
