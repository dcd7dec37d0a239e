"""WordPiece (minialign/wordpiece.py): BERT's basic tokenization and greedy longest-match
pieces, by hand on a tiny vocabulary; ids identical to transformers' BertTokenizer on every
COCO val2017 caption (../shared; BERT's vocabulary from ../shared or `make data`'s
coco/bert-base-uncased-vocab.txt); the 10,989,568-parameter encoder; training with it."""
import json
import shutil
import string
from pathlib import Path

import numpy as np
import pytest

from minialign.machinery.images.bert_vocab import VOCAB_NAME, VOCAB_SHA256
from minialign.machinery.run.files import sha256_file
from minialign.model import ModelConfig, init_params, param_count
from minialign.tokenizer import BOS, EOS, MASK, PAD, UNK, clean_caption
from minialign.wordpiece import (MAX_WORD_CHARS, SPECIALS, WordPieceTokenizer, basic_tokenize,
                                 read_vocab, word_pieces)

SHARED_VOCAB = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers" / \
    "bert-base-uncased-vocab.txt"
MADE_VOCAB = Path(__file__).resolve().parents[1] / "coco" / VOCAB_NAME    # `make data` writes it


def find_bert_vocab():
    """BERT's vocabulary: ../shared's copy, else the one `make data` wrote into the checkout
    when its sha256 is the one bert_vocab.py pins; None without either."""
    if SHARED_VOCAB.is_file():
        return SHARED_VOCAB
    if MADE_VOCAB.is_file() and sha256_file(MADE_VOCAB) == VOCAB_SHA256:
        return MADE_VOCAB
    return None


BERT_VOCAB = find_bert_vocab()
NO_VOCAB = (f"BERT's vocabulary is neither at {SHARED_VOCAB} (../shared) nor at {MADE_VOCAB} "
            f"with the pinned sha256 (`make data` writes it)")
BERT_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
# a tiny vocabulary file, specials where BERT's file has them relative to each other: after
# two unused entries, so read_vocab must move them
TINY = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dog",
        "play", "##ing", "##s", "un", "##aff", "##able", ",", ".", "!", "cafe", "aaa", "##a",
        "東", "京"]


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(TINY) + "\n", encoding="utf-8")
    return read_vocab(path)


def test_read_vocab_moves_the_specials_to_minialigns_ids_and_keeps_every_other_line(tiny):
    assert (PAD, UNK, BOS, EOS, MASK) == (0, 1, 2, 3, 4)
    assert tiny.vocab[:7] == SPECIALS + ("[unused0]", "[unused1]")
    assert tiny.vocab[7:] == tuple(TINY[7:])            # line k = id k for every real entry
    assert tiny.vocab_size == len(TINY) == 23


def test_basic_tokenize_by_hand():
    # lower case; accents stripped (NFD, non-spacing marks dropped); punctuation apart
    assert basic_tokenize("Crème Brûlée, CAFÉ!") == ["creme", "brulee", ",", "cafe", "!"]
    assert basic_tokenize("naïve İstanbul") == ["naive", "istanbul"]   # İ -> i + U+0307 -> i
    # ASCII symbols count as punctuation ($ + < = > ^ ` | ~), and Unicode P* (« » ' ...)
    assert basic_tokenize("hot-dog $5 <a|b>") == ["hot", "-", "dog", "$", "5", "<", "a", "|",
                                                   "b", ">"]
    assert basic_tokenize("«the dogs' toys»") == ["«", "the", "dogs", "'", "toys", "»"]
    assert basic_tokenize("a$b+c=d^e`f~g@h") == list("a$b+c=d^e`f~g@h")  # Sc Sm Sk, Po
    assert basic_tokenize("½ ²") == ["½", "²"]                        # No: not punctuation
    # CJK ideographs are words of their own; katakana and hangul are not CJK here
    assert basic_tokenize("東京タワー") == ["東", "京", "タワー"]
    # control and format characters dropped; tab, newline, CR, no-break space are spaces
    assert basic_tokenize("a\x00b\tc\nd\u200be\x07f\ufffdg\u00a0h") == ["ab", "c", "defg", "h"]
    assert basic_tokenize("") == [] and basic_tokenize(" \n\t ") == []


