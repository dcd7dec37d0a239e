"""The command line, in one place: python -m minialign {data,train,bench,synthetic,evaluate,
replicate,scaling,report,compare,export,exercises,grade} --help.

Each sub-command is an add_*_args function (its options) and a run_* function (what it does
with them). The training flags are declared once, in flags.TRAIN_FLAGS (from the config
dataclasses); a command lists the fields it exposes, and flags.config_from_args builds its
TrainConfig. Every error is one line, `minialign COMMAND: error: ...`, exit code 2 (a
mistyped flag's line names the closest real one), and so is reaching an exercise a student
copy has not done yet (exercises.py); --help prints the whole usage. SIGTERM
(`kill`, `timeout`, Slurm) stops a command as Ctrl-C does, with the same resume hint.
"""
import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from .. import __file__ as package_file
from ..objectives import OBJECTIVES
from ..train import TrainConfig, prepare, train
from .timing import bench
from .images import bert_vocab, caption_stats, coco, evaluate, export, photos, synthetic
from .experiment import agreement, compare, report, rescore, scaling_report
from . import fastpath
from . import grading
from .course import exercises, grade
from .course import copy as course_copy
from .grid import ablations, replicate, scaling_run, slurm_runs
from .grid.jobs import Terminated, sigterm_interrupts
from .run.machine import available_cores, use_cores
from .run.flags import (CHOICE_FIELDS, Parser, UniqueList, add_config_flags, add_grid_run_flags,
                        config_from_args, nonnegative_int, one_of, positive_float, positive_int)
from .experiment.protocol import (LR_MAX, LR_MIN, LR_PER_DECADE, MAX_EXTENSIONS, OBJECTIVE_ORDER,
                                  SEEDS, Protocol, holds_runs, load_protocol)
from .run.rundir import CHECKPOINT, Diverged

EXIT_DIVERGED = 3   # `train` / `replicate` exit code of a diverged run (2: bad input)
EXIT_NOT_PASSED = 1  # `grade`: some exercise did not pass (the table says which)
EXIT_DISAGREE = 1    # `compare`: a row or metric differs from the reference's, or is missing
EXIT_INTERRUPTED = 128 + signal.SIGINT    # 130: stopped by Ctrl-C, as a shell reports it
EXIT_TERMINATED = 128 + signal.SIGTERM    # 143: stopped by SIGTERM (kill, timeout, Slurm)
RESUME_HINT = {  # after Ctrl-C or SIGTERM: nothing finished is lost, the rest continues
    "train": "rerun the same command with --resume (`make train ... RESUME=1`) to continue from "
             "the last checkpoint (from step 0 if none was saved yet)",
    "data": "rerun the same command: finished steps are skipped",
    "replicate": "rerun the same command: finished runs are skipped, interrupted runs resume "
                 "from their last checkpoint (from step 0 if none was saved yet)",
}
RESUME_HINT["scaling"] = RESUME_HINT["ablations"] = RESUME_HINT["replicate"]
# Which training flags each command exposes (flags.TRAIN_FLAGS: help, type; default: config)
TRAIN_FIELDS = ("steps", "seed", "lr", "batch_photos", "warmup_steps", "weight_decay",
                "mask_rate", "anticollapse_weight", "sim_weight", "var_weight", "cov_weight",
                "anticollapse", "sigreg_weight", "sigreg_directions", "sigreg_t_max",
                "sigreg_points", "eval_every", "split_seed", "d_model", "n_layers", "n_heads",
                "mlp_ratio", "max_len", "layers", "dtype", "tokenizer", "vocab") + CHOICE_FIELDS
REPLICATE_FIELDS = ("steps", "batch_photos", "lr", "warmup_steps", "eval_every", "d_model",
                    "n_layers", "n_heads", "mlp_ratio", "max_len", "anticollapse",
                    "sigreg_weight", "layers", "dtype", "tokenizer", "vocab") + CHOICE_FIELDS
