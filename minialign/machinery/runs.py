"""Files: atomic writes, the OS lock on a directory, and what a run directory holds:
config.json {"config": TrainConfig, "info"}, log.jsonl (a line a step), metrics.json,
captions/<split>_stepNNNNN.npz (slot{s}_image_ids (P_s,) int64, slot{s}_z (P_s, D) float16),
checkpoint.npz, model.npz, diverged.json, .lock. Image scores are never stored (images.py)."""
import contextlib
import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from ..model import encode
from ..objectives import CAUSAL, OBJECTIVES
from ..tokenizer import Tokenizer, pad_batch
from ..checkpoint import atomic_write, embed, savez, sha256_file, write_json  # noqa: F401
from ..train import ModelConfig, ObjectiveConfig, TrainConfig
from ..wordpiece import SPECIALS as WORDPIECE_SPECIALS, WordPieceTokenizer
from . import variants  # noqa: F401 (a run of a named variant names it in its config)


class Locked(OSError):
    """Another process holds the directory's lock."""


def read_json(path):
    """The JSON in `path`. Raises FileNotFoundError / ValueError, one line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a JSON file ({err})") from None


def load_npz(path):
    """{name: array} of an .npz. Raises FileNotFoundError / ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"{path}: not a readable .npz file ({err})") from None


@contextlib.contextmanager
def lock(directory):
    """Hold `directory`/.lock with the OS's own lock (released by the OS when the process
    dies, however it dies). Raises Locked, one line, if another process holds it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+b") as f:
        try:
            if os.name == "nt":
                import msvcrt
                msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
            else:
                import fcntl
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise Locked(f"{directory}: in use by another minialign process (wait for it, "
                         f"or stop it)") from None
        yield


def caption_files(run_dir, split):
    """{step: path} of the run's saved caption embeddings of `split`, by step."""
    paths = (Path(run_dir) / "captions").glob(f"{split}_step*.npz")   # checkpoint.py names them
    return dict(sorted((int(p.stem.split("_step")[1]), p) for p in paths))


def load_caption_slots(path):
    """One saved caption file -> [(image_ids (P_s,) int64, z (P_s, D) float32), ...] by slot."""
    arrays, slots = load_npz(path), []
    while f"slot{len(slots)}_z" in arrays:
        s = len(slots)
        ids, z = arrays[f"slot{s}_image_ids"], arrays[f"slot{s}_z"]
        if ids.ndim != 1 or z.ndim != 2 or len(ids) != len(z):
            raise ValueError(f"{path}: slot {s} has image ids {ids.shape} and z {z.shape}")
        slots.append((ids.astype(np.int64), z.astype(np.float32)))
    if len(slots) < 2:
        raise ValueError(f"{path}: expected slot0_z, slot1_z, ...; has {sorted(arrays)}")
    return slots


def read_config(run_dir):
    path = Path(run_dir) / "config.json"
    try:
        return TrainConfig(**read_json(path)["config"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a minialign run config ({err})") from None


def config_fields():
    """{field: (its config class, its default)} of TrainConfig, ModelConfig, ObjectiveConfig:
    a flag of train each (cli.py), an argument of each run a grid starts (grid.py)."""
    return {f.name: (cls, f.default) for cls in (TrainConfig, ModelConfig, ObjectiveConfig)
            for f in dataclasses.fields(cls) if f.name not in ("model", "loss", "vocab_size")}


def read_metrics(run_dir):
    return read_json(Path(run_dir) / "metrics.json")


def tokenizer_from_vocab(vocab):
    """model.npz's vocabulary -> WordPiece if it starts with BERT's specials, else words."""
    vocab = tuple(str(w) for w in vocab)
    wordpiece = vocab[:len(WORDPIECE_SPECIALS)] == WORDPIECE_SPECIALS
    return WordPieceTokenizer(vocab=vocab) if wordpiece else Tokenizer(vocab=vocab)


def load_model(run_dir):
    """A finished run's encoder: (params {name: array}, TrainConfig, tokenizer)."""
    arrays = load_npz(Path(run_dir) / "model.npz")
    return arrays, read_config(run_dir), tokenizer_from_vocab(arrays.pop("tokenizer.vocab"))


def embed_captions(run_dir, captions):
    """(N, D) float32 embeddings of N caption strings (cleaned as in training) by a finished
    run's encoder, with the attention its objective trained (causal for next_token)."""
    if isinstance(captions, str) or not len(captions):
        raise ValueError("captions must be a non-empty list of strings")
    params, cfg, tok = load_model(run_dir)
    tokens = pad_batch([tok.encode(c, cfg.model.max_len)[0] for c in captions])   # (N, T)
    encoder = getattr(OBJECTIVES[cfg.objective], "encode", encode)
    return embed(params, tokens, cfg.model, CAUSAL[cfg.objective], encoder).astype(np.float32)


def md_table(head, rows, align):
    """The one table writer: markdown lines; rows: lists of str; align: l or r per column."""
    return ["| " + " | ".join(head) + " |",
            "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"] + \
        ["| " + " | ".join(row) + " |" for row in rows]


def cores():
    """The cores this process may compute on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
