"""WordPiece tokenizer: BERT's uncased sub-word tokenization, from a vocabulary file.

Text -> ids in two stages (Devlin et al. 2019, BERT; Wu et al. 2016 for WordPiece):
  1. basic_tokenize: drop control characters, whitespace -> " ", lower case, strip accents
     (NFD, drop non-spacing marks), a space around every CJK ideograph, split on whitespace
     and on punctuation (each punctuation character a word of its own);
  2. word_pieces: each word, greedily, into the longest vocabulary entry from its start, then
     the longest "##"-entry from there on ("playing" -> "play", "##ing"); a word with no such
     split, or longer than MAX_WORD_CHARS characters, is one [UNK].
The ids are the vocabulary file's line numbers (BERT's), except that the five specials are
moved to the ids the rest of minialign gives PAD UNK BOS EOS MASK (tokenizer.py, 0-4):
[PAD] [UNK] [CLS] [SEP] [MASK] sit at 0 1 2 3 4, and the entries that were there ([unused0]
.. [unused3] in BERT's file, which no text produces) at the specials' old lines. So a caption
is [CLS] pieces [SEP] = [BOS, ..., EOS], and every piece has BERT's own id. Text is only
text: "[MASK]" in a caption is "[", "mask", "]" (as in BERT's own tokenization.py; Hugging
Face's BertTokenizer reads it as the special).
"""
import unicodedata
from dataclasses import dataclass, field

import numpy as np

from .tokenizer import BOS, EOS, MAX_LEN, PAD, clean_caption

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # at ids PAD UNK BOS EOS MASK = 0-4
MAX_WORD_CHARS = 100    # a longer word is one [UNK] (BERT's max_input_chars_per_word)
# CJK Unified Ideographs and their extensions / compatibility blocks (BERT's _is_chinese_char);
# Hangul, Hiragana and Katakana are not among them: they are split like any other letters.
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
ASCII_PUNCTUATION = {chr(c) for r in ((33, 47), (58, 64), (91, 96), (123, 126))
                     for c in range(r[0], r[1] + 1)}  # BERT counts "$+<=>^`|~" too


def is_punctuation(ch: str) -> bool:
    """BERT's rule: an ASCII non-letter, non-digit, non-space printable, or Unicode P*."""
    return ch in ASCII_PUNCTUATION or unicodedata.category(ch).startswith("P")


def is_cjk(ch: str) -> bool:
    """True for a CJK ideograph (CJK_RANGES), which BERT makes a word of its own."""
    return any(lo <= ord(ch) <= hi for lo, hi in CJK_RANGES)


def clean_char(ch: str) -> str:
    """One character of BERT's text cleaning: "" for NUL, U+FFFD and "other" characters
    (Unicode C*: control, format, private use, surrogate; tab, newline and carriage return are
    whitespace), but not unassigned ones (Cn), as Hugging Face's tokenizers (Google's first
    release drops Cc and Cf only; COCO val2017's captions hold no Co, Cs or Cn); " " for whitespace
    (space, \\t, \\n, \\r, Unicode Zs); a CJK ideograph with a space either side; any other
    character as it is."""
    if ch in " \t\n\r" or unicodedata.category(ch) == "Zs":
        return " "
    if ch in "\x00\ufffd" or unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs"):
        return ""
    return f" {ch} " if is_cjk(ch) else ch


def basic_tokenize(text: str) -> list[str]:
    """BERT's basic (uncased) tokenization: "Héllo, WORLD!" -> ["hello", ",", "world", "!"]."""
    text = "".join(clean_char(ch) for ch in text)
    words = []
    for word in text.lower().split():
        word = "".join(ch for ch in unicodedata.normalize("NFD", word)
                       if unicodedata.category(ch) != "Mn")          # strip accents
        start = 0                                  # each punctuation character: its own word
        for i, ch in enumerate(word):
            if is_punctuation(ch):
                words += [word[start:i], ch]
                start = i + 1
        words.append(word[start:])
    return [w for w in words if w]


def word_pieces(word: str, index: dict) -> list[str]:
    """Greedy longest-match-first split of one word into vocabulary entries (index: entry ->
    id); "skateboarder" -> ["skate", "##board", "##er"] in BERT's vocabulary. ["[UNK]"] if some
    position has no match or the word has more than MAX_WORD_CHARS characters."""
    if len(word) > MAX_WORD_CHARS:
        return [SPECIALS[1]]
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):              # longest candidate first
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in index:
                break
        else:
            return [SPECIALS[1]]                              # no entry starts here
        pieces.append(piece)
        start = end
    return pieces