BENCH_FIELDS = ("seed", "batch_photos", "d_model", "n_layers", "n_heads", "mlp_ratio",
                "tokenizer", "vocab")


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help when X says something (not None/False); a
    float as %g: 5.26316, not 5.2631578947368425."""

    def _get_help_string(self, action):
        help = action.help or ""
        if "default" in help or any(action.default is x for x in (None, False, argparse.SUPPRESS)):
            return help
        return help + (" (default: %(default)g)" if isinstance(action.default, float)
                       else " (default: %(default)s)")


# ---------------------------------------------------------------- the commands
def add_train_args(p):
    p.add_argument("--objective", required=True, choices=sorted(OBJECTIVES),
                   help="training objective")
    p.add_argument("--captions", required=True, help="COCO captions JSON (COCO's own format)")
    p.add_argument("--out", required=True, help="run directory to create (must be new or empty)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out directory")
    p.add_argument("--resume", action="store_true",
                   help="continue --out from whatever stage stopped (skip it if finished; "
                        "start it if --out does not exist yet)")
    add_config_flags(p, TRAIN_FIELDS, TrainConfig())
    add_threads_arg(p)


def add_threads_arg(p):
    p.add_argument("--threads", type=positive_int, default=None,
                   help="cores this process computes on, >= 1 (default: every core it may use)")


COMPUTING = ("train", "evaluate", "replicate", "scaling", "report",
             "compare", "ablations")                      # use_threads before they run


def use_threads(args):
    """--threads N: machine.use_cores(N) before any work; unset (or a command without the
    flag): every core (machine.available_cores). Either way numpy's BLAS stays on one thread,
    so no number depends on how many cores computed it (README, Performance)."""
    use_cores(getattr(args, "threads", None) or available_cores())


def run_train(args):
    """Build the config (ValueError for fields that disagree, before --out is touched), train."""
    cfg = config_from_args(args, TrainConfig(), objective=args.objective, captions=args.captions)
    use_threads(args)
    out = Path(args.out).absolute()
    made = [p for p in (out, *out.parents) if not p.exists() and not p.is_symlink()]
    try:
        train(cfg, args.out, force=args.force, resume=args.resume)
    except NotImplementedError as e:     # a student copy's stub, reached before a checkpoint:
        if made and exercises.stub_number(e) and not (out / CHECKPOINT).exists():
            shutil.rmtree(out, ignore_errors=True)    # the run folder this command made goes,
            for parent in made[1:]:                   # and its parents it made, if empty
                if parent.exists() and not any(parent.iterdir()):
                    parent.rmdir()
        elif exercises.stub_number(e) and out.exists():     # what to pass when rerunning
            e.rerun = f"then rerun with --resume ({args.out} holds the run so far)"
        raise


def add_replicate_args(p):
    p.add_argument("--captions", required=True, help="COCO captions JSON")
    p.add_argument("--embeddings", default=evaluate.DEFAULT_EMBEDDINGS,
                   help="frozen DINOv2 image embeddings .npz (`python -m minialign export`)")
    p.add_argument("--image-eval", choices=("on", "off"), default="on",
                   help="off: train text-only when the embeddings do not exist yet")
    replicate.add_rescore_arg(p)
    p.add_argument("--out", required=True, help="results directory, e.g. results/coco")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVE_ORDER), action=UniqueList,
                   choices=sorted(OBJECTIVES), help="objectives, in table order, each once")
    p.add_argument("--seeds", nargs="+", type=nonnegative_int, default=list(SEEDS),
                   action=UniqueList, help="seeds of the seed grid, each once, >= 0; the first "
                   "one also runs the lr search")
    add_config_flags(p, REPLICATE_FIELDS, TrainConfig())
    p.add_argument("--lr-search", choices=("on", "off"), default="on",
                   help="the per-objective lr search on the first seed")
    p.add_argument("--lr-min", type=positive_float, default=LR_MIN,
                   help="search grid's lowest lr, > 0")
    p.add_argument("--lr-max", type=positive_float, default=LR_MAX,
                   help="search grid's highest lr, > --lr-min")
    p.add_argument("--lr-per-decade", type=positive_int, default=LR_PER_DECADE,
                   help="search grid points per factor of 10, >= 1")
    p.add_argument("--max-extensions", type=nonnegative_int, default=MAX_EXTENSIONS,
                   help="grid points the search may add beyond an edge, >= 0")
    add_grid_run_flags(p, "grid", "as many as fit in memory")
    slurm_runs.add_slurm_args(p)


def protocol_from_args(args):
    """The Protocol of parsed add_replicate_args options. Raises ValueError for values that
    disagree with each other (d_model % n_heads, --lr-max <= --lr-min with the search on)."""
    base = config_from_args(args, TrainConfig(), captions=args.captions)
    if args.lr_search == "on" and args.lr_max <= args.lr_min:
        raise ValueError(f"--lr-max {args.lr_max:g} must be greater than --lr-min "
                         f"{args.lr_min:g} (or pass --lr-search off)")
    return Protocol(base=base, objectives=args.objectives, seeds=args.seeds,
                    lr_min=args.lr_min, lr_max=args.lr_max,
                    lr_per_decade=args.lr_per_decade if args.lr_search == "on" else 0,
                    max_extensions=args.max_extensions)


def run_replicate(args):
    slurm_runs.check_slurm_args(args)
    protocol = protocol_from_args(args)
    check_anticollapse(args.out, protocol)
    run = slurm_runs.run_slurm if args.slurm else replicate.run_replicate
    return run(protocol, args)


def check_anticollapse(out, protocol):
    """One results directory, one anti-collapse term: ValueError (one line) if `out` holds runs
    made under another --anticollapse, before anything is read or timed."""
    if (Path(out) / "protocol.json").is_file() and holds_runs(out):
        old, new = load_protocol(out).base.loss.anticollapse, protocol.base.loss.anticollapse
        if old != new:
            raise ValueError(f"{out}: holds runs trained with --anticollapse {old}; --anticollapse "
                             f"{new} needs its own results directory, e.g. --out {out}-{new} "
                             f"(`make ... ANTICOLLAPSE={new}` uses one)")


ABLATION_FIELDS = tuple(f for f in REPLICATE_FIELDS if f not in CHOICE_FIELDS)


def add_ablations_args(p):
    p.add_argument("--captions", required=True, help="captions JSON of the ablated protocol "
                   "(make ablations: the synthetic demo world)")
    p.add_argument("--embeddings", default=evaluate.DEFAULT_EMBEDDINGS,
                   help="image embeddings .npz of those captions")
    p.add_argument("--image-eval", choices=("on", "off"), default="on",
                   help="off: text-side metrics only")
    p.add_argument("--text-captions", default=None,
                   help="real (COCO) captions: the same choices at replicate-quick's size, "
                        "text-side only; skipped with one line when the file is absent")
    p.add_argument("--out", required=True, help="results directory, e.g. results/ablations")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVE_ORDER), action=UniqueList,
                   choices=sorted(OBJECTIVES), help="objectives, in table order, each once")
    p.add_argument("--seeds", nargs="+", type=nonnegative_int, default=list(SEEDS),
                   action=UniqueList, help="seeds of every variant, each once, >= 0")
    add_config_flags(p, ABLATION_FIELDS, TrainConfig())
    p.add_argument("--jobs", type=positive_int, default=available_cores(),
                   help="runs at once, each in its own process, >= 1 (default: one per core)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="cores each run computes on, >= 1 (default: cores // --jobs)")


def run_ablations(args):
    """ablations.run_ablations on the protocol of the flags (no lr search), inputs checked
    first."""
    base = config_from_args(args, TrainConfig(), captions=args.captions)
    protocol = Protocol(base=base, objectives=args.objectives, seeds=args.seeds, lr_per_decade=0)
    prepare(base)                                         # the captions, before anything runs
    emb = replicate.load_image_embeddings(argparse.Namespace(**{**vars(args),
                                                                "command": "ablations"}))
    return ablations.run_ablations(protocol, args, emb)


def add_scaling_args(p):
    scaling_run.add_scaling_args(p)
    slurm_runs.add_slurm_args(p)


def run_scaling(args):
    """scaling_run.run_scaling, or with --slurm the sweep's runs handed to Slurm."""
    slurm_runs.check_slurm_args(args)
    protocol = scaling_run.protocol_from_args(args)
    if args.slurm:
        return slurm_runs.run_slurm(protocol, args, finish=scaling_report.run_report)
    return scaling_run.run_scaling(protocol, args)


