"""Training: TrainConfig, one step, and the loop with its evaluations and checkpoints. A run
can be stopped at any point: `train(cfg, out, resume=True)` continues to the same bits.
Training never reads image embeddings."""
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .checkpoint import (begin, check_run_dir, config_json, evaluate, record,
                         record_divergence, save_checkpoint, savez)
from .data import SPLIT_SEED, load_captions, sample_batch, split_photos, tokenize_photos
from .model import ModelConfig, init_params
from .objectives import OBJECTIVES, ObjectiveConfig
from .optim import adam_init, adam_step, clip_grad_norm, lr_at
from .tokenizer import build_tokenizer

CHECKPOINT_SECONDS = 600    # a stop loses at most this much training


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run. Defaults: the replicated setting."""
    objective: str = "good_views"   # a key of objectives.OBJECTIVES
    captions: str = ""              # the captions file
    steps: int = 3000
    batch_photos: int = 256         # photos per step; each gives two captions (512 a step)
    lr: float = 1e-3                # peak AdamW step size
    warmup_steps: int = 100         # linear warm-up, then cosine decay
    min_lr_ratio: float = 0.1       # the cosine ends at min_lr_ratio * lr
    weight_decay: float = 0.05      # decoupled, weight matrices only
    grad_clip: float = 1.0          # global L2 norm
    seed: int = 0                   # init, batch and mask streams
    split_seed: int = SPLIT_SEED    # photo split, independent of `seed`
    eval_every: int = 250
    min_count: int = 1              # words: train uses before a word enters the vocabulary
    tokenizer: str = "words"        # "words" (tokenizer.py) | "wordpiece" (wordpiece.py)
    vocab: str = ""                 # wordpiece: its vocabulary file
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: ObjectiveConfig = field(default_factory=ObjectiveConfig)

    def __post_init__(self):
        if isinstance(self.model, dict):
            object.__setattr__(self, "model", ModelConfig(**self.model))
        if isinstance(self.loss, dict):
            object.__setattr__(self, "loss", ObjectiveConfig(**self.loss))
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; one of {', '.join(OBJECTIVES)}")
        if (self.tokenizer == "wordpiece") != bool(self.vocab):
            raise ValueError("the wordpiece tokenizer needs a vocabulary file; words needs none")


def train_step(params, state, batch, cfg, lr, rng):
    """One optimizer step: the objective's loss and gradients, global-norm clipping, AdamW on
    params and state in place. Returns (loss, stats, grad_norm before clipping); a loss or
    norm that is not finite leaves params and state untouched."""
    with np.errstate(over="ignore", invalid="ignore"):
        loss, grads, stats = OBJECTIVES[cfg.objective](params, batch, cfg, rng)
        grad_norm = clip_grad_norm(grads, cfg.grad_clip)
    if np.isfinite(loss) and np.isfinite(grad_norm):
        adam_step(params, grads, state, lr, cfg.weight_decay)
    return loss, stats, grad_norm


def prepare(cfg):
    """Captions -> photo split -> tokenizer (words of the train captions, or WordPiece) ->
    token tables. Checks every input that can fail, before anything is written."""
    captions = load_captions(cfg.captions)
    try:
        split = split_photos(captions.image_ids, cfg.split_seed)
    except ValueError as err:
        raise ValueError(f"{cfg.captions}: {err}") from None
    if cfg.tokenizer == "wordpiece":
        from .wordpiece import read_vocab
        tok = read_vocab(cfg.vocab)
    else:
        tok = build_tokenizer([c for i in split["train"] for c in captions.captions[i]],
                              cfg.min_count)
    if not 2 <= cfg.batch_photos <= len(split["train"]):
        raise ValueError(f"{cfg.captions}: batch_photos={cfg.batch_photos}, but the train split "
                         f"has {len(split['train'])} photos")
    tables = {name: tokenize_photos(captions, idx, tok, cfg.model.max_len)[0]
              for name, idx in split.items()}
    return {"captions": captions, "split": split, "tokenizer": tok, "tables": tables}


def init_weights(cfg, rng):
    """The encoder's weights, then a variant's own (machinery/variants.py), if it has any."""
    params = init_params(cfg.model, rng)
    params.update(getattr(OBJECTIVES[cfg.objective], "init", lambda model, rng: {})(cfg.model, rng))
    return params


def train(cfg, out, resume=False, force=False, progress=None, stop_after=None, data=None):
    """Train one run into directory `out`; return its metrics. resume: continue from its
    checkpoint (a finished run: its metrics); force: start over; progress: a tqdm bar (True),
    plain lines (False), by terminal (None); stop_after: stop as if killed (tests); data:
    prepare(cfg), if made already. Inputs are checked before `out` is written."""
    out = Path(out)
    data = data or prepare(cfg)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, vocab_size=data["tokenizer"].vocab_size))
    # Start: init, batch and mask streams seeded apart; fresh weights and Adam moments.
    rng_init, rng_data, rng_mask = (np.random.default_rng(s)
                                    for s in np.random.SeedSequence(cfg.seed).spawn(3))
    params = init_weights(cfg, rng_init)
    state = adam_init(params)
    saved = config_json(cfg, data, params)
    finished = check_run_dir(out, saved, resume, force)    # a finished run: its metrics
    if finished:
        return finished
    # Resume from the checkpoint (weights, moments, streams, metrics), or begin at step 0.
    first_step, seconds, metrics = begin(out, saved, params, state, (rng_data, rng_mask), resume)
    print(f"[{cfg.objective}] vocabulary {cfg.model.vocab_size} {cfg.tokenizer}, "
          f"{saved['info']['parameters']:,} parameters, photos {saved['info']['photos']}",
          flush=True)

    t_start, t_saved = time.perf_counter() - seconds, time.perf_counter()
    plain = not (os.isatty(2) if progress is None else progress)
    with open(out / "log.jsonl", "ab") as log, tqdm(total=cfg.steps, initial=first_step,
                                                    desc=cfg.objective, disable=plain) as bar:
        # The untrained encoder at step 0, where every curve starts: every split, for the
        # report's untrained row. It draws no random number.
        if first_step == 0:
            record(metrics, evaluate(params, cfg, data, out, 0, ("val", "test", "train")), out)
        for step in range(first_step, cfg.steps):
            if stop_after is not None and step >= stop_after:
                return None
            t0 = time.perf_counter()
            lr = lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
            batch = sample_batch(data["tables"]["train"], cfg.batch_photos, rng_data)
            loss, stats, grad_norm = train_step(params, state, batch, cfg, lr, rng_mask)
            if not (np.isfinite(loss) and np.isfinite(grad_norm)):
                raise record_divergence(out, step + 1, f"loss {loss}, gradient norm {grad_norm}")
            row = {"step": step + 1, **stats, "lr": lr, "grad_norm": float(grad_norm),
                   "seconds": time.perf_counter() - t0}
            log.write((json.dumps(row) + "\n").encode())
            log.flush()
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            bar.update(1)
            if plain and ((step + 1) % 50 == 0 or step == first_step):
                print(f"[{cfg.objective}] step {step + 1}/{cfg.steps} loss {loss:.4f} "
                      f"lr {lr:.2e}", flush=True)
            last = step + 1 == cfg.steps
            if (step + 1) % cfg.eval_every == 0 and not last:
                entry = evaluate(params, cfg, data, out, step + 1, ("val",))
                record(metrics, entry, out)
                bar.write(f"[{cfg.objective}] step {step + 1} val paraphrase R@1 "
                          f"{entry['val']['paraphrase_R@1']:.3f}")
            if ((step + 1) % cfg.eval_every == 0 or last
                    or time.perf_counter() - t_saved >= CHECKPOINT_SECONDS):
                save_checkpoint(out, step + 1, params, state, (rng_data, rng_mask), metrics,
                                log.tell(), time.perf_counter() - t_start)
                t_saved = time.perf_counter()

    # Finish: the final weights, every split embedded, metrics.json with "final".
    savez(out / "model.npz", **params, **{"tokenizer.vocab": np.array(data["tokenizer"].vocab)})
    final = evaluate(params, cfg, data, out, cfg.steps, ("val", "test", "train"))
    wall = time.perf_counter() - t_start
    metrics.update(final=final, wall_seconds=wall, ms_per_step=1000 * wall / cfg.steps)
    record(metrics, final, out)                         # the last evaluation, and "final"
    print(f"[{cfg.objective}] done: test paraphrase R@1 {final['test']['paraphrase_R@1']:.3f} "
          f"(chance {final['test']['chance']:.3f})", flush=True)
    return metrics