def test_word_pieces_greedy_longest_match_first(tiny):
    index = tiny.index
    assert word_pieces("playing", index) == ["play", "##ing"]
    assert word_pieces("dogs", index) == ["dog", "##s"]
    assert word_pieces("unaffable", index) == ["un", "##aff", "##able"]
    assert word_pieces("aaaa", index) == ["aaa", "##a"]       # longest first: not a ##a ##a ##a
    assert word_pieces("cat", index) == ["[UNK]"]             # no entry starts the word
    assert word_pieces("dogx", index) == ["[UNK]"]            # the whole word, not dog + [UNK]
    longest = "a" * MAX_WORD_CHARS
    assert word_pieces(longest, index) == ["aaa"] + ["##a"] * (MAX_WORD_CHARS - 3)
    assert word_pieces(longest + "a", index) == ["[UNK]"]     # > 100 characters: one [UNK]


def test_encode_decode_and_truncation(tiny):
    ids, truncated = tiny.encode("A dog, playing!  ")
    assert ids.dtype == np.int32 and not truncated
    assert ids.tolist() == [BOS, 7, 8, 15, 9, 10, 17, EOS]
    assert tiny.decode(ids) == "a dog , playing !"
    assert tiny.decode(np.r_[ids, PAD, PAD]) == tiny.decode(ids)
    assert tiny.encode("a cat")[0].tolist() == [BOS, 7, UNK, EOS]
    assert tiny.decode([BOS, 7, UNK, MASK, EOS, 8]) == "a [UNK] [MASK]"   # stops at EOS
    ids, truncated = tiny.encode("a dog playing", max_len=4)
    assert ids.tolist() == [BOS, 7, 8, EOS] and truncated
    # the one caption cleaning first (tokenizer.clean_caption): a curly apostrophe is ASCII
    assert tiny.encode("dog\u2019s")[0].tolist() == tiny.encode("dog's")[0].tolist()
    assert tiny.encode("")[0].tolist() == [BOS, EOS]
    with pytest.raises(ValueError, match="max_len"):
        tiny.encode("a", max_len=1)
    with pytest.raises(ValueError, match=r"\[0, 23\)"):
        tiny.decode([23])


def test_read_vocab_errors_are_one_line_naming_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'none.txt'}: no such vocab"):
        read_vocab(tmp_path / "none.txt")
    path = tmp_path / "v.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\ndog\n")
    with pytest.raises(ValueError, match=rf"^{path}: not a WordPiece vocabulary: no \[MASK\]"):
        read_vocab(path)
    path.write_text("\n".join(SPECIALS + ("dog", "dog")) + "\n")
    with pytest.raises(ValueError, match=f"^{path}: vocab has 1 repeated"):
        read_vocab(path)
    path.write_bytes(b"[PAD]\n\xff\n")
    with pytest.raises(ValueError, match=f"^{path}: not a UTF-8"):
        read_vocab(path)
    with pytest.raises(ValueError, match="must start with"):
        WordPieceTokenizer(vocab=("[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"))


def test_model_npz_brings_back_the_wordpiece_tokenizer(tiny):
    from minialign.machinery.run.rundir import tokenizer_from_arrays, tokenizer_to_arrays
    from minialign.tokenizer import build_tokenizer
    back = tokenizer_from_arrays(tokenizer_to_arrays(tiny))
    assert isinstance(back, WordPieceTokenizer) and back.vocab == tiny.vocab
    words = build_tokenizer(["a dog"])
    assert tokenizer_from_arrays(tokenizer_to_arrays(words)) == words


