"""Training: TrainConfig, one training step, the loop (its evaluations: machinery/monitor.py).

A run writes a run directory (machinery/rundir.py names and documents its files), resumable
from its checkpoint. Training never reads image embeddings: nothing here imports their modules.
"""
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .machinery.checkpoint import open_run, resume_run, run_state, save_checkpoint
from .machinery.files import append_line
from .machinery.monitor import evaluate, finish, print_progress, print_start
from .machinery.rundir import finished_run, open_log, record_divergence, start_run, write_metrics
from .data import SPLIT_SEED, load_coco_captions, sample_batch, split_photos, tokenize_photos
from .model import ModelConfig, init_params, param_count
from .objectives import OBJECTIVES, ObjectiveConfig
from .optim import adam_init, adam_step, clip_grad_norm, lr_at
from .tokenizer import build_tokenizer

PLAIN_LOG_EVERY = 50  # steps between progress lines when stderr is not a terminal


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run. Defaults = the replicated setting (3000 steps, 256 photos
    per step, two captions each, so 512 captions per step for every objective)."""
    objective: str = "good_views"   # "good_views" | "bad_views" | "next_token"
    captions: str = ""              # COCO captions JSON
    steps: int = 3000
    batch_photos: int = 256         # photos per step; each contributes two captions
    lr: float = 1e-3                # peak AdamW step size
    warmup_steps: int = 100         # linear warm-up, then cosine decay
    min_lr_ratio: float = 0.1       # the cosine ends at min_lr_ratio * lr
    weight_decay: float = 0.05      # decoupled, weight matrices only (optim.decays)
    grad_clip: float = 1.0          # global L2 norm
    seed: int = 0                   # init, batch and mask streams
    split_seed: int = SPLIT_SEED    # photo split, independent of `seed`
    eval_every: int = 250
    min_count: int = 1              # a word enters the vocabulary after this many train uses
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: ObjectiveConfig = field(default_factory=ObjectiveConfig)  # masking rate, VICReg weights

    def __post_init__(self):
        """Raises ValueError naming the field and its valid range (the same ranges the
        command line's flags.py types enforce); ModelConfig and ObjectiveConfig check theirs."""
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose one of "
                             f"{', '.join(sorted(OBJECTIVES))}")
        if isinstance(self.model, dict):
            object.__setattr__(self, "model", ModelConfig(**self.model))
        if isinstance(self.loss, dict):
            object.__setattr__(self, "loss", ObjectiveConfig(**self.loss))
        for name, low in (("steps", 1), ("batch_photos", 2), ("warmup_steps", 0),
                          ("eval_every", 1), ("min_count", 1), ("seed", 0), ("split_seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ValueError(f"TrainConfig: {name}={value!r} must be an integer >= {low}")
        positive, nonnegative = (lambda v: v > 0, "> 0"), (lambda v: v >= 0, ">= 0")
        for name, (ok, allowed) in {"lr": positive, "grad_clip": positive,
                                    "weight_decay": nonnegative,
                                    "min_lr_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]")}.items():
            value = getattr(self, name)
            if (not isinstance(value, (int, float, np.number)) or isinstance(value, bool)
                    or not np.isfinite(value) or not ok(value)):
                raise ValueError(f"TrainConfig: {name}={value!r} must be a number {allowed}")


def prepare(cfg):
    """Captions -> split -> tokenizer (train captions only) -> token tables per split.
    Checks here every precondition that can fail before step 1 (it runs before the run
    directory is touched): the captions file (data.load_coco_captions), enough photos for the
    split, 2 <= batch_photos <= train photos; val and test photos all have >= 2 captions (the
    loader keeps no other photo), as the evaluation's paraphrase R@1 needs slots 0 and 1.
    Returns a dict with captions, split, tokenizer, tables {split: CaptionTable}, n_truncated.
    Raises FileNotFoundError / ValueError, each message one line starting with cfg.captions."""
    captions = load_coco_captions(cfg.captions)
    try:
        split = split_photos(captions.image_ids, cfg.split_seed)
    except ValueError as err:               # "11 photos cannot give ...": say which file
        raise ValueError(f"{cfg.captions}: {err}") from None
    train_text = [c for i in split["train"] for c in captions.captions[i]]
    tok = build_tokenizer(train_text, cfg.min_count)
    tables, n_truncated = {}, 0
    for name, idx in split.items():
        tables[name], n = tokenize_photos(captions, idx, tok, cfg.model.max_len)
        n_truncated += n
    for name in ("val", "test"):
        assert tables[name].counts.min() >= 2, f"{cfg.captions}: a {name} photo has < 2 captions"
    if not 2 <= cfg.batch_photos <= len(split["train"]):
        raise ValueError(f"{cfg.captions}: batch_photos={cfg.batch_photos}, but the train split "
                         f"has {len(split['train'])} photos (need 2 <= batch_photos <= that)")
    if cfg.warmup_steps >= cfg.steps > 0:
        print(f"warning: --warmup-steps {cfg.warmup_steps} >= --steps {cfg.steps}: the learning "
              f"rate never reaches its peak {cfg.lr}", file=sys.stderr)
    return {"captions": captions, "split": split, "tokenizer": tok, "tables": tables,
            "n_truncated": n_truncated}


def train_step(params, state, batch, cfg, lr, rng_mask):
    """One optimizer step: the objective's loss and gradients, global-norm clipping, AdamW.
    params, state: weights and Adam moments, updated in place; batch: data.Batch; cfg:
    TrainConfig; lr: this step's learning rate (optim.lr_at); rng_mask: bad_views' masks.
    Returns (loss, stats, grad_norm), grad_norm before clipping. A loss or gradient norm that
    is not finite leaves params and state untouched: the caller records the divergence."""
    with np.errstate(over="ignore", invalid="ignore"):    # divergence is the caller's check
        loss, grads, stats = OBJECTIVES[cfg.objective](params, batch, cfg, rng_mask)
        grad_norm = clip_grad_norm(grads, cfg.grad_clip)
    if np.isfinite(loss) and np.isfinite(grad_norm):
        adam_step(params, grads, state, lr, cfg.weight_decay)
    return loss, stats, grad_norm


def train(cfg, out, force=False, progress=None, resume=False, stop_after=None):
    """Run one training run and write the run directory `out`. Returns the final metrics dict.
    progress: True for a tqdm bar, False for plain lines, None to pick by whether stderr is a
    terminal. resume: continue `out` from whatever stage stopped (checkpoint.run_state), or
    return its saved metrics if it already finished. force: replace `out` if it holds a run
    and nothing else (checkpoint.check_replaceable). stop_after: return None after this many
    steps, as if the process had been killed there (for tests of resuming).
    Every input is checked before `out` is touched, and `out` is locked (files.DirLock) while
    this runs. Raises FileNotFoundError / ValueError for bad captions or config, FileExistsError
    for a non-empty `out` without force or resume (or with foreign files), ValueError for
    resuming a directory that holds another config, files.DirLockedError when another
    process holds `out`, rundir.Diverged when the loss stops being finite (now or in an
    earlier try)."""
    if force and resume:
        raise ValueError("pass force (start over) or resume (continue), not both")
    out = Path(out)
    # A finished run has nothing to redo: return its metrics before reading any input.
    if resume and run_state(out, cfg) in ("finished", "diverged"):
        return finished_run(out, cfg)
    # Check every input, before `out` is touched; the vocabulary sets the model's size.
    data = prepare(cfg)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, vocab_size=data["tokenizer"].vocab_size))
    # Lock `out`, then start, restart or continue the run there (checkpoint.open_run).
    with open_run(out, cfg, force, resume, inputs=[cfg.captions]) as found:
        if found in ("finished", "diverged"):
            return finished_run(out, cfg)
        return run(cfg, out, data, found == "checkpoint", progress, stop_after)


