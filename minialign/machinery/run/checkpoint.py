"""Stopping, resuming and replacing a run directory (whose files rundir.py names).

At every evaluation step and at the last step a run writes checkpoint.npz (weights, Adam
moments and step count, the data and mask generators' states, the step, and the length of
log.jsonl), under a temporary name and then renamed. With resume=True a restarted run
truncates log.jsonl and metrics.json back to that step and continues; it ends bit-identical to
a run that was never stopped (log.jsonl holds no clock times, so it is identical byte for byte;
the times are in metrics.json). open_run decides, under the directory's lock, whether a run
starts, restarts, continues or is already done; --force replaces only a run directory.
Imports only numpy, files.py and rundir.py: it knows a config only as a dataclass.
"""
import contextlib
import dataclasses
import json
from pathlib import Path

import numpy as np

from .dirlock import LOCK_FILE, DirLock
from .files import TMP_SUFFIX, atomic_savez, load_npz, remove_stale_temporaries, sha256_file
from .rundir import (CAPTION_FILE, CAPTIONS_DIR, CHECKPOINT, CONFIG, DIVERGED, LOG, METRICS,
                     RUN_FILES, read_metrics, read_run_config, read_run_info, upgrade_config,
                     write_metrics)

INPUT_FILES = ("captions", "vocab")  # TrainConfig fields naming a file: a resume compares bytes
CHECKPOINT_SECONDS = 600   # train saves a checkpoint at every evaluation and at least this often


def run_files(out):
    """The files in `out` that a minialign run writes: RUN_FILES, captions/<split>_stepNNNNN.npz,
    and temporary files of an interrupted write. Returns (run_paths, foreign_paths): what
    clear_run_dir may delete, and everything else (which makes `out` not a run directory)."""
    out, ours, foreign = Path(out), [], []
    for path in sorted(out.iterdir()) if out.is_dir() else []:
        if path.name == CAPTIONS_DIR and path.is_dir() and not path.is_symlink():
            for inner in sorted(path.iterdir()):
                mine = inner.is_file() and (CAPTION_FILE.match(inner.name) or is_temporary(inner))
                (ours if mine else foreign).append(inner)
            ours.append(path)
        elif path.is_file() and (path.name in RUN_FILES or is_temporary(path)):
            ours.append(path)
        else:
            foreign.append(path)
    return ours, foreign


def is_temporary(path):
    return path.name.startswith(".") and path.name.endswith(TMP_SUFFIX)


def is_empty_run_dir(out):
    """Whether `out` is absent, empty, or holds only what a run leaves before it has written
    anything of value (its lock, an empty captions/ folder, temporary files)."""
    ours, foreign = run_files(out)
    return not foreign and all(p.name == LOCK_FILE or is_temporary(p) or
                               (p.is_dir() and not any(p.iterdir())) for p in ours)


def check_replaceable(out, inputs=()):
    """Refuse, before anything is deleted, to let --force replace `out` unless it is a run
    directory: not the current directory or one of its parents, holding none of `inputs`
    (e.g. the captions file), and nothing but a run's own files (run_files).
    Raises ValueError / FileExistsError naming `out` and what it holds."""
    out = Path(out)
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"{out}: exists and is not a directory")
    here, target = Path.cwd().resolve(), out.resolve()
    if target == here or target in here.parents:
        raise ValueError(f"{out}: is the current directory or one of its parents; --force "
                         f"never deletes it, pass a run directory of its own (e.g. runs/NAME)")
    for path in inputs:
        if path and Path(path).resolve().is_relative_to(target):
            raise ValueError(f"{out}: holds {path}, an input of this run; --force would delete "
                             f"it. Move it out of {out} or pick another --out")
    foreign = run_files(out)[1]
    if foreign:
        names = ", ".join(str(p.relative_to(out)) for p in foreign[:5])
        raise FileExistsError(f"{out}: holds {len(foreign)} file(s) that no minialign run "
                              f"writes ({names}{', ...' if len(foreign) > 5 else ''}); --force "
                              f"only replaces a run directory. Move them or pick another --out")


def clear_run_dir(out):
    """Delete a run's own files from `out` (run_files), keeping the folder and its lock.
    Call check_replaceable first, and only while holding the folder's DirLock."""
    ours, foreign = run_files(out)
    if foreign:                          # check_replaceable passed, then someone added a file
        raise FileExistsError(f"{out}: now holds {foreign[0].name}, which no run writes; "
                              f"nothing was deleted")
    for path in ours:                    # a folder comes after its files (sorted, appended last)
        if path.is_dir():
            path.rmdir()
        elif path.name != LOCK_FILE:
            path.unlink()


