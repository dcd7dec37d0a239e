"""Tests of diagnose.py on hand-made captions and embeddings: the features by hand, and each
measure scoring ~1 on embeddings made from what it measures and ~0 on the others; the halves
come from the seed alone."""
import numpy as np
import pytest

from minialign.data import Captions
from minialign.machinery import diagnose, runs
from minialign.tokenizer import build_tokenizer

WORDS = [f"w{i}" for i in range(12)]


def test_features_by_hand():
    length, words, opening = diagnose.features([np.array([2, 7, 7, 5, 3]), np.array([2, 5, 3])])
    assert length.tolist() == [[0, 1], [1, 0]]                          # counts 5 and 3
    # columns: the ids 2, 3, 5, 7; BOS (2) and EOS (3) are never counted
    assert np.allclose(words, [[0, 0, 1 / 3, 2 / 3], [0, 0, 1, 0]])
    assert np.allclose(opening, [[0, 0, 0, 1], [0, 0, 1, 0]])          # 7, 7 | 5 (no EOS)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """300 photos, two captions each of 1..8 random words (length and words independent)."""
    rng = np.random.default_rng(1)
    caps = tuple(tuple(" ".join(rng.choice(WORDS, rng.integers(1, 9))) for _ in range(2))
                 for _ in range(300))
    captions = Captions("none", np.arange(100, 400), caps)
    return captions, build_tokenizer(WORDS), tmp_path_factory.mktemp("diagnose")


def scores(world, embed, seed=0):
    """measure() of a saved test file whose caption c of photo p has embedding embed(p, c)."""
    captions, tok, tmp = world
    z = [np.array([embed(p, c[s]) for p, c in enumerate(captions.captions)]) for s in (0, 1)]
    runs.savez(tmp / "test.npz", **{f"slot{s}_{k}": v for s in (0, 1) for k, v in
                                    (("image_ids", captions.image_ids), ("z", z[s]))})
    return diagnose.measure(tmp / "test.npz", captions, tok, 64, {}, seed)


def test_each_measure_finds_its_own(world):
    table = np.random.default_rng(2).standard_normal((300, 6))             # a vector per value
    count = lambda c: len(c.split())
    by_length = scores(world, lambda p, c: table[count(c)])
    assert by_length["length"] > 0.999 and abs(by_length["words"]) < 0.05
    assert abs(by_length["opening"]) < 0.05 and abs(by_length["paraphrase"]) < 0.05
    mean = lambda c: sum(table[int(w[1:])] for w in c.split()) / count(c)    # nearly unit:
    by_words = scores(world, lambda p, c: np.append(0.05 * mean(c), 1.0))   # nearly linear
    assert by_words["words"] > 0.99 and abs(by_words["length"]) < 0.05
    by_photo = scores(world, lambda p, c: table[p])
    assert by_photo["paraphrase"] > 0.999 and abs(by_photo["length"]) < 0.05
    by_opening = scores(world, lambda p, c: np.append(0.05 * mean(" ".join(c.split()[:2])), 1))
    assert by_opening["opening"] > 0.99 and by_opening["words"] < 0.6


def test_deterministic_given_the_seed(world):
    embed = lambda p, c: np.random.default_rng(len(c)).standard_normal(4) + np.sin(p)
    assert scores(world, embed, 3) == scores(world, embed, 3)
    assert scores(world, embed, 3) != scores(world, embed, 4)
