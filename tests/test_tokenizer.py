"""Words (tokenizer.py) and WordPiece (wordpiece.py) by hand; with BERT's vocabulary (../shared),
ids identical to transformers' BertTokenizer on hard cases and every val2017 caption."""
import json
import shutil
import string

import numpy as np
import pytest
from conftest import BERT_VOCAB, shared

from minialign.tokenizer import (BOS, EOS, MASK, PAD, SPECIALS, UNK, Tokenizer, build_tokenizer,
                                 clean_caption, pad_batch, split_words)
from minialign.wordpiece import MAX_WORD_CHARS, basic_tokenize, read_vocab, word_pieces
from minialign.wordpiece import SPECIALS as BERT_SPECIALS

CORPUS = ["a dog runs.", "a cat, a dog.", "the dog's ball"]
# counts: a 3; "." 2, dog 2; ",", ball, cat, dog's, runs, the 1 ("," < "." < letters in ASCII)
WORDS = ("a", ".", "dog", ",", "ball", "cat", "dog's", "runs", "the")


def test_specials_and_split_words():
    assert (PAD, UNK, BOS, EOS, MASK) == (0, 1, 2, 3, 4) and SPECIALS[MASK] == "<mask>"
    assert split_words("a man's bike, parked at 2 o'clock.") == \
        ["a", "man's", "bike", ",", "parked", "at", "2", "o'clock", "."]
    assert split_words("a hot-dog & fries!") == ["a", "hot", "-", "dog", "&", "fries", "!"]


def test_build_tokenizer_exact_vocab():
    tok = build_tokenizer(CORPUS)
    assert tok.vocab == SPECIALS + WORDS and tok.vocab_size == 14
    assert build_tokenizer(CORPUS, min_count=2).vocab == SPECIALS + WORDS[:3]
    assert build_tokenizer(CORPUS[::-1]).vocab == tok.vocab        # caption order: no matter
    # raw captions give the vocabulary of their cleaned forms
    assert build_tokenizer(["A Dog runs.", " a cat,  A DOG.", "The dog\u2019s ball\n"]).vocab == \
        tok.vocab
    for bad in [SPECIALS[1::-1] + SPECIALS[2:], SPECIALS + ("a", "a"), ("a",) + SPECIALS]:
        with pytest.raises(ValueError):
            Tokenizer(vocab=bad)


def test_encode_decode_unk_truncation_and_cleaning():
    tok = build_tokenizer(CORPUS)
    ids, truncated = tok.encode("a dog runs.")
    assert ids.dtype == np.int32 and not truncated and ids.tolist() == [BOS, 5, 7, 12, 6, EOS]
    assert tok.decode(ids) == "a dog runs ."
    assert tok.encode("a bird runs")[0].tolist() == [BOS, 5, UNK, 12, EOS]
    assert tok.decode([BOS, 5, MASK, UNK, 7, EOS, 9, PAD]) == "a <mask> <unk> dog"
    assert tok.encode("")[0].tolist() == [BOS, EOS]
    for raw in ["the dog's ball", "The Dog\u2019s  BALL\n", " the dog\u02bcs ball\t"]:
        assert tok.encode(raw)[0].tolist() == [BOS, 13, 11, 9, EOS], raw
    caption = "a dog runs. a cat"                                  # 8 tokens with BOS, EOS
    assert [(tok.encode(caption, n)[0].tolist(), tok.encode(caption, n)[1]) for n in (5, 8)] == \
        [([BOS, 5, 7, 12, EOS], True), ([BOS, 5, 7, 12, 6, 5, 10, EOS], False)]


def test_clean_caption_and_pad_batch():
    assert clean_caption("A man  riding\n a\u00a0horse\u2003 . ") == "a man riding a horse ."
    assert clean_caption("Cafe\u0301 \u2018it\u02bcs\u2032 \u201cred\u201d") == \
        "caf\u00e9 'it's' \"red\""
    for s in ["Cafe\u0301", "\u0130stanbul", "\u212bngstr\u00f6m", " \u201cHi\u201d "]:
        assert clean_caption(clean_caption(s)) == clean_caption(s)   # idempotent
    with pytest.raises(TypeError, match="must be a str"):
        clean_caption(None)
    tokens = pad_batch([np.array([BOS, 5, EOS], np.int32), np.array([BOS, EOS], np.int32)])
    assert tokens.dtype == np.int32 and tokens.tolist() == [[BOS, 5, EOS], [BOS, EOS, PAD]]


# the specials where BERT's file has them relative to each other: read_vocab must move them
TINY = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dog",
        "play", "##ing", "##s", "un", "##aff", "##able", ",", ".", "!", "cafe", "aaa", "##a"]


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(TINY) + "\n", encoding="utf-8")
    return read_vocab(tmp_path / "vocab.txt")


