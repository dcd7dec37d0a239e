import numpy as np
import pytest

from minialign.machinery.run.monitor import has_word
from minialign.machinery.run.rundir import tokenizer_from_arrays, tokenizer_to_arrays
from minialign.tokenizer import (BOS, EOS, MASK, MAX_LEN, PAD, SPECIALS, UNK, Tokenizer,
                                 build_tokenizer, clean_caption, pad_batch, split_words)

CORPUS = ["a dog runs.", "a cat, a dog.", "the dog's ball"]
# counts: a 3; "." 2, dog 2; ",", ball, cat, dog's, runs, the 1 ("," < "." < letters in ASCII)
WORDS_MIN1 = ("a", ".", "dog", ",", "ball", "cat", "dog's", "runs", "the")
WORDS_MIN2 = ("a", ".", "dog")


def test_special_ids_match_names():
    assert (PAD, UNK, BOS, EOS, MASK) == (0, 1, 2, 3, 4)
    assert SPECIALS == ("<pad>", "<unk>", "<bos>", "<eos>", "<mask>")
    assert MAX_LEN == 64


def test_split_words_keeps_apostrophes_and_splits_punctuation():
    assert split_words("a man's bike, parked at 2 o'clock.") == \
        ["a", "man's", "bike", ",", "parked", "at", "2", "o'clock", "."]
    assert split_words("a hot-dog & fries!") == ["a", "hot", "-", "dog", "&", "fries", "!"]
    assert split_words("") == []


def test_build_tokenizer_exact_vocab():
    assert build_tokenizer(CORPUS).vocab == SPECIALS + WORDS_MIN1
    assert build_tokenizer(CORPUS, min_count=2).vocab == SPECIALS + WORDS_MIN2
    tok = build_tokenizer(CORPUS)
    assert len(tok.vocab) == tok.vocab_size == 14
    assert tok.index["a"] == 5 and tok.index["the"] == 13
    # the same words in another caption order give the same vocabulary
    assert build_tokenizer(CORPUS[::-1]).vocab == tok.vocab
    with pytest.raises(ValueError, match="min_count"):
        build_tokenizer(CORPUS, min_count=0)


def test_encode_decode_round_trip_and_unk():
    tok = build_tokenizer(CORPUS)
    ids, truncated = tok.encode("a dog runs.")
    assert ids.dtype == np.int32 and not truncated
    assert ids.tolist() == [BOS, 5, 7, 12, 6, EOS]
    assert tok.decode(ids) == "a dog runs ."
    for caption in CORPUS:
        assert tok.decode(tok.encode(caption)[0]) == " ".join(split_words(caption))
    ids, _ = tok.encode("a bird runs")
    assert ids.tolist() == [BOS, 5, UNK, 12, EOS]
    assert tok.decode(ids) == "a <unk> runs"
    assert tok.encode("")[0].tolist() == [BOS, EOS]


def test_encode_and_vocabulary_clean_raw_text():
    tok = build_tokenizer(CORPUS)
    # "the dog's ball" is ids [BOS, the 13, dog's 11, ball 9, EOS] whatever the raw form
    for raw in ["the dog's ball", "The Dog\u2019s  BALL\n", " the dog\u02bcs ball\t"]:
        assert tok.encode(raw)[0].tolist() == [BOS, 13, 11, 9, EOS], raw
    # the vocabulary of raw captions is the vocabulary of their cleaned forms
    raw_corpus = ["A Dog runs.", " a cat,  A DOG.", "The dog\u2019s ball\n"]
    assert build_tokenizer(raw_corpus).vocab == SPECIALS + WORDS_MIN1
    nfd = build_tokenizer(["un cafe\u0301", "un caf\u00e9"])           # one word, seen twice
    assert nfd.vocab == SPECIALS + ("caf\u00e9", "un")
    assert nfd.encode("Cafe\u0301")[0].tolist() == [BOS, 5, EOS]
    assert nfd.encode("caf\u00e9")[0].tolist() == [BOS, 5, EOS]
    assert clean_caption("Cafe\u0301") == "caf\u00e9"