def test_bert_vocabulary_gives_the_replications_10989568_parameters():
    """30,522 x 256 (tied embedding) + 4 x 789,760 (blocks) + 64 x 256 (positions) + 512
    (final LayerNorm); model.param_count of the initialized weights."""
    from minialign.machinery.experiment.scaling import count_params
    cfg = ModelConfig(vocab_size=30522)
    assert (cfg.d_model, cfg.n_layers, cfg.mlp_ratio, cfg.max_len) == (256, 4, 4, 64)
    expected = 30522 * 256 + 4 * 789_760 + 64 * 256 + 512
    assert expected == 10_989_568 == count_params(cfg)
    assert param_count(init_params(cfg, np.random.default_rng(0))) == expected


# ------------------------------------------- BERT's own vocabulary and tokenizer (../shared)

@pytest.fixture(scope="module")
def bert_vocab():
    if BERT_VOCAB is None:
        pytest.skip(NO_VOCAB)
    return read_vocab(BERT_VOCAB)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """transformers' BertTokenizer on the same file, read locally (no hub access): from a
    folder holding it as vocab.txt (transformers 5 ignores BertTokenizer(vocab_file=...))."""
    transformers = pytest.importorskip("transformers", reason="the [export] extra is absent")
    if BERT_VOCAB is None:
        pytest.skip(NO_VOCAB)
    folder = tmp_path_factory.mktemp("bert")
    shutil.copy(BERT_VOCAB, folder / "vocab.txt")
    return transformers.BertTokenizer.from_pretrained(folder, local_files_only=True,
                                                      do_lower_case=True)


def test_bert_file_ids_are_berts_but_the_five_specials(bert_vocab):
    assert sha256_file(BERT_VOCAB) == BERT_SHA256
    lines = BERT_VOCAB.read_text(encoding="utf-8").split("\n")[:-1]
    assert bert_vocab.vocab_size == len(lines) == 30522
    moved = {1: 100, 2: 101, 3: 102, 4: 103, 100: 1, 101: 2, 102: 3, 103: 4}
    assert [bert_vocab.vocab[i] for i in moved] == [lines[j] for j in moved.values()]
    assert all(bert_vocab.vocab[i] == lines[i] for i in range(len(lines)) if i not in moved)
    # the examples of wordpiece.py and docs/architecture.md
    assert [bert_vocab.vocab[i] for i in bert_vocab.pieces("Skateboarder frisbees")] == \
        ["skate", "##board", "##er", "fr", "##is", "##bee", "##s"]


def bert_ids(bert, texts, ours):
    """BertTokenizer's ids of texts, each with [CLS] / [SEP], in minialign's ids (the five
    specials at 0-4: ours.index of BERT's token)."""
    to_ours = {i: ours.index[t] for t, i in bert.get_vocab().items()}
    return [[to_ours[i] for i in ids] for ids in bert(texts)["input_ids"]]


HARD = ["Crème Brûlée at the CAFÉ", "naïve Ångström İstanbul ﬁsh", "hot-dog & fries!? $5 <a|b>",
        "a" * 100, "a" * 101, "x" + "ab" * 60, "東京タワー and 한국어 中文字",
        "a\x00b\tc\nd\re\x07f\u200bg\u200dh\ufffdi\x7fj", "", "   ", "\u2028x\u2029y\x85z\x0bw",
        "\ue000priv\U000f0000ate", "a\u0378b\U0010fffe", "tab\u00a0nbsp\u3000ideo",
        "«quotes» “curly” ‘single’ — dash … end", "ß ǅ ﬀ Σσς", "e\u0301", "🙂 emoji 👍🏽",
        "unaffable playing", "٣ arabic ١٢", "½ ²", "हिन्दी मानक", string.punctuation]


def test_ids_identical_to_bert_tokenizer_on_hand_written_cases(bert, bert_vocab):
    ours = [[BOS] + bert_vocab.pieces(t) + [EOS] for t in HARD]
    assert ours == bert_ids(bert, HARD, bert_vocab)