def add_bench_args(p):
    p.add_argument("--captions", default=str(bench.DEFAULT_CAPTIONS), help="COCO captions JSON")
    p.add_argument("--timed-steps", type=positive_int, default=bench.TIMED_STEPS,
                   help="timed steps per objective, >= 1")
    p.add_argument("--steps", type=positive_int, dest="timed_steps", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=nonnegative_int, default=bench.WARMUP_STEPS,
                   help="untimed steps first, >= 0")
    p.add_argument("--fixed-length", type=nonnegative_int, default=0, metavar="T",
                   help=f"time {bench.FIXED_CAPTIONS} captions of exactly T random word ids "
                   f"(no padding, 1 <= T <= 64, the model's max_len) instead of COCO batches; 0: "
                   f"COCO batches")
    p.add_argument("--json", action="store_true", help="one JSON object per objective")
    p.add_argument("--unset-openblas-env", action="store_true",
                   help="run the children without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE "
                   "(set on some machines to pin OpenBLAS's kernel and cache size; this shows "
                   "the speed without them)")
    p.add_argument("--only", choices=sorted(OBJECTIVES),
                   help="benchmark one objective in this process (what each child runs)")
    p.add_argument("--layers", dest="layer_sets", type=one_of("both", "fast", "reference"),
                   default="both", metavar="{both,fast,reference}",
                   help="the layer sets to time: both (fast, then reference, per objective), "
                        "or one")
    add_config_flags(p, BENCH_FIELDS, TrainConfig())
    p.add_argument("--gemm-rows", type=positive_int, default=bench.GEMM_ROWS,
                   help="rows of the peak GEMMs, >= 1")
    p.add_argument("--gemm-square", type=positive_int, default=bench.GEMM_SQUARE,
                   help="size of the square peak GEMM, >= 1")
    add_threads_arg(p)