def test_has_word():
    assert has_word("a dog.") and has_word("2") and has_word("caf\u00e9")
    assert not has_word("") and not has_word(" . ") and not has_word("?! -")


def test_decode_omits_pad_and_stops_at_eos():
    tok = build_tokenizer(CORPUS)
    assert tok.decode(np.array([BOS, 5, 7, EOS, PAD, PAD])) == "a dog"
    assert tok.decode([BOS, 5, MASK, 7, EOS, 9]) == "a <mask> dog"
    with pytest.raises(ValueError, match="token ids"):
        tok.decode([BOS, 14, EOS])


def test_truncation_keeps_first_tokens_and_ends_with_eos():
    tok = build_tokenizer(CORPUS)
    caption = "a dog runs. a cat"                  # 6 words -> 8 tokens with BOS, EOS
    ids, truncated = tok.encode(caption, max_len=5)
    assert truncated and ids.tolist() == [BOS, 5, 7, 12, EOS]
    ids, truncated = tok.encode(caption, max_len=7)
    assert truncated and ids.tolist() == [BOS, 5, 7, 12, 6, 5, EOS]
    ids, truncated = tok.encode(caption, max_len=8)
    assert not truncated and ids.tolist() == [BOS, 5, 7, 12, 6, 5, 10, EOS]
    with pytest.raises(ValueError, match="max_len"):
        tok.encode(caption, max_len=1)
    encoded = [tok.encode(c, max_len=6) for c in (caption, "a dog", caption)]
    assert [(len(ids), cut) for ids, cut in encoded] == [(6, True), (4, False), (6, True)]


def test_pad_batch_pads_to_longest_in_batch():
    tokens = pad_batch([np.array([BOS, 5, EOS], np.int32), np.array([BOS, EOS], np.int32)])
    assert tokens.dtype == np.int32
    assert tokens.tolist() == [[BOS, 5, EOS], [BOS, EOS, PAD]]
    with pytest.raises(ValueError):
        pad_batch([])


def test_save_load_round_trip_through_npz(tmp_path):
    tok = build_tokenizer(CORPUS + ["un café crème"])
    path = tmp_path / "ckpt.npz"
    np.savez(path, tok_emb=np.zeros((tok.vocab_size, 2), np.float32), **tokenizer_to_arrays(tok))
    with np.load(path, allow_pickle=False) as arrays:
        loaded = tokenizer_from_arrays(arrays)
        assert sorted(arrays.files) == ["tok_emb", "tokenizer.vocab"]
    assert loaded == tok and loaded.vocab == tok.vocab
    assert loaded.encode("un café crème")[0].tolist() == tok.encode("un café crème")[0].tolist()


def test_bad_vocab_arrays_raise():
    good = list(SPECIALS) + ["a", "dog"]
    swapped = [SPECIALS[1], SPECIALS[0]] + good[2:]
    with pytest.raises(ValueError, match="must start with"):
        tokenizer_from_arrays({"tokenizer.vocab": np.array(swapped)})
    with pytest.raises(ValueError, match="must start with"):
        tokenizer_from_arrays({"tokenizer.vocab": np.array(good[1:])})
    with pytest.raises(ValueError, match="repeated"):
        tokenizer_from_arrays({"tokenizer.vocab": np.array(good + ["a"])})
    with pytest.raises(ValueError, match="unicode"):
        tokenizer_from_arrays({"tokenizer.vocab": np.arange(7)})
    with pytest.raises(ValueError, match="1-D"):
        tokenizer_from_arrays({"tokenizer.vocab": np.array([good, good])})
    with pytest.raises(ValueError, match="no 'tokenizer.vocab'"):
        tokenizer_from_arrays({"vocab": np.array(good)})
    with pytest.raises(ValueError, match="must start with"):
        Tokenizer(vocab=("a",) + SPECIALS)