def test_wordpiece_by_hand(tiny):
    assert tiny.vocab[:7] == BERT_SPECIALS + ("[unused0]", "[unused1]")
    assert tiny.vocab[7:] == tuple(TINY[7:]) and tiny.vocab_size == 21   # line k = id k
    assert basic_tokenize("Crème Brûlée, CAFÉ!") == ["creme", "brulee", ",", "cafe", "!"]
    assert basic_tokenize("hot-dog $5 <a|b>") == ["hot", "-", "dog", "$", "5", *"<a|b>"]
    assert basic_tokenize("東京タワー") == ["東", "京", "タワー"]      # CJK ideographs apart
    assert basic_tokenize("a\x00b\tc\nd\u200be\x07f\ufffdg\u00a0h") == ["ab", "c", "defg", "h"]
    index = tiny.index
    assert word_pieces("unaffable", index) == ["un", "##aff", "##able"]
    assert word_pieces("aaaa", index) == ["aaa", "##a"]                 # longest match first
    assert word_pieces("dogx", index) == ["[UNK]"]                      # the whole word
    assert word_pieces("a" * MAX_WORD_CHARS, index)[-1] == "##a"       # longer: one [UNK]
    assert word_pieces("a" * (MAX_WORD_CHARS + 1), index) == ["[UNK]"]
    ids, cut = tiny.encode("A dog, playing!  ")
    assert ids.dtype == np.int32 and not cut and ids.tolist() == [BOS, 7, 8, 15, 9, 10, 17, EOS]
    assert tiny.decode(np.r_[ids, PAD]) == "a dog , playing !"
    ids, truncated = tiny.encode("a dog playing", max_len=4)
    assert ids.tolist() == [BOS, 7, 8, EOS] and truncated
    assert tiny.encode("dog\u2019s")[0].tolist() == tiny.encode("dog's")[0].tolist()


def test_read_vocab_errors_are_one_line_naming_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'none.txt'}: no such vocab"):
        read_vocab(tmp_path / "none.txt")
    path = tmp_path / "v.txt"
    for content, problem in [(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\ndog\n", r"no \[MASK\]"),
                             ("\n".join(BERT_SPECIALS + ("a", "a")).encode(), "repeated"),
                             (b"[PAD]\n\xff\n", "not a UTF-8")]:
        path.write_bytes(content)
        with pytest.raises(ValueError, match=f"^{path}: .*{problem}") as err:
            read_vocab(path)
        assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def bert_vocab():
    return read_vocab(shared(BERT_VOCAB))


@pytest.fixture(scope="module")
def bert(tmp_path_factory, bert_vocab):
    """transformers' BertTokenizer on the same file, read locally (no hub access)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    folder = tmp_path_factory.mktemp("bert")
    shutil.copy(BERT_VOCAB, folder / "vocab.txt")
    return transformers.BertTokenizer.from_pretrained(folder, local_files_only=True,
                                                      do_lower_case=True)


def test_bert_file_ids_are_berts_but_the_five_specials(bert_vocab):
    lines = BERT_VOCAB.read_text(encoding="utf-8").split("\n")[:-1]
    moved = {1: 100, 2: 101, 3: 102, 4: 103, 100: 1, 101: 2, 102: 3, 103: 4}
    assert bert_vocab.vocab_size == len(lines) == 30522
    assert all(bert_vocab.vocab[i] == lines[moved.get(i, i)] for i in range(len(lines)))
    assert [bert_vocab.vocab[i] for i in bert_vocab.pieces("Skateboarder frisbees")] == \
        ["skate", "##board", "##er", "fr", "##is", "##bee", "##s"]


def bert_ids(bert, texts, ours):
    """BertTokenizer's ids of texts ([CLS] ... [SEP]) in minialign's ids."""
    to_ours = {i: ours.index[t] for t, i in bert.get_vocab().items()}
    return [[to_ours[i] for i in ids] for ids in bert(texts)["input_ids"]]


HARD = ["Crème Brûlée at the CAFÉ", "naïve Ångström İstanbul ﬁsh", "a" * 100, "a" * 101,
        "東京タワー and 한국어 中文字", "a\x00b\tc\nd\re\x07f\u200bg\u200dh\ufffdi\x7fj", "",
        "\u2028x\u2029y\x85z\x0bw", "\ue000priv\U000f0000ate", "a\u0378b\U0010fffe",
        "«quotes» “curly” ‘single’ — dash … end", "ß ǅ ﬀ Σσς", "🙂 emoji 👍🏽", "٣ ½ ² हिन्दी",
        string.punctuation]


def test_ids_identical_to_bert_tokenizer(bert, bert_vocab, real_captions_path):
    """Hand-written hard cases raw (BERT's tokenization alone), then all 25,014 val2017
    captions as training sees them (clean_caption, then encode's [BOS] pieces [EOS])."""
    assert [[BOS] + bert_vocab.pieces(t) + [EOS] for t in HARD] == bert_ids(bert, HARD,
                                                                             bert_vocab)
    raw = [a["caption"] for a in json.loads(real_captions_path.read_text())["annotations"]]
    assert len(raw) == 25014 and [bert_vocab.encode(c)[0].tolist() for c in raw] == \
        bert_ids(bert, [clean_caption(c) for c in raw], bert_vocab)