def run_bench(args):
    cfg = config_from_args(args, TrainConfig(), captions=args.captions)  # before any child
    if not fastpath.PRESENT:
        raise ValueError("a student copy has no fast path to time (docs/course.md, \"What the "
                         "student copy holds\"): run bench in the repository")
    use_threads(args)
    return bench.run_bench(args, cfg)


def add_evaluate_args(p):
    p.add_argument("--run", action="append", required=True, metavar="DIR",
                   help="run directory written by `train`; repeat for several runs")
    p.add_argument("--embeddings", default=None, metavar="PATH",
                   help=f"frozen image embeddings .npz, e.g. {evaluate.DEFAULT_EMBEDDINGS}; if "
                        "omitted, only text-side metrics are printed; if given, it must exist")
    p.add_argument("--json", action="store_true",
                   help="print a machine-readable JSON summary instead of the table")
    p.add_argument("--rescore", action="store_true",
                   help="replace image scores a run holds from ANOTHER embeddings file "
                        "(without it: refused, naming both files)")
    add_wait_arg(p)


def add_wait_arg(p):
    p.add_argument("--wait", action="store_true",
                   help="wait for a run another minialign command is writing (training, "
                        "scoring) instead of stopping with one line that names it")


def run_evaluate(args):
    return evaluate.evaluate_runs(args.run, args.embeddings, args.json, args.rescore, args.wait)


def add_report_args(p):
    p.add_argument("results_dir", nargs="+", help="a directory written by `python -m minialign "
                   "replicate` or `scaling`; two or more: a side-by-side table of them (e.g. "
                   "--anticollapse vicreg and sigreg), printed and written to --out")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="with two or more directories: where the side-by-side table goes "
                        "(default: compare_<A>_<B>.md beside the first directory)")
    add_wait_arg(p)


def run_report(args):
    """compare.run_compare for several directories; else report.run_report, or
    scaling_report.run_report for a sweep's directory."""
    if len(args.results_dir) > 1:
        return compare.run_compare(args.results_dir, args.out)
    if args.out is not None:
        raise ValueError("--out: only for a side-by-side table of two or more directories")
    out = Path(args.results_dir[0])
    if (out / "protocol.json").is_file():           # stale image scores: scored again first
        rescore.rescore_stale(out, args.wait)
    if (out / "protocol.json").is_file() and load_protocol(out).kind == "scaling":
        return scaling_report.run_report(out)
    return report.run_report(out)


