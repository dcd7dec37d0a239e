"""Training: TrainConfig, one training step, the loop (what it does around the step, from
checking its inputs to the final evaluation: machinery/run/monitor.py).

A run writes a run directory (machinery/run/rundir.py names and documents its files), resumable
from its checkpoint. Training never reads image embeddings: nothing here imports their modules.
"""
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .machinery.run.checkpoint import (CHECKPOINT_SECONDS, open_run, resume_run, run_state,
                                       save_checkpoint)
from .machinery.run.files import append_line
from .machinery.run.monitor import Progress, evaluate_val, finish, prepare, print_start, run_info
from .machinery.run.rundir import finished_run, open_log, record_divergence, start_run
from .data import SPLIT_SEED, sample_batch
from .model import ModelConfig, check_fields, init_params
from .objectives import OBJECTIVES, ObjectiveConfig, unseen_params
from .optim import adam_init, adam_step, clip_grad_norm, lr_at


TOKENIZERS = ("words", "wordpiece")   # words: the training captions' words; wordpiece: BERT's


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
    tokenizer: str = "words"        # "words" (tokenizer.py) | "wordpiece" (wordpiece.py)
    vocab: str = ""                 # wordpiece: its vocabulary file; "" with words
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: ObjectiveConfig = field(default_factory=ObjectiveConfig)  # masking rate, VICReg weights

    def __post_init__(self):
        """Raises ValueError naming the field and its valid range (model.check_fields)."""
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose one of "
                             f"{', '.join(sorted(OBJECTIVES))}")
        if (self.tokenizer not in TOKENIZERS
                or (self.vocab != "") != (self.tokenizer == "wordpiece")):
            raise ValueError(f"tokenizer={self.tokenizer!r} with vocab={self.vocab!r}: choose "
                             f"words (vocab '') or wordpiece with a vocabulary file")
        if isinstance(self.model, dict):
            object.__setattr__(self, "model", ModelConfig(**self.model))
        if isinstance(self.loss, dict):
            object.__setattr__(self, "loss", ObjectiveConfig(**self.loss))
        check_fields(self, integers={"steps": 1, "batch_photos": 2, "warmup_steps": 0,
                                     "eval_every": 1, "min_count": 1, "seed": 0, "split_seed": 0},
                     numbers={"lr": "> 0", "grad_clip": "> 0", "weight_decay": ">= 0",
                              "min_lr_ratio": "in [0, 1]"})


def train_step(params, state, batch, cfg, lr, rng_mask):
    """One optimizer step: the objective's loss and gradients, global-norm clipping, AdamW.
    params, state: weights and Adam moments, updated in place; batch: data.Batch; cfg:
    TrainConfig; lr: this step's learning rate (optim.lr_at); rng_mask: bad_views' masks.
    Returns (loss, stats, grad_norm), grad_norm before clipping. A loss or gradient norm that
    is not finite leaves params and state untouched: the caller records the divergence.
    cfg.loss.unseen_params = "freeze": the parameters the loss cannot see (objectives.
    unseen_params) get their true gradient, 0, in place of rounding noise, before clipping:
    AdamW then leaves them (and their moments) exactly where they are."""
    with np.errstate(over="ignore", invalid="ignore"):    # divergence is the caller's check
        loss, grads, stats = OBJECTIVES[cfg.objective](params, batch, cfg, rng_mask)
        for name in unseen_params(cfg) if cfg.loss.unseen_params == "freeze" else ():
            grads[name][...] = 0                          # its exact gradient
        grad_norm = clip_grad_norm(grads, cfg.grad_clip)
    if np.isfinite(loss) and np.isfinite(grad_norm):
        adam_step(params, grads, state, lr, cfg.weight_decay)
    return loss, stats, grad_norm


