"""A training run's directory: every file name in it, and every read and write of it.

    config.json      {"format", "config": TrainConfig as a dict, "info"}   start_run
    log.jsonl        one JSON line per step (no clock times: identical bytes on resume)
    metrics.json     {"objective", "seed", "evals", "final", ...; "image_alignment" once
                     evaluate has scored it}                      read_metrics / write_metrics
    captions/<split>_stepNNNNN.npz   caption embeddings saved at evaluation steps
                     save_caption_embeddings / caption_files / load_caption_slots
    checkpoint.npz   the full state at the last evaluation step    checkpoint.py
    model.npz        the final weights and the tokenizer           save_model / load_model_arrays
    diverged.json    written when the loss stopped being finite    record_divergence

open_run decides, under the directory's lock, whether a run starts, restarts, continues from
its checkpoint or is already finished (run_state). Every write goes through files.py (a
temporary file, fsync, rename). Imports only numpy and files.py: it knows a config only as a
dataclass.
"""
import dataclasses
import re
from pathlib import Path

import numpy as np

from ...tokenizer import Tokenizer
from ...wordpiece import SPECIALS as WORDPIECE_SPECIALS, WordPieceTokenizer
from .dirlock import LOCK_FILE
from .files import atomic_savez, atomic_write_json, load_npz, read_json

CONFIG = "config.json"         # the run's TrainConfig
LOG = "log.jsonl"              # one line per step
METRICS = "metrics.json"       # text-side metrics per evaluation; image alignment later
MODEL = "model.npz"            # final weights + tokenizer
CHECKPOINT = "checkpoint.npz"  # the run's full state at its last evaluation step
DIVERGED = "diverged.json"     # written when the loss (or a gradient) stopped being finite
CAPTIONS_DIR = "captions"      # caption embeddings saved at evaluation steps
CAPTION_FILE = re.compile(r"^(val|test|train)_step(\d+)\.npz$")   # caption_file_name's names
FLAT_LOSS_KEYS = ("mask_rate", "sim_weight", "var_weight", "cov_weight",  # before #10: at the
                  "anticollapse_weight")                                # top of a saved config
ADDED_LOSS_DEFAULTS = {"anticollapse": "vicreg", "sigreg_weight": 25.0 * 4 * 0.05 / 0.95,
                       "sigreg_directions": 256, "sigreg_t_max": 3.0, "sigreg_points": 17,
                       "mask_mode": "replace", "unseen_params": "train"}   # (#29)
ADDED_MODEL_DEFAULTS = {"layers": "fast",   # ModelConfig.layers (#20): every older run was fast
                        "projector_dim": 0, "causal_pool": "mean",   # (#29)
                        "dtype": "float32"}
ADDED_DEFAULTS = {"tokenizer": "words", "vocab": ""}   # TrainConfig's (#29): older runs: words
RUN_FILES = (CONFIG, LOG, METRICS, CHECKPOINT, MODEL, DIVERGED, LOCK_FILE)
RUN_FORMAT = 1   # config.json["format"] that this minialign writes and reads (absent = 1)
METRICS_KIND = "run metrics file (metrics.json)"  # for read_json's messages
IMAGE_SCORES = "image_alignment"  # metrics.json's key for the image scores (scores.py)
VOCAB_KEY = "tokenizer.vocab"  # the tokenizer's array inside model.npz


class Diverged(FloatingPointError):
    """The loss or the gradient norm stopped being finite; the run directory's diverged.json
    records the step and the values. The command line exits with cli.EXIT_DIVERGED."""


def caption_file_name(split, step):
    """captions/<split>_stepNNNNN.npz, e.g. val_step00250.npz (parsed by CAPTION_FILE)."""
    return f"{split}_step{step:05d}.npz"


def upgrade_config(config):
    """A saved config.json["config"] (or protocol.json["base"]) in today's layout. Runs written
    before the objectives' settings were nested (TrainConfig.loss, #10) hold FLAT_LOSS_KEYS at
    the top; they move into "loss". Fields added since get the value older runs had
    (ADDED_DEFAULTS, ADDED_LOSS_DEFAULTS, ADDED_MODEL_DEFAULTS). Returns a new dict; today's
    layout comes back unchanged."""
    flat = {k: config[k] for k in FLAT_LOSS_KEYS if k in config}
    rest = {k: v for k, v in config.items() if k not in flat}
    upgraded = {**ADDED_DEFAULTS, **rest,
                "loss": {**ADDED_LOSS_DEFAULTS, **flat, **rest.get("loss", {})}}
    if "model" in rest:
        upgraded["model"] = {**ADDED_MODEL_DEFAULTS, **rest["model"]}
    return upgraded