def add_synthetic_args(p):
    p.add_argument("--out", help="directory for the two SYNTHETIC files (needed unless --stats)")
    p.add_argument("--world", choices=sorted(synthetic.WORLDS), default=synthetic.DEFAULT_WORLD,
                   help="v2: captions are partial views, calibrated to COCO's caption "
                        "statistics; v1: the world before #22 (complete paraphrases)")
    p.add_argument("--n-scenes", type=positive_int, default=2000,
                   help="scenes (photos) to write, >= 1")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="scene and caption seed, >= 0")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--stats", action="store_true",
                   help="print the world's caption statistics (caption_stats.py) beside COCO "
                        "val2017's; with --out, of the files written")
    p.add_argument("--compare", metavar="COCO_JSON",
                   help="with --stats: measure this COCO captions file instead of using the "
                        "recorded COCO val2017 values")


def run_synthetic(args):
    """Write the world's two files (--out), and/or print its caption statistics (--stats)."""
    if args.out is None and not args.stats:
        raise ValueError("--out is required (or --stats, to print the statistics only)")
    if args.compare and not args.stats:
        raise ValueError("--compare: only with --stats")
    if args.out is not None:
        paths = synthetic.write_world(args.out, args.n_scenes, args.seed, args.force,
                                      world=args.world)
        for path in paths:
            print(f"wrote {path} (SYNTHETIC minialign world, not COCO)")
    if args.stats:
        print(synthetic_stats(args))


def synthetic_stats(args):
    """The statistics table of `synthetic --stats`: the world's column beside COCO's (measured
    from --compare, else caption_stats.COCO_VAL2017), and the bands' verdict."""
    if args.out is not None:
        world = caption_stats.statistics_of_file(Path(args.out) / synthetic.CAPTIONS_NAME)
    else:                                # the files `--out` would write, read as training does
        with tempfile.TemporaryDirectory() as tmp:
            captions, _ = synthetic.write_world(tmp, args.n_scenes, args.seed, world=args.world)
            world = caption_stats.statistics_of_file(captions)
    coco, name = caption_stats.COCO_VAL2017, "COCO val2017 (recorded)"
    if args.compare:
        coco, name = caption_stats.statistics_of_file(args.compare), args.compare
    table = caption_stats.format_statistics({name: coco, f"world {args.world}, "
                                             f"{args.n_scenes} scenes, seed {args.seed}": world})
    outside = caption_stats.outside_bands(world, coco)
    verdict = ("every statistic within the bands (within 20% of COCO's; random-pair Jaccard "
               f"<= {caption_stats.RANDOM_JACCARD_MAX})" if not outside else
               "outside the bands: " + "; ".join(outside))
    return f"{table}\n{verdict}"


def add_data_args(p):
    p.add_argument("--root", type=Path, default=Path("coco"), help="folder for everything COCO")
    p.add_argument("--num-photos", type=positive_int, default=10000,
                   help="photos in the subset, >= 1")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the subset, >= 0")
    p.add_argument("--images", action=argparse.BooleanOptionalAction, default=True,
                   help="download the subset's photos into ROOT/train2017 (needed once by "
                        "`make embeddings`)")
    p.add_argument("--workers", type=positive_int, default=8, help="parallel photo downloads")
    p.add_argument("--annotations-url", default=coco.ANNOTATIONS_URL,
                   help="where annotations_trainval2017.zip is downloaded from; checked "
                        f"whole before extraction: {coco.ANNOTATIONS_SIZE} bytes, sha256 "
                        f"{coco.ANNOTATIONS_SHA256} (if the host stops answering: "
                        "https://s3.amazonaws.com/images.cocodataset.org/annotations/"
                        "annotations_trainval2017.zip)")
    p.add_argument("--images-url", default=photos.IMAGES_URL,
                   help="photos are fetched from this + the path of their coco_url, e.g. "
                        "train2017/000000000009.jpg (alternative: "
                        "https://s3.amazonaws.com/images.cocodataset.org/)")
    p.add_argument("--vocab-url", default=bert_vocab.VOCAB_URL,
                   help=f"where BERT's uncased WordPiece vocabulary (--tokenizer wordpiece) is "
                        f"downloaded from, to ROOT/{bert_vocab.VOCAB_NAME}; checked: sha256 "
                        f"{bert_vocab.VOCAB_SHA256}")
    p.add_argument("--allow-http", action="store_true",
                   help="accept plain http:// URLs (unauthenticated) in --annotations-url, "
                        "--images-url and --vocab-url; the zip's sha256 is checked all the same")
    p.add_argument("--force", action="store_true",
                   help="replace a subset file that was made with other settings")