def train(cfg, out, force=False, progress=None, resume=False, stop_after=None):
    """Run one training run into the run directory `out`; return its final metrics dict.
    resume: continue `out` from whatever stage stopped (a finished run: its metrics); force:
    replace `out` if it holds a run and nothing else; progress: a tqdm bar (True), plain lines
    (False), by terminal (None); stop_after: return None after this many steps, as if killed
    (tests). Inputs are checked before `out` is touched, then `out` is locked. Raises
    FileNotFoundError / ValueError (bad input, or resuming another config), FileExistsError,
    dirlock.DirLockedError, rundir.Diverged (checkpoint.open_run says when)."""
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
    with open_run(out, cfg, force, resume, inputs=[cfg.captions, cfg.vocab]) as found:
        if found in ("finished", "diverged"):
            return finished_run(out, cfg)
        return run(cfg, out, data, found == "checkpoint", progress, stop_after)


def run(cfg, out, data, from_checkpoint, progress=None, stop_after=None):
    """The training loop of train(), into the locked run directory `out`. Returns the final
    metrics dict, or None when stopped by stop_after."""
    # Start: init, batch and mask streams seeded apart; fresh weights and Adam moments.
    rng_init, rng_data, rng_mask = (np.random.default_rng(s)
                                    for s in np.random.SeedSequence(cfg.seed).spawn(3))
    rngs = {"data": rng_data, "mask": rng_mask}             # what a checkpoint saves and restores
    params = init_params(cfg.model, rng_init)
    state = adam_init(params)
    info = run_info(cfg, params, data)

    # Resume: weights, moments and streams from checkpoint.npz, the files cut back to its step.
    # Or begin: config.json, then (below) the untrained encoder's evaluation at step 0.
    if from_checkpoint:
        metrics, first_step, seconds_before = resume_run(out, cfg, params, state, rngs)
    else:
        metrics, first_step, seconds_before = start_run(out, cfg, info), 0, 0.0
    print_start(cfg, info)

    t_start = time.perf_counter() - seconds_before
    t_saved = time.perf_counter()                               # the last checkpoint's time
    with open_log(out) as log, Progress(cfg, first_step, progress) as screen:
        # Evaluate step 0, the untrained encoder, where every val curve starts. It draws no
        # random number, so the steps after it are those of a run without it.
        if first_step == 0:
            evaluate_val(params, cfg, data, out, 0, metrics, screen)
        for step in range(first_step, cfg.steps):
            if stop_after is not None and step >= stop_after:   # as if killed here (tests)
                return None
            # Step: this step's learning rate and batch, then objective, clipping and AdamW.
            t0 = time.perf_counter()
            lr = lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
            batch = sample_batch(data["tables"]["train"], cfg.batch_photos, rng_data)
            loss, stats, grad_norm = train_step(params, state, batch, cfg, lr, rng_mask)
            if not (np.isfinite(loss) and np.isfinite(grad_norm)):
                record_divergence(out, step + 1, cfg.lr, f"loss {loss}, gradient norm {grad_norm}")

            # Log: one line of log.jsonl per step (bytes: tell() is where a resume cuts back to).
            row = {"step": step + 1, **stats, "lr": lr, "grad_norm": grad_norm,
                   "seconds": time.perf_counter() - t0}                   # wall time of this step
            append_line(log, json.dumps(row))
            screen.step(step, loss, lr)

            # Evaluate: the val captions every eval_every steps (the last step's: finish below).
            if (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                evaluate_val(params, cfg, data, out, step + 1, metrics, screen)

            # Checkpoint: what a resumed run needs, at every evaluation step, the last step, and
            # at least every CHECKPOINT_SECONDS (a stop loses at most 10 minutes of steps).
            if ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps
                    or time.perf_counter() - t_saved >= CHECKPOINT_SECONDS):
                save_checkpoint(out, step + 1, params, state, rngs, log.tell(),
                                time.perf_counter() - t_start)
                t_saved = time.perf_counter()
    return finish(params, cfg, data, out, metrics, t_start)
