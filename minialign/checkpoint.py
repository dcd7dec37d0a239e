"""A run's checkpoint and its files: every write goes through a temporary file and os.replace,
so a run killed at any instant leaves the old file or the new one, never a part."""
import hashlib
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np


def save_checkpoint(out, step, params, state, rngs, metrics, log_bytes, seconds):
    """checkpoint.npz: weights, Adam moments, and as JSON the step, Adam's t, the random
    streams, metrics so far and the log's length: all a resumed run needs."""
    meta = {"step": step, "t": state["t"], "rngs": [r.bit_generator.state for r in rngs],
            "metrics": metrics, "log_bytes": log_bytes, "seconds": seconds}
    savez(out / "checkpoint.npz", meta=np.array(json.dumps(meta)),
         **{f"params/{k}": v for k, v in params.items()},
         **{f"m/{k}": v for k, v in state["m"].items()},
         **{f"v/{k}": v for k, v in state["v"].items()})


def load_checkpoint(out, params, state, rngs):
    """Restore save_checkpoint's file in place. Returns (step, seconds, metrics, log_bytes)."""
    with np.load(out / "checkpoint.npz") as f:
        meta = json.loads(str(f["meta"]))
        for prefix, target in (("params/", params), ("m/", state["m"]), ("v/", state["v"])):
            for k in target:
                target[k][...] = f[prefix + k]
    state["t"] = meta["t"]
    for rng, saved in zip(rngs, meta["rngs"]):
        rng.bit_generator.state = saved
    print(f"[{meta['metrics']['objective']}] {out}: resuming at step {meta['step']}", flush=True)
    return meta["step"], meta["seconds"], meta["metrics"], meta["log_bytes"]


def atomic_write(path, data):
    """Write str or bytes to `path` through a temporary file and os.replace: a reader (or a
    run killed mid-write) sees the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def savez(path, **arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write(path, buffer.getvalue())


def write_json(path, obj):
    atomic_write(path, json.dumps(obj, indent=1) + "\n")


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