def run_data(args):
    coco.run_data(args.root, args.num_photos, args.seed, args.images, args.workers,
                  args.annotations_url, args.force, args.images_url, args.allow_http,
                  args.vocab_url)


def add_export_args(p):
    p.add_argument("--captions", type=Path, required=True,
                   help="COCO captions JSON, e.g. annotations/captions_val2017.json")
    p.add_argument("--images", type=Path, required=True,
                   help="folder of that split's images, e.g. val2017/")
    p.add_argument("--model", default=export.DEFAULT_MODEL,
                   help="Hugging Face DINOv2 name or local folder")
    p.add_argument("--revision", default=export.DEFAULT_REVISION,
                   help="the commit of the model's Hub repository to load, recorded in the "
                        f"file's meta (as pinned: {export.DEFAULT_MODEL}'s 2023-07-18 release); "
                        "safetensors weights only, no remote code")
    p.add_argument("--out", type=Path, required=True,
                   help="output .npz, e.g. embeddings/coco_val2017_dinov2-base.npz")
    p.add_argument("--batch-size", type=positive_int, default=32,
                   help="images per forward pass, >= 1")
    p.add_argument("--device", default="cpu",
                   help="torch device: cpu, cuda (needs a CUDA build of torch), mps")
    p.add_argument("--num-photos", type=positive_int, default=None,
                   help="embed a seeded random subset of this many captioned photos")
    p.add_argument("--seed", type=nonnegative_int, default=0,
                   help="seed of the --num-photos subset, >= 0")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    return p


def run_export(args):
    return export.run_export(args.captions, args.images, args.out, model_name=args.model,
                             revision=args.revision, batch_size=args.batch_size, device=args.device,
                             num_photos=args.num_photos, seed=args.seed, force=args.force)


def add_exercises_args(p):
    p.add_argument("out", nargs="?", metavar="OUT",
                   help="where the student copy goes: a new or empty directory outside the "
                        "repository; with --restore, an existing copy")
    p.add_argument("--solved", nargs="+", type=positive_int, default=[], action=UniqueList,
                   metavar="N", help="exercises to leave solved in the copy, each once")
    p.add_argument("--restore", nargs="+", default=None, metavar="N",
                   help="put the reference bodies of exercises N ... back into the existing "
                   "copy OUT (the rest of it stays as it is): --restore 1 4 OUT")
    p.add_argument("--student", metavar="ID", help=f"the student's id, written to OUT/"
                   f"{course_copy.STUDENT_FILE} (grade reads it)")
    p.add_argument("--list", action="store_true", help="only list the exercises, write nothing")


def run_exercises(args):
    out, restore = args.out, args.restore
    if restore and out is None and not restore[-1].isdigit():   # --restore 1 4 OUT
        out, restore = restore[-1], restore[:-1]
    if restore is not None:
        bad = [n for n in restore if not (n.isdigit() and int(n) >= 1)]
        if bad or not restore or len(set(restore)) < len(restore):
            raise ValueError(f"--restore: exercise numbers >= 1, each once, then OUT; got "
                             f"{' '.join(args.restore)}")
        restore = [int(n) for n in restore]
    exercises.run_exercises(out, args.solved, args.list, restore=restore, student=args.student)


