"""A run directory's state on disk: atomic writes, checkpoint.npz, and resuming a stopped run.

At every evaluation step and at the last step a run writes checkpoint.npz (weights, Adam
moments and step count, the data and mask generators' states, the step, and the length of
log.jsonl), under a temporary name and then renamed. With resume=True a restarted run
truncates log.jsonl and metrics.json back to that step and continues; it ends bit-identical to
a run that was never stopped (log.jsonl holds no clock times, so it is identical byte for byte;
the times are in metrics.json). Imports only numpy: it knows a config only as a dataclass.
"""
import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np

from .files import atomic_savez, atomic_write_json

CHECKPOINT = "checkpoint.npz"  # the run's full state at its last evaluation step


def prepare_out_dir(out, force):
    """Create `out`; refuse an existing non-empty directory unless force (then empty it)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise FileExistsError(f"{out}: directory exists and is not empty "
                                  "(pass --force to replace it, or --resume to continue it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def config_differences(saved, cfg):
    """Fields where a saved config.json["config"] differs from cfg, as "name: saved -> now"
    strings. model.vocab_size is skipped: training derives it from the captions."""
    now = json.loads(json.dumps(dataclasses.asdict(cfg)))      # tuples -> lists, as saved
    saved = {**saved, "model": {k: v for k, v in saved.get("model", {}).items()
                                if k != "vocab_size"}}
    now["model"].pop("vocab_size")
    return [f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
            if saved.get(k) != now.get(k)]


def run_state(out, cfg):
    """What a resumed `train` finds in `out`: "new" (absent or empty), "finished" (metrics.json
    has "final"), "checkpoint" (checkpoint.npz to continue from) or "restart" (a run of this
    config stopped before its first checkpoint). Raises ValueError naming `out` when its
    config.json describes another run, FileExistsError when `out` is not a run directory."""
    out = Path(out)
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return "new"
    if not (out / "config.json").is_file():
        raise FileExistsError(f"{out}: not empty and holds no config.json, so it is not a "
                              "run directory to resume")
    diff = config_differences(json.loads((out / "config.json").read_text())["config"], cfg)
    if diff:
        raise ValueError(f"{out}: holds a run of another config, so it cannot be resumed "
                         f"({'; '.join(diff)}); pick another directory or pass --force")
    metrics = out / "metrics.json"
    if metrics.is_file() and "final" in json.loads(metrics.read_text()):
        return "finished"
    return "checkpoint" if (out / CHECKPOINT).is_file() else "restart"


def save_checkpoint(path, step, params, state, rngs, log_bytes, seconds):
    """Everything a resumed run needs to continue bit-identically, in one .npz written under
    a temporary name and renamed: params/<name>, adam_m/<name>, adam_v/<name> (float32), and
    "state", a 0-d string of JSON: step, Adam's t, bit_generator.state of each generator in
    rngs {"data", "mask"}, log_bytes (length of log.jsonl at `step`), seconds trained so far."""
    meta = {"step": step, "adam_t": state["t"], "log_bytes": log_bytes, "seconds": seconds,
            "rng": {name: rng.bit_generator.state for name, rng in rngs.items()}}
    arrays = {**{f"params/{k}": v for k, v in params.items()},
              **{f"adam_m/{k}": v for k, v in state["m"].items()},
              **{f"adam_v/{k}": v for k, v in state["v"].items()},
              "state": np.array(json.dumps(meta))}
    atomic_savez(path, arrays)


def load_checkpoint(path, params, state, rngs):
    """Restore a save_checkpoint file into params, state and rngs (in place).
    Returns the JSON "state" dict (step, adam_t, log_bytes, seconds, rng)."""
    with np.load(path, allow_pickle=False) as npz:
        for prefix, target in (("params/", params), ("adam_m/", state["m"]),
                               ("adam_v/", state["v"])):
            for k in target:
                target[k][...] = npz[prefix + k]
        meta = json.loads(str(npz["state"]))
    state["t"] = meta["adam_t"]
    for name, rng in rngs.items():
        rng.bit_generator.state = meta["rng"][name]
    return meta


def rewind_run_dir(out, meta, steps):
    """Undo what a stopped run wrote after its checkpoint step: cut log.jsonl back to
    meta["log_bytes"], drop later evaluations from metrics.json and later caption files.
    The last step's checkpoint comes before its evaluation, so that evaluation goes too
    (steps: the run's total). Returns the kept metrics dict."""
    step = meta["step"]
    with open(out / "log.jsonl", "r+b") as log:
        if log.seek(0, os.SEEK_END) < meta["log_bytes"]:
            raise ValueError(f"{out}: log.jsonl is shorter than its checkpoint at step {step}")
        log.truncate(meta["log_bytes"])
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["evals"] = [e for e in metrics["evals"] if e["step"] <= step and e["step"] < steps]
    atomic_write_json(out / "metrics.json", metrics)
    for path in (out / "captions").glob("*_step*.npz"):
        if int(path.stem.rsplit("_step", 1)[1]) > step:
            path.unlink()
    return metrics
