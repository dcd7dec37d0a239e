"""What a run saves (config.json, metrics.json, caption embeddings, the checkpoint), each through
a temporary file and os.replace: a run killed at any instant leaves the old file or the new one."""
import dataclasses
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from .metrics import collapse_stats, paraphrase_r_at_1
from .model import encode
from .objectives import CAUSAL, OBJECTIVES

EVAL_SLOTS = 5              # caption slots embedded per val/test photo (train: 2)
EVAL_BATCH = 500            # captions per forward pass when embedding


def embed(params, tokens, model, causal, encoder=encode):
    """Caption embeddings z (N, D), EVAL_BATCH captions at a time, each chunk cut to its
    longest caption. encoder: model.encode, or a variant's."""
    chunks = (tokens[i:i + EVAL_BATCH] for i in range(0, len(tokens), EVAL_BATCH))
    return np.concatenate([encoder(params, c[:, :(c != 0).sum(axis=1).max()], model, causal)[0]
                           for c in chunks])                              # (N, D)


def evaluate(params, cfg, data, out, step, splits):
    """Embed caption slot s = 0, 1, ... of every photo of each split, save them as
    captions/<split>_stepNNNNN.npz (float16) and return the text metrics of val and test:
    paraphrase R@1 (slot 0 finds slot 1 of the same photo) and the collapse diagnostics."""
    entry = {"step": step}
    for split in splits:
        table = data["tables"][split]
        arrays, slots = {}, []
        for s in range(min(EVAL_SLOTS if split != "train" else 2, table.counts.max())):
            photos = np.flatnonzero(table.counts > s)                     # (P_s,)
            tokens = table.tokens[table.offsets[photos] + s]              # (P_s, T)
            with np.errstate(over="ignore", invalid="ignore"):
                z = embed(params, tokens, cfg.model, CAUSAL[cfg.objective],
                          getattr(OBJECTIVES[cfg.objective], "encode", encode)).astype(np.float16)
            arrays[f"slot{s}_image_ids"] = data["captions"].image_ids[table.photo_idx[photos]]
            arrays[f"slot{s}_z"] = z
            slots.append(z.astype(np.float32))                            # what is saved
        if not all(np.isfinite(z).all() for z in slots):
            raise record_divergence(out, step, f"{split} caption embeddings not finite in float16")
        savez(out / "captions" / f"{split}_step{step:05d}.npz", **arrays)
        if split != "train":
            entry[split] = {"paraphrase_R@1": paraphrase_r_at_1(slots[0], slots[1]),
                            "chance": 1.0 / len(slots[0]), **collapse_stats(slots[0])}
    return entry


class Diverged(FloatingPointError):
    """The loss stopped being finite; the run's diverged.json says when."""


def config_json(cfg, data, params):
    """config.json: the config, and what it gives (vocabulary, parameters, photos, the bytes
    of the captions and vocabulary files, by which a resume recognises them)."""
    files = {"captions_sha256": sha256_file(cfg.captions),
             **({"vocab_sha256": sha256_file(cfg.vocab)} if cfg.vocab else {})}
    return {"config": dataclasses.asdict(cfg), "info": {
        "vocab_size": cfg.model.vocab_size, "parameters": int(sum(v.size for v in params.values())),
        "photos": {k: len(v) for k, v in data["split"].items()}, **files}}


def record(metrics, entry, out):
    metrics["evals"].append(entry)
    write_json(out / "metrics.json", metrics)


def check_run_dir(out, saved, resume, force):
    """Refuse, before anything is written, a run of other captions (unless force), of another
    config or diverged (resume), a directory not empty (neither resume nor force). Returns a
    finished run's metrics, else None."""
    old = json.loads((out / "config.json").read_text()) if (out / "config.json").is_file() else {}
    if old and not force and old["info"]["captions_sha256"] != saved["info"]["captions_sha256"]:
        raise ValueError(f"{out}: holds a run of other captions ({old['config']['captions']}; "
                         f"now {saved['config']['captions']}, whose bytes differ); pick another "
                         f"--out or pass --force")
    if resume and old:
        if first := first_difference(old, saved):
            raise ValueError(f"{out / 'config.json'}: a run of another config ({first}); "
                             f"pick another directory or pass --force")
        if (out / "diverged.json").is_file():
            raise Diverged(f"{out}: diverged ({(out / 'diverged.json').read_text().strip()})")
        if (out / "metrics.json").is_file():
            metrics = json.loads((out / "metrics.json").read_text())
            return metrics if "final" in metrics else None
    elif not force and out.is_dir() and any(p.name != ".lock" for p in out.iterdir()):
        raise FileExistsError(f"{out}: not empty (pass --resume to continue it, --force to "
                              f"start over)")