COMMANDS = {  # name: (help, add_args, run), in --help's order
    "data": ("one-time: COCO 2017 captions, the replication's 10,000-photo subset, BERT's "
             "WordPiece vocabulary and the subset's photos", add_data_args, run_data),
    "train": ("train a text encoder with one objective on COCO captions", add_train_args,
              run_train),
    "bench": ("time training steps of each objective against numpy's GEMM peak",
              add_bench_args, run_bench),
    "synthetic": ("write a small SYNTHETIC world (COCO-format captions + embeddings .npz)",
                  add_synthetic_args, run_synthetic),
    "evaluate": ("score saved runs: text-side metrics, and image alignment given --embeddings",
                 add_evaluate_args, run_evaluate),
    "replicate": ("the replication grid: objectives x seeds, lr search, results table",
                  add_replicate_args, run_replicate),
    "scaling": ("the scaling sweep: encoder sizes x objectives x seeds, gap vs parameters",
                add_scaling_args, run_scaling),
    "ablations": ("each choice the replication's write-up leaves unsaid, flipped alone: one "
                  "table of its effect (docs/protocol.md)", add_ablations_args, run_ablations),
    "report": ("rebuild results.md and the figures from saved runs; several directories: "
               "side by side", add_report_args,
               run_report),
    "compare": ("does a table agree with the repository's demo within the seeds' spread; "
                "--export / --table: the docs' demo table", agreement.add_args, agreement.run),
    "export": ("one-time: COCO images -> frozen DINOv2 embeddings (.npz); needs the [export] "
               "extra", add_export_args, run_export),
    "exercises": ("the course kit: a student copy of this repository with every exercise "
                  "blanked (docs/course.md)", add_exercises_args, run_exercises),
    "grade": ("the course kit: each exercise's own tests, one row per exercise",
              grading.add_grade_args, grading.run_grade),
}


def parser():
    top = Parser(
        prog="python -m minialign",
        description="Good views vs next-token prediction for text-image alignment, in NumPy.")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help, add_args, _) in COMMANDS.items():
        add_args(sub.add_parser(name, help=help, description=help,
                                formatter_class=DefaultsFormatter))
    top.commands = sub.choices                     # {name: its parser}, for parse_args
    return top


def check_copy(command):
    """Every command but grade (which finds its copy itself) and exercises (run from the
    repository) refuses in one line when the working directory is in a copy whose minialign
    is not the one imported (copy.check_imported)."""
    if command not in ("grade", "exercises"):
        course_copy.check_imported(Path(package_file))


def run_command(args):
    """COMMANDS[args.command]'s run; meanwhile SIGTERM raises jobs.Terminated, a
    KeyboardInterrupt, so it stops the clean way Ctrl-C does."""
    with sigterm_interrupts():
        check_copy(args.command)
        if args.command in COMPUTING:
            use_threads(args)
        COMMANDS[args.command][2](args)


def main(argv=None):
    """Parse, run the command; returns the exit code (0, 1 an exercise not passed or a table
    that does not agree, 2 bad input or an exercise not done, 3 diverged, 130 Ctrl-C, 143
    SIGTERM). A bad flag exits at once with code 2 (SystemExit, one line)."""
    args = parser().parse_args(argv)
    try:
        run_command(args)
    except Diverged as e:                            # the run's own outcome, recorded on disk
        print(f"minialign {args.command}: {e}", file=sys.stderr)   # e says "diverged"
        return EXIT_DIVERGED
    except grade.NotAllPassed:                       # grade printed which
        return EXIT_NOT_PASSED
    except agreement.Disagree:                       # compare printed which
        return EXIT_DISAGREE
    except BrokenPipeError:                          # stdout closed: __main__ ends quietly
        raise
    except (OSError, ValueError, ImportError) as e:   # bad input: one clear line, exit 2
        print(f"minialign {args.command}: error: {e}", file=sys.stderr)
        return 2
    except NotImplementedError as e:                 # an exercise's stub, in a student copy
        todo = exercises.unfinished(e)
        if todo is None:
            raise
        rerun = getattr(e, "rerun", None)
        print(f"minialign {args.command}: {todo}" + (f"; {rerun}" if rerun else ""),
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:                # Ctrl-C, or SIGTERM (Terminated)
        how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
        hint = ("a dry run writes nothing; rerun it to estimate again"
                if getattr(args, "dry_run", False) else RESUME_HINT.get(args.command, ""))
        print(f"minialign {args.command}: {how}; {hint}".rstrip("; "), file=sys.stderr)
        return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED
    return 0