def read_run_config(run_dir):
    """The "config" dict of run_dir/config.json (TrainConfig's fields, as train wrote them, in
    today's layout: upgrade_config): the one reader of that file. Raises FileNotFoundError /
    ValueError, one line starting with the file: missing, empty, truncated, not a JSON object,
    written by a newer minialign (check_run_format), or without a "config" object holding
    objective and seed."""
    path = Path(run_dir) / CONFIG
    saved = read_json(path, "run config (config.json)")
    check_run_format(saved, path)
    config = saved.get("config")
    if not isinstance(config, dict) or not {"objective", "seed"} <= set(config):
        raise ValueError(f"{path}: not a minialign run config (no \"config\" object with "
                         f"objective and seed)")
    return upgrade_config(config)




def read_run_info(run_dir):
    """The "info" dict of run_dir/config.json ({} when absent); read_run_config checks the file."""
    info = read_json(Path(run_dir) / CONFIG, "run config (config.json)").get("info")
    return info if isinstance(info, dict) else {}


def check_run_format(config, path):
    """Refuse a run directory written by a newer minialign. config: the parsed config.json
    (its top-level "format", absent in runs written before it existed = 1); path: the file,
    for the message. Raises ValueError (one line starting with path) if format > RUN_FORMAT."""
    found = config.get("format", 1)
    if not isinstance(found, int) or isinstance(found, bool) or found > RUN_FORMAT:
        raise ValueError(f"{path}: written by a newer minialign (run format {found}, this one "
                         f"reads {RUN_FORMAT}); upgrade minialign")


def start_run(out, cfg, info):
    """A new run's config.json (format, config, info) and captions/ folder; returns the empty
    metrics dict it will fill."""
    (Path(out) / CAPTIONS_DIR).mkdir(exist_ok=True)
    atomic_write_json(Path(out) / CONFIG, {"format": RUN_FORMAT,
                                           "config": dataclasses.asdict(cfg), "info": info})
    return {"objective": cfg.objective, "seed": cfg.seed, "evals": []}


def open_log(out):
    """log.jsonl opened for appending, in bytes (tell() is the length a checkpoint records)."""
    return open(Path(out) / LOG, "ab")


def read_metrics(run_dir):
    """run_dir/metrics.json as a dict ({} if absent). Raises ValueError, one line starting
    with the file, if it is empty, truncated or not a JSON object (files.read_json)."""
    path = Path(run_dir) / METRICS
    return read_json(path, METRICS_KIND) if path.exists() else {}


def write_metrics(run_dir, metrics):
    atomic_write_json(Path(run_dir) / METRICS, metrics)


def update_metrics(run_dir, key, value):
    """Set metrics.json[key] = value, keeping the rest: read, changed and written whole
    (atomically) from the file's current contents, under the run's lock (runlock.hold; train
    holds it for the whole run). Raises ValueError naming metrics.json (read_metrics) before
    writing anything."""
    merge_metrics(run_dir, {key: value})


def merge_metrics(run_dir, changes):
    """metrics.json = its current contents with every key of `changes` set (update_metrics)."""
    write_metrics(run_dir, {**read_metrics(run_dir), **changes})


def write_training_metrics(run_dir, metrics):
    """Training's keys of `metrics` (all but IMAGE_SCORES, which evaluate adds) into
    metrics.json, keeping the image scores the file holds (merge_metrics)."""
    merge_metrics(run_dir, {k: v for k, v in metrics.items() if k != IMAGE_SCORES})


def is_diverged(run_dir):
    return (Path(run_dir) / DIVERGED).exists()


def is_finished(run_dir):
    """Whether a run directory holds a finished (or diverged) run."""
    return is_diverged(run_dir) or "final" in read_metrics(run_dir)


def finished_run(out, cfg):
    """A resumed run that has nothing left to do: its metrics, or Diverged again."""
    if is_diverged(out):
        record = read_json(Path(out) / DIVERGED, "minialign diverged.json")
        raise Diverged(f"{Path(out) / DIVERGED}: this run diverged earlier "
                       f"({record.get('error')}); not retried: lower --lr, or pass --force to "
                       f"start it over")
    print(f"[{cfg.objective}] {out}: already finished, skipped", flush=True)
    return read_metrics(out)


def record_divergence(out, step, lr, what):
    """Write out/diverged.json {"step", "lr", "error"} and raise Diverged (one line: where,
    what, what to do). what: e.g. "loss nan, gradient norm nan"."""
    error = f"{what} at step {step}"
    atomic_write_json(Path(out) / DIVERGED, {"step": step, "lr": lr, "error": error})
    raise Diverged(f"{out}: diverged ({error}) at lr {lr:g}; recorded in {DIVERGED}. Lower --lr, "
                   f"or pass --force to start over")


def save_model(out, params, tok):
    """model.npz: the final weights {name: array} and the tokenizer (tokenizer_to_arrays)."""
    atomic_savez(Path(out) / MODEL, {**params, **tokenizer_to_arrays(tok)})


def tokenizer_to_arrays(tok: Tokenizer) -> dict[str, np.ndarray]:
    """{"tokenizer.vocab": (V,) unicode array} to pass to np.savez with the weights."""
    return {VOCAB_KEY: np.array(tok.vocab, dtype=str)}