def run(cfg, out, data, from_checkpoint, progress=None, stop_after=None):
    """The training loop of train(), into the locked run directory `out`. Returns the final
    metrics dict, or None when stopped by stop_after."""
    # Start: init, batch and mask streams seeded apart; fresh weights and Adam moments.
    rng_init, rng_data, rng_mask = (np.random.default_rng(s)
                                    for s in np.random.SeedSequence(cfg.seed).spawn(3))
    params = init_params(cfg.model, rng_init)
    state = adam_init(params)
    info = {"vocab_size": cfg.model.vocab_size, "parameters": param_count(params),
            "embedding_parameters": int(params["tok_emb"].size),
            "captions_truncated": data["n_truncated"],
            "photos": {k: len(v) for k, v in data["split"].items()},
            "caption_stats": data["captions"].stats}

    # Resume: weights, moments and streams from checkpoint.npz, the files cut back to its step.
    # Or begin: config.json, no evaluation yet.
    if from_checkpoint:
        metrics, meta = resume_run(out, cfg, params, state, {"data": rng_data, "mask": rng_mask})
        first_step, seconds_before = meta["step"], meta["seconds"]
        print(f"[{cfg.objective}] {out}: resuming from the checkpoint at step {first_step}",
              flush=True)
    else:
        metrics = start_run(out, cfg, info)
        first_step, seconds_before = 0, 0.0
    print_start(cfg, info)

    use_bar = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=cfg.steps, initial=first_step, desc=cfg.objective, disable=not use_bar,
               dynamic_ncols=True)
    t_start = time.perf_counter() - seconds_before
    with open_log(out) as log:                   # bytes: tell() is the length to cut back to
        for step in range(first_step, cfg.steps):
            if stop_after is not None and step >= stop_after:   # as if killed here (tests)
                bar.close()
                return None
            # Step: this step's learning rate and batch, then objective, clipping and AdamW.
            t0 = time.perf_counter()
            lr = lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
            batch = sample_batch(data["tables"]["train"], cfg.batch_photos, rng_data)
            loss, stats, grad_norm = train_step(params, state, batch, cfg, lr, rng_mask)
            if not (np.isfinite(loss) and np.isfinite(grad_norm)):
                bar.close()
                record_divergence(out, step + 1, cfg.lr, f"loss {loss}, gradient norm {grad_norm}")

            # Log: one line of log.jsonl per step; the bar, or a plain line now and then.
            row = {"step": step + 1, **stats, "lr": lr, "grad_norm": grad_norm,
                   "seconds": time.perf_counter() - t0}                   # wall time of this step
            append_line(log, json.dumps(row))
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            bar.update(1)
            if not use_bar and ((step + 1) % PLAIN_LOG_EVERY == 0 or step == first_step):
                print_progress(cfg, step, first_step, loss, lr,
                               time.perf_counter() - t_start - seconds_before)

            # Evaluate: the val captions every eval_every steps (the last step's comes below).
            if (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                entry = evaluate(params, cfg, data, out, step + 1, ("val",))
                metrics["evals"].append(entry)
                write_metrics(out, metrics)
                bar.write(f"[{cfg.objective}] step {step + 1} val paraphrase R@1 "
                          f"{entry['val']['paraphrase_R@1']:.3f}", file=sys.stdout)

            # Checkpoint: what a resumed run needs, at every evaluation step and the last step.
            if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
                save_checkpoint(out, step + 1, params, state,
                                {"data": rng_data, "mask": rng_mask}, log.tell(),
                                time.perf_counter() - t_start)
    bar.close()
    return finish(params, cfg, data, out, metrics, t_start)