def test_ids_identical_to_bert_tokenizer_on_every_val2017_caption(bert, bert_vocab,
                                                                   real_captions_path):
    """All 25,014 captions: raw (BERT's tokenization alone), and as training sees them
    (clean_caption first, then Tokenizer.encode's [BOS] pieces [EOS])."""
    raw = [a["caption"] for a in json.loads(real_captions_path.read_text())["annotations"]]
    assert len(raw) == 25014
    assert [[BOS] + bert_vocab.pieces(c) + [EOS] for c in raw] == bert_ids(bert, raw, bert_vocab)
    cleaned = [clean_caption(c) for c in raw]
    assert ([bert_vocab.encode(c)[0].tolist() for c in raw] ==
            bert_ids(bert, cleaned, bert_vocab))


# ------------------------------------------- training with it: config, resume, model.npz

def letters_vocab(path, extra=()):
    """A vocabulary of single letters, digits and punctuation, alone and as "##" pieces:
    every word of the synthetic world splits into its characters."""
    chars = string.ascii_lowercase + string.digits
    path.write_text("\n".join(SPECIALS + tuple(chars) + tuple("##" + c for c in chars) +
                              tuple(string.punctuation) + tuple(extra)) + "\n")
    return path


def test_train_with_wordpiece_records_it_and_resume_checks_the_file(tmp_path):
    from minialign.machinery.images.synthetic import write_world
    from minialign.machinery.run.encoder import embed_captions, load_model
    from minialign.train import TrainConfig, train
    captions, _ = write_world(tmp_path / "world", n_scenes=60, seed=0, world="v1")
    vocab = letters_vocab(tmp_path / "vocab.txt")
    cfg = TrainConfig(objective="next_token", captions=str(captions), steps=2, batch_photos=8,
                      warmup_steps=1, eval_every=2, tokenizer="wordpiece", vocab=str(vocab),
                      model=ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=64))
    train(cfg, tmp_path / "run", progress=False)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (saved["config"]["tokenizer"], saved["config"]["vocab"]) == ("wordpiece", str(vocab))
    assert saved["info"]["vocab_sha256"] == sha256_file(vocab)
    assert saved["info"]["vocab_size"] == 5 + 36 + 36 + 32
    params, tok, loaded = load_model(tmp_path / "run")
    assert isinstance(tok, WordPieceTokenizer) and loaded.tokenizer == "wordpiece"
    assert tok.encode("a 2")[0].tolist() == [BOS, 5, 33, EOS]           # "a" = line 5, "2" = 33
    assert embed_captions(tmp_path / "run", ["a red cube"]).shape == (1, 16)
    assert train(cfg, tmp_path / "run", progress=False, resume=True)["final"]["step"] == 2
    letters_vocab(vocab, extra=("cube",))                                 # other bytes, same name
    with pytest.raises(ValueError, match=r"another config.*vocab: .*other bytes"):
        train(cfg, tmp_path / "run", progress=False, resume=True)
    words = TrainConfig(objective="next_token", captions=str(captions), steps=2)
    with pytest.raises(ValueError, match="tokenizer='wordpiece' with vocab=''"):
        TrainConfig(objective="next_token", tokenizer="wordpiece")
    with pytest.raises(ValueError, match="tokenizer='words' with vocab='v.txt'"):
        TrainConfig(objective="next_token", vocab="v.txt")
    assert (words.tokenizer, words.vocab) == ("words", "")


def test_flags_give_wordpiece_its_default_vocabulary_and_refuse_vocab_with_words():
    import argparse
    from minialign.machinery.images.bert_vocab import VOCAB_NAME
    from minialign.machinery.run.flags import DEFAULT_VOCAB, config_from_args
    from minialign.train import TrainConfig
    assert Path(DEFAULT_VOCAB) == Path("coco") / VOCAB_NAME              # where `make data` puts it
    given = lambda **kw: config_from_args(argparse.Namespace(**kw), TrainConfig())  # noqa: E731
    assert given(tokenizer="wordpiece", vocab="").vocab == DEFAULT_VOCAB
    assert given(tokenizer="wordpiece", vocab="v.txt").vocab == "v.txt"
    assert given(tokenizer="words", vocab="").vocab == ""
    with pytest.raises(ValueError, match="--vocab v.txt is --tokenizer wordpiece's"):
        given(tokenizer="words", vocab="v.txt")