def tokenizer_from_arrays(arrays) -> Tokenizer:
    """Inverse of tokenizer_to_arrays; arrays is a dict or the NpzFile from np.load
    (allow_pickle=False works): a WordPieceTokenizer if the vocabulary starts with its
    specials ("[PAD]", ...), else a word Tokenizer. Raises ValueError if the entry is missing,
    is not a 1-D unicode array, or does not start with either's specials at their ids."""
    if VOCAB_KEY not in arrays:
        raise ValueError(f"no {VOCAB_KEY!r} array among {sorted(arrays)}")
    vocab = np.asarray(arrays[VOCAB_KEY])
    if vocab.ndim != 1 or vocab.dtype.kind != "U":
        raise ValueError(f"{VOCAB_KEY} must be a 1-D unicode array, got shape {vocab.shape} "
                         f"dtype {vocab.dtype}")
    vocab = tuple(str(w) for w in vocab)
    if vocab[:len(WORDPIECE_SPECIALS)] == WORDPIECE_SPECIALS:
        return WordPieceTokenizer(vocab=vocab)
    return Tokenizer(vocab=vocab)


def read_finished_config(run_dir):
    """read_run_config of a finished run. Raises FileNotFoundError naming config.json or
    model.npz when either is missing, ValueError for a malformed config.json."""
    run_dir = Path(run_dir)
    for name in (CONFIG, MODEL):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name}: no such file (is {run_dir} a finished run?)")
    return read_run_config(run_dir)


def read_model(run_dir):
    """model.npz's (params {name: array}, Tokenizer). Raises ValueError naming it if it is
    unreadable or holds no valid tokenizer."""
    arrays = load_npz(Path(run_dir) / MODEL, "model file (model.npz)")
    try:
        tok = tokenizer_from_arrays(arrays)
    except (KeyError, ValueError) as err:
        raise ValueError(f"{Path(run_dir) / MODEL}: no valid tokenizer ({err})") from None
    return {k: v for k, v in arrays.items() if k != VOCAB_KEY}, tok


def save_caption_embeddings(out, split, step, slots, image_ids):
    """captions/<split>_stepNNNNN.npz: for each slot s of slots {s: (photos (P_s,), z (P_s, D))},
    slot{s}_image_ids (P_s,) int64 = image_ids[photos] and slot{s}_z (P_s, D) float16."""
    arrays = {}
    for s, (photos, z) in slots.items():
        arrays[f"slot{s}_image_ids"] = image_ids[photos]
        arrays[f"slot{s}_z"] = z.astype(np.float16)
    atomic_savez(Path(out) / CAPTIONS_DIR / caption_file_name(split, step), arrays)


def check_run_dir(run_dir):
    """The run directory as a Path. Raises FileNotFoundError naming it if it does not exist,
    ValueError naming it unless it holds config.json and a captions/ folder with at least
    one val_step*.npz."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir}: no such run directory (check the path; "
                                f"`python -m minialign train --out DIR` writes one)")
    if not (run_dir / CONFIG).is_file() or not (run_dir / CAPTIONS_DIR).is_dir():
        raise ValueError(f"{run_dir}: not a run directory (needs config.json and captions/, "
                         f"as written by `python -m minialign train`)")
    if not any((run_dir / CAPTIONS_DIR).glob("val_step*.npz")):
        raise ValueError(f"{run_dir}: captions/ holds no val_step*.npz (no evaluation saved yet)")
    return run_dir


def caption_files(run_dir):
    """{step: {split: path}} for every captions/<split>_stepNNNNN.npz, steps ascending."""
    files = {}
    for path in sorted(Path(run_dir, CAPTIONS_DIR).iterdir()):
        match = CAPTION_FILE.match(path.name)
        if match:
            files.setdefault(int(match.group(2)), {})[match.group(1)] = path
    return dict(sorted(files.items()))


def load_caption_slots(path):
    """One saved caption file -> [(image_ids (P_s,) int64, z (P_s, D) float32) for s = 0, 1, ..].
    Raises ValueError, one line starting with the file, if it is unreadable (empty, truncated,
    not an .npz: files.load_npz), has fewer than 2 slots, or its arrays disagree (ranks, row
    counts, widths, repeated ids)."""
    arrays = load_npz(path, "saved caption embeddings file (.npz)")
    slots = []
    while f"slot{len(slots)}_z" in arrays and f"slot{len(slots)}_image_ids" in arrays:
        s = len(slots)
        ids, z = arrays[f"slot{s}_image_ids"], arrays[f"slot{s}_z"]
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or z.ndim != 2 or len(ids) != len(z):
            raise ValueError(f"{path}: slot {s} has image_ids {ids.shape} {ids.dtype} and "
                             f"z {z.shape}; expected (P,) integer and (P, D)")
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"{path}: slot {s} repeats an image id")
        slots.append((ids.astype(np.int64), z.astype(np.float32)))       # (P_s,), (P_s, D)
    if len(slots) < 2 or len({z.shape[1] for _, z in slots}) != 1:
        raise ValueError(f"{path}: expected slot0_z, slot1_z, ... of one width, "
                         f"has {sorted(arrays)}")
    return slots