def input_difference(field, saved_path, now_path, saved_sha256=None):
    """None when a run's input file and now_path hold the same bytes, however either is spelled
    (relative, absolute, a copy); else one "field: saved -> now (...)" string naming both.
    saved_path: as the run was started with; saved_sha256: its bytes' sha256 as the run
    recorded it (config.json "info"), None for a run from before it was recorded (then the
    saved spelling is read again, from this folder). A file that cannot be read now under the
    same spelling is no difference here: reading the captions says what is wrong with it."""
    def differs(why=""):
        return f"{field}: {saved_path!r} -> {now_path!r}{why}"
    then = "when the run started" if saved_sha256 else "in the saved file"
    if saved_sha256 is None:
        if saved_path == now_path:
            return None
        try:
            saved_sha256 = sha256_file(saved_path)
        except OSError:
            return differs()
    try:
        now_sha256 = sha256_file(now_path)
    except OSError:
        return None if saved_path == now_path else differs()
    if now_sha256 == saved_sha256:
        return None
    return differs(f" (other bytes: sha256 {saved_sha256[:12]}... {then}, "
                   f"{now_sha256[:12]}... now)")


def config_differences(saved, cfg, info=None):
    """Fields where a saved config.json["config"] differs from cfg, as "name: saved -> now"
    strings. model.vocab_size is skipped: training derives it from the captions. INPUT_FILES
    are compared by their bytes (input_difference; info: config.json's "info", for the
    sha256 the run recorded)."""
    now = json.loads(json.dumps(dataclasses.asdict(cfg)))      # tuples -> lists, as saved
    saved = upgrade_config(saved)
    saved = {**saved, "model": {k: v for k, v in saved.get("model", {}).items()
                                if k != "vocab_size"}}
    now["model"].pop("vocab_size")
    found = [input_difference(k, saved.pop(k, None), now.pop(k), (info or {}).get(f"{k}_sha256"))
             for k in INPUT_FILES]
    return field_differences(saved, now) + [d for d in found if d]


def field_differences(saved, now):
    """"name: saved -> now" for each field that differs, nested configs by their dotted field
    (model.dtype: 'float64' -> 'float32'), not as two whole dicts."""
    return [f"{name}: {a!r} -> {b!r}" for name, a, b in changed_fields(saved, now)]


def changed_fields(old, new, prefix="", order=lambda old, new: sorted(set(old) | set(new))):
    """(dotted name, old value, new value) for each leaf where two nested dicts differ,
    walking both (a key missing on one side reads None); order(old, new): a level's keys."""
    found = []
    for key in order(old, new):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += changed_fields(a, b, f"{prefix}{key}.", order)
        elif a != b:
            found.append((f"{prefix}{key}", a, b))
    return found


def run_state(out, cfg):
    """What `train --resume` finds in `out`: "new" (absent, or only a run's leftovers from before
    its config.json was written), "finished" (metrics.json has "final"), "diverged"
    (diverged.json), "checkpoint" (checkpoint.npz to continue from) or "restart" (a run of this
    config stopped before its first checkpoint). Raises ValueError naming the file when
    config.json is unreadable or describes another run, FileExistsError when `out` holds
    files no run writes."""
    out = Path(out)
    if not out.exists():
        return "new"
    if not (out / CONFIG).is_file():
        if run_files(out)[1]:
            raise FileExistsError(f"{out}: not empty and holds no config.json, so it is not a "
                                  "run directory to resume; pick another --out")
        return "new"
    diff = config_differences(read_run_config(out), cfg, read_run_info(out))
    if diff:
        raise ValueError(f"{out}: holds a run of another config, so it cannot be resumed "
                         f"({'; '.join(diff)}); pick another directory or pass --force")
    if (out / DIVERGED).is_file():
        return "diverged"
    if "final" in read_metrics(out):
        return "finished"
    return "checkpoint" if (out / CHECKPOINT).is_file() else "restart"


@contextlib.contextmanager
def open_run(out, cfg, force, resume, inputs=()):
    """Lock `out` for one training run and say how it starts: yields run_state's "new",
    "restart", "checkpoint", "finished" or "diverged" ("new" without resume). Before locking:
    force must find a run directory to replace (check_replaceable, `inputs` e.g. the captions
    file), and without force or resume `out` must be empty (FileExistsError; dirlock.DirLockedError
    naming the process when a run is in progress there). Under the lock, a run that will train
    loses its stale temporary files, and a "new" or "restart" one its earlier files."""
    out = Path(out)
    if force:
        check_replaceable(out, inputs)
    elif not resume and not is_empty_run_dir(out):
        DirLock(out).check_free()                # a run in progress there: say whose
        raise FileExistsError(f"{out}: directory exists and is not empty "
                              "(pass --force to replace it, or --resume to continue it)")
    with DirLock(out):                           # decided again, now that no one else can write
        found = run_state(out, cfg) if resume else "new"
        if found not in ("finished", "diverged"):
            remove_stale_temporaries(out)
            if found in ("new", "restart"):
                clear_run_dir(out)
        yield found