def test_runs_from_before_the_tokenizer_flag_read_as_words():
    import dataclasses
    from minialign.machinery.run.rundir import upgrade_config
    from minialign.train import TrainConfig
    now = json.loads(json.dumps(dataclasses.asdict(TrainConfig())))
    before = {k: v for k, v in now.items() if k not in ("tokenizer", "vocab")}
    assert upgrade_config(before) == now


# ------------------------------------------- `make data`: the vocabulary over HTTPS

def test_get_vocab_downloads_checks_and_reuses(tls_server, tls_cert, tmp_path, monkeypatch):
    """From a local HTTPS server: BERT's own file by its published sha256 when ../shared has
    it, else a tiny vocabulary with its own; a checked copy is reused without a request; other
    bytes are one line naming the URL, and nothing is left at the destination."""
    import hashlib
    from minialign.machinery.images import bert_vocab
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert[0]))
    data = (BERT_VOCAB.read_bytes() if BERT_VOCAB is not None else
            letters_vocab(tmp_path / "tiny.txt").read_bytes())
    check = ({} if BERT_VOCAB is not None else
             {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    tls_server.files["vocab.txt"] = data
    root = tmp_path / "coco"
    path = bert_vocab.get_vocab(root, f"{tls_server.url}/cut-once/vocab.txt", progress=False,
                                **check)
    assert path == root / bert_vocab.VOCAB_NAME and path.read_bytes() == data
    assert len(tls_server.requests) == 2                      # cut once, resumed
    bert_vocab.get_vocab(root, f"{tls_server.url}/files/vocab.txt", progress=False, **check)
    assert len(tls_server.requests) == 2                      # the checked copy: no request
    tls_server.files["other.txt"] = data[:-2] + b"x\n"
    path.unlink()
    with pytest.raises(ValueError, match=rf"^{tls_server.url}/files/other.txt: downloaded "
                                         rf"{len(data)} bytes with sha256 [0-9a-f]+, expected"):
        bert_vocab.get_vocab(root, f"{tls_server.url}/files/other.txt", progress=False, **check)
    assert list(root.iterdir()) == []
    with pytest.raises(ValueError, match="^--vocab-url http://x/v.txt: plain HTTP refused"):
        bert_vocab.get_vocab(root, "http://x/v.txt")
    assert bert_vocab.VOCAB_URL.startswith("https://huggingface.co/google-bert/bert-base-uncased"
                                           f"/resolve/{bert_vocab.VOCAB_REVISION}/")
    assert bert_vocab.VOCAB_SHA256 == BERT_SHA256


def test_replicate_prints_the_encoders_size_and_results_md_names_the_tokenizer(capsys):
    from minialign.machinery.experiment.protocol import Protocol
    from minialign.machinery.experiment.results_md import tokenizer_words
    from minialign.machinery.grid.replicate import print_encoder
    from minialign.train import TrainConfig
    base = TrainConfig(tokenizer="wordpiece", vocab="coco/v.txt")
    print_encoder(Protocol(base=base), 30522)
    assert capsys.readouterr().out == ("[replicate] encoder: 10,989,568 parameters (D=256, L=4, "
                                       "wordpiece vocabulary of 30522)\n")
    assert tokenizer_words({"tokenizer": "wordpiece", "vocab": "coco/v.txt"}) == \
        "WordPiece tokenizer (`coco/v.txt`)"
    assert tokenizer_words({}) == tokenizer_words({"tokenizer": "words"}) == "word tokenizer"
