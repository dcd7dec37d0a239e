"""The `train` command line: its options (every TrainConfig field people change) and the
command that builds the config from them and trains (train.train)."""
from .flags import (check_heads_divide_width, fraction_in_0_1, int_at_least, nonnegative_float,
                    nonnegative_int, positive_float, positive_int)
from ..model import MIN_MAX_LEN, ModelConfig
from ..objectives import OBJECTIVES, ObjectiveConfig
from ..train import TrainConfig, train


def add_train_args(p):
    """The `train` sub-command's options (every TrainConfig field people change). A value out
    of its range (flags.py) is argparse's one-line error and exit code 2, before any file is
    read or written."""
    d = TrainConfig()
    p.add_argument("--objective", required=True, choices=sorted(OBJECTIVES),
                   help="training objective")
    p.add_argument("--captions", required=True, help="COCO captions JSON (COCO's own format)")
    p.add_argument("--out", required=True, help="run directory to create (must be new or empty)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out directory")
    p.add_argument("--resume", action="store_true",
                   help="continue --out from whatever stage stopped (skip it if finished; "
                        "start it if --out does not exist yet)")
    p.add_argument("--steps", type=positive_int, default=d.steps,
                   help="optimizer steps, >= 1 (default %(default)s)")
    p.add_argument("--seed", type=nonnegative_int, default=d.seed,
                   help="init/batch/mask seed, >= 0 (default %(default)s)")
    p.add_argument("--lr", type=positive_float, default=d.lr,
                   help="peak learning rate, > 0 (default %(default)s)")
    p.add_argument("--batch-photos", type=int_at_least(2), default=d.batch_photos,
                   help="photos per step, two captions each, >= 2 (default %(default)s)")
    p.add_argument("--warmup-steps", type=nonnegative_int, default=d.warmup_steps,
                   help="linear warm-up steps before the cosine decay; keep it below --steps "
                        "(default %(default)s)")
    p.add_argument("--weight-decay", type=nonnegative_float, default=d.weight_decay,
                   help=">= 0 (default %(default)s)")
    p.add_argument("--mask-rate", type=fraction_in_0_1, default=d.loss.mask_rate,
                   help="bad_views: word masking probability, in [0, 1) (default %(default)s)")
    p.add_argument("--anticollapse-weight", type=nonnegative_float,
                   default=d.loss.anticollapse_weight, help="next_token: weight on VICReg var+cov, >= 0 (default %(default)s)")
    for name, what in (("sim_weight", "invariance (lambda)"), ("var_weight", "variance (mu)"),
                       ("cov_weight", "covariance (nu)")):
        p.add_argument("--" + name.replace("_", "-"), type=nonnegative_float,
                       default=getattr(d.loss, name), help=f"VICReg {what} weight, >= 0; variance "
                       f"and covariance 0 let the embeddings collapse (default %(default)s)")
    p.add_argument("--eval-every", type=positive_int, default=d.eval_every,
                   help="steps between val evaluations, saved caption embeddings and checkpoints "
                        "(default %(default)s)")
    p.add_argument("--split-seed", type=nonnegative_int, default=d.split_seed,
                   help="photo split seed, independent of --seed (default %(default)s)")
    for name in ("d_model", "n_layers", "n_heads", "mlp_ratio", "max_len"):
        p.add_argument("--" + name.replace("_", "-"),
                       type=int_at_least(MIN_MAX_LEN) if name == "max_len" else positive_int,
                       default=getattr(d.model, name), help="model size (default %(default)s)")


def run_train(args):
    """Build the config (ValueError for fields that disagree, e.g. d_model % n_heads != 0,
    before --out is touched), then train."""
    check_heads_divide_width(args)
    model = ModelConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                        mlp_ratio=args.mlp_ratio, max_len=args.max_len)
    cfg = TrainConfig(objective=args.objective, captions=args.captions, steps=args.steps,
                      seed=args.seed, lr=args.lr, batch_photos=args.batch_photos,
                      warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
                      eval_every=args.eval_every, split_seed=args.split_seed, model=model,
                      loss=ObjectiveConfig(mask_rate=args.mask_rate, sim_weight=args.sim_weight,
                                           var_weight=args.var_weight, cov_weight=args.cov_weight,
                                           anticollapse_weight=args.anticollapse_weight))
    train(cfg, args.out, force=args.force, resume=args.resume)
