"""Word-level tokenizer: caption text <-> int32 token ids, and the one caption cleaning.
Every caption becomes [BOS, w1, ..., wn, EOS], then PAD. The vocabulary comes from the
TRAINING captions only, so words seen only in val or test map to UNK.
"""
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

PAD = 0   # fills a batch after EOS; never attended to, never predicted
UNK = 1   # any word missing from the training vocabulary
BOS = 2   # first token of every caption
EOS = 3   # last token of every caption
MASK = 4  # replaces a word in the bad-views objective
SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>", "<mask>")  # vocab[i] for the ids above
MAX_LEN = 64  # tokens per caption including BOS and EOS; the longest val2017 caption has 56

# A word is a run of letters, digits or apostrophes ("man's"); any other non-space character
# is a token of its own
WORD_RE = re.compile(r"[\w']+|[^\w\s]")

# Typographic apostrophes and quotes -> ASCII, so "dog’s" and "dog's" are one word
TO_ASCII_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u2032": "'",
                                 "\u201c": '"', "\u201d": '"'})


def clean_caption(s: str) -> str:
    """The one cleaning, on every path from text to tokens: lowercase, Unicode NFC, ASCII
    quotes, single spaces. Idempotent: "A Dog\\u2019s  bed\\n" -> "a dog's bed"."""
    if not isinstance(s, str):
        raise TypeError(f"a caption must be a str, got {type(s).__name__}: {s!r}")
    s = unicodedata.normalize("NFC", s.lower())   # lower first: NFC of lowercase stays lowercase
    return " ".join(s.translate(TO_ASCII_QUOTES).split())


def split_words(caption: str) -> list[str]:
    """A cleaned caption's tokens: "a man's bike." -> ["a", "man's", "bike", "."]."""
    return WORD_RE.findall(caption)


@dataclass(frozen=True)
class Tokenizer:
    """A fixed vocabulary: vocab[i] is the string of token id i, SPECIALS at ids 0..4."""
    vocab: tuple[str, ...]
    index: dict = field(init=False, repr=False, compare=False)  # word -> id, built below

    def __post_init__(self):
        if tuple(self.vocab[:len(SPECIALS)]) != SPECIALS or len(set(self.vocab)) < len(self.vocab):
            raise ValueError(f"a vocabulary starts with {SPECIALS} and holds each word once")
        object.__setattr__(self, "index", {word: i for i, word in enumerate(self.vocab)})

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def pieces(self, caption: str) -> list[int]:
        """A cleaned caption's word ids, unknown words UNK (WordPiece: the words' pieces)."""
        return [self.index.get(w, UNK) for w in split_words(caption)]

    def encode(self, caption: str, max_len: int = MAX_LEN) -> tuple[np.ndarray, bool]:
        """Raw caption -> (ids (n,) int32 = [BOS, w1..wk, EOS] with unknown words UNK,
        truncated): a caption longer than max_len keeps max_len - 1 tokens, then EOS."""
        words = self.pieces(clean_caption(caption))
        truncated = len(words) + 2 > max_len
        ids = [BOS] + words[:max_len - 2] + [EOS]
        return np.array(ids, dtype=np.int32), truncated

    def decode(self, ids) -> str:
        """ids -> words joined by spaces, up to the first EOS; BOS and PAD omitted."""
        words = []
        for i in np.asarray(ids).tolist():
            if i == EOS:
                break
            if i not in (BOS, PAD):
                words.append(self.vocab[i])
        return " ".join(words)


def build_tokenizer(captions: list[str], min_count: int = 1) -> Tokenizer:
    """SPECIALS, then every word of the training captions seen at least min_count times, by
    descending count, ties alphabetically."""
    counts = Counter(w for caption in captions for w in split_words(clean_caption(caption)))
    kept = [w for w, c in counts.items() if c >= min_count]
    kept.sort(key=lambda w: (-counts[w], w))
    return Tokenizer(vocab=SPECIALS + tuple(kept))


def pad_batch(seqs: list[np.ndarray]) -> np.ndarray:
    """1-D id arrays -> (B, T) int32, PAD after each; T = the longest of them."""
    T = max(len(s) for s in seqs)
    tokens = np.full((len(seqs), T), PAD, dtype=np.int32)  # (B, T)
    for row, s in enumerate(seqs):
        tokens[row, :len(s)] = s
    return tokens