@dataclass(frozen=True)
class WordPieceTokenizer:
    """A WordPiece vocabulary, as tokenizer.Tokenizer's interface: vocab[i] is the string of
    token id i, SPECIALS at ids 0..4 (read_vocab puts them there). Raises ValueError if the
    specials are not at their ids or an entry appears twice."""
    vocab: tuple[str, ...]
    index: dict = field(init=False, repr=False, compare=False)  # entry -> id, built below
    cache: dict = field(init=False, repr=False, compare=False)  # text chunk -> ids (pieces)

    def __post_init__(self):
        if tuple(self.vocab[:len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"vocab must start with {SPECIALS}, got {tuple(self.vocab[:5])}")
        index = {piece: i for i, piece in enumerate(self.vocab)}
        if len(index) != len(self.vocab):
            raise ValueError(f"vocab has {len(self.vocab) - len(index)} repeated entries")
        object.__setattr__(self, "index", index)    # frozen: set the derived fields once
        object.__setattr__(self, "cache", {})

    @property
    def vocab_size(self) -> int:
        """V, the number of rows of the embedding table and columns of the output logits."""
        return len(self.vocab)

    def pieces(self, text: str) -> list[int]:
        """BERT's ids of text's pieces, no [CLS] / [SEP], no cleaning beyond BERT's own.
        Every stage of basic_tokenize splits at a space, so the text is tokenized chunk by
        space-separated chunk, each chunk once (captions repeat their words: ~3x faster)."""
        ids = []
        for chunk in text.split(" "):
            if chunk not in self.cache:
                self.cache[chunk] = [self.index[p] for word in basic_tokenize(chunk)
                                     for p in word_pieces(word, self.index)]
            ids += self.cache[chunk]
        return ids

    def encode(self, caption: str, max_len: int = MAX_LEN) -> tuple[np.ndarray, bool]:
        """Caption -> ids (n,) int32 = [BOS, pieces.., EOS] (tokenizer.Tokenizer.encode's
        contract: cleaned by clean_caption first; n <= max_len, truncated=True if pieces
        were cut). Raises ValueError if max_len < 2."""
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2 to hold BOS and EOS, got {max_len}")
        pieces = self.pieces(clean_caption(caption))
        ids = [BOS] + pieces[:max_len - 2] + [EOS]
        return np.array(ids, dtype=np.int32), len(pieces) + 2 > max_len

    def decode(self, ids) -> str:
        """ids (n,) int -> text: pieces joined by spaces, a "##" piece glued to the one before;
        PAD and BOS omitted, reading stops at the first EOS. Raises ValueError for an id
        outside [0, V)."""
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.vocab)):
            raise ValueError(f"token ids must be in [0, {len(self.vocab)}), got "
                             f"[{ids.min()}, {ids.max()}]")
        pieces = []
        for i in ids.tolist():
            if i == EOS:
                break
            if i not in (BOS, PAD):
                pieces.append(self.vocab[i])
        return " ".join(pieces).replace(" ##", "")


def read_vocab(path) -> WordPieceTokenizer:
    """A WordPiece vocabulary file (BERT's vocab.txt: one entry a line, UTF-8; id = line
    number) -> WordPieceTokenizer, each special swapped with the entry at its minialign id.
    Raises FileNotFoundError / ValueError, one line starting with the path: missing, not
    UTF-8, a special missing, or an entry repeated."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            vocab = f.read().split("\n")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 vocabulary file ({err.reason})") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such vocabulary file (`make data` downloads "
                                f"BERT's; or --tokenizer words)") from None
    if vocab and vocab[-1] == "":
        vocab.pop()                                          # the final newline ends no entry
    vocab = [v.removesuffix("\r") for v in vocab]
    missing = [s for s in SPECIALS if s not in vocab]
    if missing:
        raise ValueError(f"{path}: not a WordPiece vocabulary: no {', '.join(missing)} line")
    for i, special in enumerate(SPECIALS):     # swap: the special to id i, id i's entry away
        j = vocab.index(special)
        vocab[i], vocab[j] = vocab[j], vocab[i]
    try:
        return WordPieceTokenizer(vocab=tuple(vocab))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
