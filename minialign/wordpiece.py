"""WordPiece tokenizer: BERT's uncased sub-word tokenization (Devlin et al. 2019; Wu et al. 2016).
Text -> ids in two stages: basic_tokenize (clean, lower case, strip accents, split on whitespace,
punctuation and CJK ideographs), then word_pieces (each word greedily into the longest vocabulary
entries: "playing" -> "play", "##ing"). The ids are the vocabulary file's line numbers (BERT's),
except that [PAD] [UNK] [CLS] [SEP] [MASK] are swapped to 0-4, the ids minialign gives PAD UNK BOS
EOS MASK (tokenizer.py), with the entries that were there ([unused0] .. [unused3], which no text
produces). So a caption is [CLS] pieces [SEP] = [BOS, ..., EOS], every piece with BERT's own id.
Text is only text: "[MASK]" in a caption is "[", "mask", "]" (as in BERT's own tokenization.py;
Hugging Face's BertTokenizer reads it as the special)."""
import string
import unicodedata
from dataclasses import dataclass, field

from .tokenizer import Tokenizer

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # at ids PAD UNK BOS EOS MASK = 0-4
MAX_WORD_CHARS = 100    # a longer word is one [UNK] (BERT's max_input_chars_per_word)
# CJK Unified Ideographs and their extensions / compatibility blocks (BERT's _is_chinese_char);
# Hangul, Hiragana and Katakana are not among them: they are split like any other letters.
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
ASCII_PUNCTUATION = set(string.punctuation)  # BERT counts "$+<=>^`|~" too


def clean_char(ch: str) -> str:
    """One character of BERT's text cleaning: " " for whitespace (\\t, \\n, \\r, Unicode Zs); ""
    for NUL, U+FFFD and Unicode Cc Cf Co Cs but not Cn, as Hugging Face's (Google's drops Cc and Cf
    only; COCO's captions hold no Co, Cs or Cn); a CJK ideograph with a space either side."""
    if ch in " \t\n\r" or unicodedata.category(ch) == "Zs":
        return " "
    if ch in "\x00\ufffd" or unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs"):
        return ""
    return f" {ch} " if any(lo <= ord(ch) <= hi for lo, hi in CJK_RANGES) else ch


def basic_tokenize(text: str) -> list[str]:
    """BERT's basic (uncased) tokenization: "Héllo, WORLD!" -> ["hello", ",", "world", "!"]."""
    text = unicodedata.normalize("NFD", "".join(clean_char(ch) for ch in text).lower())
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Mn")    # strip accents
    return "".join(f" {ch} " if ch in ASCII_PUNCTUATION or unicodedata.category(ch)[0] == "P"
                   else ch for ch in text).split()       # each punctuation character: a word


def word_pieces(word: str, index: dict) -> list[str]:
    """Greedy longest-match-first split of one word into the entries of index (entry -> id):
    "skateboarder" -> ["skate", "##board", "##er"]; ["[UNK]"] if none fits or it is too long."""
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
class WordPieceTokenizer(Tokenizer):
    """tokenizer.Tokenizer over a WordPiece vocabulary: vocab[i] is the string of token id i,
    SPECIALS at ids 0..4 (read_vocab puts them there), each entry once, else ValueError."""
    cache: dict = field(init=False, repr=False, compare=False)  # text chunk -> ids (pieces)

    def __post_init__(self):
        index = {piece: i for i, piece in enumerate(self.vocab)}
        if tuple(self.vocab[:len(SPECIALS)]) != SPECIALS or len(index) < len(self.vocab):
            raise ValueError(f"a WordPiece vocabulary starts with {SPECIALS} and holds no "
                             f"repeated entry")
        object.__setattr__(self, "index", index)    # frozen: set the derived fields once
        object.__setattr__(self, "cache", {})

    def pieces(self, text: str) -> list[int]:
        """BERT's ids of text's pieces, no [CLS] / [SEP]. basic_tokenize splits at every space,
        so each space-separated chunk is tokenized once and cached (captions repeat words)."""
        ids = []
        for chunk in text.split(" "):
            if chunk not in self.cache:
                self.cache[chunk] = [self.index[p] for word in basic_tokenize(chunk)
                                     for p in word_pieces(word, self.index)]
            ids += self.cache[chunk]
        return ids

    def decode(self, ids) -> str:
        """Tokenizer.decode with a "##" piece glued to the one before."""
        return super().decode(ids).replace(" ##", "")


def read_vocab(path) -> WordPieceTokenizer:
    """A WordPiece vocabulary file (BERT's vocab.txt: one entry a line, UTF-8; id = line number)
    -> WordPieceTokenizer, each special swapped with the entry at its minialign id. Raises
    FileNotFoundError / ValueError in one line naming the file."""
    try:
        with open(path, encoding="utf-8") as f:             # "\r\n" read as "\n"
            vocab = f.read().removesuffix("\n").split("\n")  # the last newline ends no entry
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 vocabulary file ({err.reason})") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such vocabulary file (`make data` downloads "
                                f"BERT's; or --tokenizer words)") from None
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