def first_difference(a, b, where=""):
    """The first key at which two nested dicts differ ("model.d_model: 64 -> 256"), or None;
    files are compared by their bytes (sha256 in "info"), not by how their paths are spelled."""
    for key in sorted((set(a) | set(b)) - {"captions", "vocab"}):
        if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            if found := first_difference(a[key], b[key], f"{where}{key}."):
                return found
        elif a.get(key) != b.get(key):
            return f"{where}{key}: {a.get(key)!r} -> {b.get(key)!r}"


def begin(out, saved, params, state, rngs, resume):
    """(first step, seconds trained, metrics): from checkpoint.npz if resuming (params, state,
    rngs restored in place, the log and caption files cut back to its step), else from step 0
    (an earlier attempt's files removed, config.json written)."""
    for path in [*out.glob(".*.tmp"), *out.glob("captions/.*.tmp")]:   # a killed write's
        path.unlink()
    if resume and (out / "checkpoint.npz").is_file():
        with np.load(out / "checkpoint.npz") as f:
            meta = json.loads(str(f["meta"]))
            for prefix, target in (("params/", params), ("m/", state["m"]), ("v/", state["v"])):
                for k in target:
                    target[k][...] = f[prefix + k]
        state["t"] = meta["t"]
        for rng, saved_state in zip(rngs, meta["rngs"]):
            rng.bit_generator.state = saved_state
        os.truncate(out / "log.jsonl", meta["log_bytes"])
        for path in (out / "captions").glob("*.npz"):
            if int(path.stem.split("_step")[1]) > meta["step"]:
                path.unlink()
        print(f"[{meta['metrics']['objective']}] {out}: resuming at step {meta['step']}",
              flush=True)
        return meta["step"], meta["seconds"], meta["metrics"]
    if resume and (out / "config.json").is_file():
        print(f"{out}: no checkpoint yet, starting at step 0", flush=True)
    for name in ("log.jsonl", "metrics.json", "checkpoint.npz", "model.npz", "diverged.json"):
        (out / name).unlink(missing_ok=True)
    for path in (out / "captions").glob("*.npz"):
        path.unlink()
    write_json(out / "config.json", saved)
    return 0, 0.0, {**{k: saved["config"][k] for k in ("objective", "seed", "lr")}, "evals": []}


def record_divergence(out, step, why):
    write_json(out / "diverged.json", {"step": step, "why": why})
    return Diverged(f"{out}: diverged at step {step} ({why})")


def save_checkpoint(out, step, params, state, rngs, metrics, log_bytes, seconds):
    """checkpoint.npz: weights, Adam moments, and as JSON all else a resume needs."""
    meta = {"step": step, "t": state["t"], "rngs": [r.bit_generator.state for r in rngs],
            "metrics": metrics, "log_bytes": log_bytes, "seconds": seconds}
    savez(out / "checkpoint.npz", meta=np.array(json.dumps(meta)),
         **{f"params/{k}": v for k, v in params.items()},
         **{f"m/{k}": v for k, v in state["m"].items()},
         **{f"v/{k}": v for k, v in state["v"].items()})


def atomic_write(path, data):
    """Write str or bytes to `path` through a temporary file and os.replace: a reader (or a
    run killed mid-write) sees the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")     # one writer of it per process
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def savez(path, **arrays):
    """{name: array} as an uncompressed .npz, atomically, every zip entry stamped ZipInfo's
    fixed 1980-01-01 (np.savez stamps the current time), so the same arrays give the same bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, mode="w") as zf:
        for name, array in arrays.items():
            with zf.open(zipfile.ZipInfo(name + ".npy"), "w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.asanyarray(array), allow_pickle=False)
    atomic_write(path, buffer.getvalue())


def write_json(path, obj):
    atomic_write(path, json.dumps(obj, indent=1) + "\n")


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