def save_checkpoint(out, step, params, state, rngs, log_bytes, seconds):
    """Everything a resumed run needs to continue bit-identically, in out/checkpoint.npz
    written under a temporary name and renamed: params/<name>, adam_m/<name>, adam_v/<name>
    (float32), and "state", a 0-d string of JSON: step, Adam's t, bit_generator.state of each
    generator in rngs {"data", "mask"}, log_bytes (length of log.jsonl at `step`), seconds
    trained so far."""
    meta = {"step": step, "adam_t": state["t"], "log_bytes": log_bytes, "seconds": seconds,
            "rng": {name: rng.bit_generator.state for name, rng in rngs.items()}}
    arrays = {**{f"params/{k}": v for k, v in params.items()},
              **{f"adam_m/{k}": v for k, v in state["m"].items()},
              **{f"adam_v/{k}": v for k, v in state["v"].items()},
              "state": np.array(json.dumps(meta))}
    atomic_savez(Path(out) / CHECKPOINT, arrays)


def load_checkpoint(out, params, state, rngs):
    """Restore a save_checkpoint file into params, state and rngs (in place).
    Returns the JSON "state" dict (step, adam_t, log_bytes, seconds, rng). Raises ValueError
    naming the file if it is unreadable or does not fit this run (an array missing or of
    another shape or dtype); nothing is restored then."""
    path = Path(out) / CHECKPOINT
    arrays = load_npz(path, "checkpoint")
    try:
        meta = json.loads(str(arrays["state"]))
        saved = {(prefix, k): arrays[prefix + k] for prefix, target in
                 (("params/", params), ("adam_m/", state["m"]), ("adam_v/", state["v"]))
                 for k in target}
        rng_states = [meta["rng"][name] for name in rngs]
        step, adam_t = int(meta["step"]), int(meta["adam_t"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: not a checkpoint of this run (lacks {err}); pass --force "
                         f"to start the run over") from None
    targets = {"params/": params, "adam_m/": state["m"], "adam_v/": state["v"]}
    for (prefix, k), array in saved.items():
        target = targets[prefix][k]
        if array.shape != target.shape or array.dtype != target.dtype:
            raise ValueError(f"{path}: {prefix}{k} is {array.shape} {array.dtype}, this run's is "
                             f"{target.shape} {target.dtype}; pass --force to start over")
    for (prefix, k), array in saved.items():
        targets[prefix][k][...] = array
    state["t"] = adam_t
    for rng, rng_state in zip(rngs.values(), rng_states):
        rng.bit_generator.state = rng_state
    return {**meta, "step": step}


def eval_steps(step, steps, eval_every):
    """The intermediate evaluation steps a run has passed at `step`: step 0 (the untrained
    encoder, since #22) and every eval_every-th step up to `step`, the final step (`steps`)
    excluded (its evaluation follows the checkpoint)."""
    return [s for s in range(0, step + 1, eval_every) if s < steps]


def rewind_run_dir(out, meta, cfg):
    """Undo what a stopped run wrote after its checkpoint: cut log.jsonl back to
    meta["log_bytes"], drop later evaluations from metrics.json (which may not exist yet: the
    run may have stopped before its first evaluation was written) and later caption files.
    The last step's checkpoint comes before its evaluation, so that evaluation goes too.
    Returns the kept metrics dict. Raises ValueError naming a file that is missing or shorter
    than the checkpoint says (the run cannot continue exactly; --force starts over)."""
    out, step = Path(out), meta["step"]
    expected = eval_steps(step, cfg.steps, cfg.eval_every)
    log_path, metrics_path = out / LOG, out / METRICS
    if not log_path.is_file() or log_path.stat().st_size < meta["log_bytes"]:
        raise ValueError(f"{log_path}: missing or shorter than {CHECKPOINT} at step {step} "
                         f"says; the run cannot continue exactly, pass --force to start over")
    metrics = {"objective": cfg.objective, "seed": cfg.seed, "evals": []}
    if metrics_path.is_file():
        metrics = read_metrics(out)
    evals = [e for e in metrics.get("evals", []) if e["step"] in expected]
    if [e["step"] for e in evals if e["step"] > 0] != expected[1:]:  # step 0: none before #22
        raise ValueError(f"{metrics_path}: lacks the evaluations at steps {expected} that "
                         f"{CHECKPOINT} at step {step} comes after; pass --force to start over")
    with open(log_path, "r+b") as log:
        log.truncate(meta["log_bytes"])
    metrics["evals"] = evals
    if metrics_path.is_file():
        write_metrics(out, metrics)
    for path in (out / CAPTIONS_DIR).glob("*.npz"):
        match = CAPTION_FILE.match(path.name)
        if match and int(match.group(2)) > step:
            path.unlink()
    return metrics


def resume_run(out, cfg, params, state, rngs):
    """Continue a stopped run: load its checkpoint into params, state and rngs (in place), cut
    its files back to that step (rewind_run_dir), say so. Returns (kept metrics dict, the
    checkpoint's step, its run seconds so far)."""
    meta = load_checkpoint(out, params, state, rngs)
    metrics = rewind_run_dir(out, meta, cfg)
    print(f"[{cfg.objective}] {out}: resuming from the checkpoint at step {meta['step']}",
          flush=True)
    return metrics, meta["step"], meta["seconds"]
