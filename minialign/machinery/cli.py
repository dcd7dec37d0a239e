"""The command line: `python -m minialign COMMAND --help`. Plain argparse: a bad flag is one
line and exit 2; a bad input file is one line naming it and exit 2, before anything is
written. Exit codes: 0 done, 1 a table that does not agree or an exercise not passed, 2 bad
input, 3 a run diverged, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."""
import argparse
import contextlib
import ctypes
import math
import os
import signal
import sys


def at_least(low, kind=int, below=math.inf):
    def number(text):                  # not a number: kind's ValueError, argparse's own message
        if not low <= (value := kind(text)) < below:                          # nan too
            raise argparse.ArgumentTypeError(f"{text} must be in [{low:g}, {below:g})")
        return value
    return number


def keep_freed_memory():
    """glibc keeps freed memory: a step frees and maps again the same large arrays otherwise."""
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)                                # M_MMAP_MAX: no mmap per array
        libc.mallopt(-1, 2**30)                            # M_TRIM_THRESHOLD: keep 1 GB


POSITIVE = {"steps", "batch_photos", "eval_every", "min_count", "max_len", "d_model",
            "n_layers", "n_heads", "mlp_ratio"}
CHOICES = {"layers": ("fast", "reference"), "dtype": ("float32", "float64"),
           "tokenizer": ("words", "wordpiece")}
HELP = {"captions": "captions: .csv, .jsonl or COCO .json"}


def add_config_flags(p, skip=()):
    """One flag per config field (--d-model, --mask-rate, ...), default the replication's."""
    from .runs import config_fields
    from .variants import OBJECTIVES        # the three, and the named variants
    for name, (_, default) in config_fields().items():
        kind = (at_least(0.0, float, 1) if name in ("mask_rate", "min_lr_ratio") else
                at_least(1) if name in POSITIVE else at_least(0) if isinstance(default, int)
                else at_least(0.0, float) if isinstance(default, float) else str)
        if name not in skip:
            p.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                           choices=list(OBJECTIVES) if name == "objective" else CHOICES.get(name),
                           required=name == "captions",
                           help=HELP.get(name, f"(default: {default})"))


def config_from_args(args, **fixed):
    from ..train import ModelConfig, ObjectiveConfig, TrainConfig
    from .runs import config_fields
    fields = config_fields()
    given = {**{k: v for k, v in vars(args).items() if k in fields}, **fixed}
    if given.get("tokenizer") == "wordpiece" and not given.get("vocab"):
        given["vocab"] = "coco/bert-base-uncased-vocab.txt"    # where `make data` puts it
    part = lambda cls: {k: v for k, v in given.items() if fields[k][0] is cls}
    return TrainConfig(**part(TrainConfig), model=ModelConfig(**part(ModelConfig)),
                       loss=ObjectiveConfig(**part(ObjectiveConfig)))


def cmd_train(p):
    from .runs import cores
    p.add_argument("--out", required=True, help="the run directory")
    add_config_flags(p)
    how = p.add_mutually_exclusive_group()
    how.add_argument("--resume", action="store_true", help="continue the run in --out")
    how.add_argument("--force", action="store_true", help="start the run in --out over")
    p.add_argument("--threads", type=at_least(1), default=cores(), help="(default: the cores)")

    def run(args):
        from ..train import prepare, train
        from .runs import lock
        cfg = config_from_args(args)
        if cfg.model.layers == "fast":
            from . import fast
            fast.set_threads(args.threads)
        data = prepare(cfg)                            # every input checked before --out
        with lock(args.out):
            train(cfg, args.out, resume=args.resume, force=args.force, data=data)
    return run


def cmd_data(p):
    from . import coco
    p.add_argument("--root", default="coco", help="folder for everything COCO")
    p.add_argument("--num-photos", type=at_least(1), default=10000, help="photos in the subset")
    p.add_argument("--seed", type=at_least(0), default=0, help="seed of the subset")
    p.add_argument("--images", action=argparse.BooleanOptionalAction, default=True,
                   help="download the subset's photos too (for `make embeddings`)")
    p.add_argument("--workers", type=at_least(1), default=8, help="parallel photo downloads")
    p.add_argument("--annotations-url", default=coco.ANNOTATIONS_URL, help="sha256 checked")
    p.add_argument("--images-url", default=coco.IMAGES_URL, help="photos: this + their path")
    p.add_argument("--vocab-url", default=coco.VOCAB_URL, help="BERT's vocabulary, sha256 checked")
    p.add_argument("--force", action="store_true", help="write the subset file again")
    return lambda a: coco.run_data(a.root, a.num_photos, a.seed, a.images, a.workers,
                                   a.annotations_url, a.images_url, a.vocab_url, force=a.force)


def cmd_export(p):
    from . import export
    p.add_argument("--captions", required=True, help="the photos' COCO captions JSON")
    p.add_argument("--images", required=True, help="the folder of their images")
    p.add_argument("--out", required=True, help="the embeddings .npz to write")
    p.add_argument("--model", default=export.DEFAULT_MODEL, help="Hugging Face name or folder")
    p.add_argument("--revision", default=export.DEFAULT_REVISION, help="the pinned commit")
    p.add_argument("--batch-size", type=at_least(1), default=32)
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, mps")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    return lambda a: export.run_export(a.captions, a.images, a.out, a.model, a.revision,
                                       a.batch_size, a.device, a.force)


def cmd_synthetic(p):
    from . import synthetic
    p.add_argument("--out", required=True, help="folder for the world's two files")
    p.add_argument("--n-scenes", type=at_least(1), default=2000, help="photos (scenes)")
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument("--force", action="store_true", help="overwrite the world's files")

    def run(a):
        for path in synthetic.write_world(a.out, a.n_scenes, a.seed, a.force):
            print(f"wrote {path} (SYNTHETIC minialign world, not COCO)")
    return run


def cmd_exercises(p):
    from . import course
    p.add_argument("out", nargs="?", help="the student copy: a new or empty folder")
    p.add_argument("--solved", nargs="+", type=int, default=(), metavar="N")
    p.add_argument("--restore", nargs="*", type=int, metavar="N", help="default: all")
    p.add_argument("--list", action="store_true", help="list the exercises, write nothing")

    def run(a):
        if a.list or a.out is None:
            for e in course.list_exercises():
                print(f"{e.number:>2}  {e.title:<32} {e.path}:{e.start + 1}")
        elif a.restore is not None:
            for path in course.restore(a.out, a.restore or None):
                print(f"restored {path}")
        else:
            exercises, n_files = course.write_copy(a.out, a.solved)
            print(f"wrote {a.out}: {n_files} files, {len(exercises)} exercises "
                  f"({len(a.solved)} left solved); docs/course.md says what comes next")
    return run


def cmd_grade(p):
    from . import course
    p.add_argument("numbers", nargs="*", type=at_least(1), metavar="N", help="default: all")
    p.add_argument("--class", dest="folder", required=True, help="grade every copy in this "
                   "folder (a subfolder a student) against the repository's solutions")
    p.add_argument("--out", help="the CSV (default: FOLDER/grades.csv)")
    p.add_argument("--timeout", type=at_least(1.0, float), default=course.TIMEOUT,
                   help="seconds for each exercise of each copy")
    p.add_argument("--seed", type=at_least(0), help="the inputs' seed (default: a new one)")
    return lambda a: course.grade_class(a.folder, a.out, a.numbers or None, a.timeout,
                                        seed=a.seed) and None


def cmd_replicate(p, sweep=False):
    from . import grid
    p.add_argument("--out", required=True, help="the results directory")
    p.add_argument("--embeddings", help="the image embeddings .npz (none: text side only)")
    p.add_argument("--objectives", nargs="+", default=grid.OBJECTIVES, metavar="NAME")
    p.add_argument("--seeds", nargs="+", type=at_least(0), default=grid.SEEDS, metavar="S")
    add_config_flags(p, skip=("objective", "seed"))
    if sweep:
        p.add_argument("--widths", nargs="+", type=at_least(1), default=grid.WIDTHS)
        p.add_argument("--depths", nargs="+", type=at_least(1), default=grid.DEPTHS)
        p.add_argument("--grid", choices=("plus", "cross"), default="plus",
                       help="plus: widths at the center's depth and depths at its width")
        p.add_argument("--center", nargs=2, type=at_least(1), default=grid.CENTER,
                       metavar=("D", "L"))
    else:
        p.add_argument("--lr-min", type=at_least(0.0, float), default=1e-4, help="(default: 1e-4)")
        p.add_argument("--lr-max", type=at_least(0.0, float), default=1e-2, help="(default: 1e-2)")
        p.add_argument("--lr-per-decade", type=at_least(0), default=2, help="0: no lr search")
    p.add_argument("--jobs", type=at_least(1), help="runs at once (default: one per core)")
    p.add_argument("--dry-run", action="store_true", help="say how long it takes, write nothing")
    p.add_argument("--slurm", action="store_true", help="print an sbatch array script instead")

    def run(a):
        base = config_from_args(a)
        kw = (dict(lr_per_decade=0, sizes=grid.sweep_sizes(a.widths, a.depths, a.grid, a.center))
              if sweep else dict(lr_min=a.lr_min, lr_max=a.lr_max, lr_per_decade=a.lr_per_decade))
        protocol = grid.Protocol(base, a.objectives, a.seeds, **kw)
        if a.slurm:
            print(grid.slurm_script(protocol, a.out, a.embeddings), end="")
        else:
            grid.replicate(protocol, a.out, a.jobs, a.embeddings, a.dry_run)
            if not a.dry_run:
                from . import report
                report.write_report(a.out, a.embeddings)
    return run


def cmd_evaluate(p):
    from . import images
    p.add_argument("--run", nargs="+", required=True, metavar="DIR", dest="runs", help="train runs")
    p.add_argument("--embeddings", help="image embeddings .npz: the image columns")
    return lambda a: images.run_evaluate(a.runs, a.embeddings) and None


def cmd_report(p):
    from . import report
    p.add_argument("out", help="the results directory")
    p.add_argument("--embeddings", help="image embeddings .npz (default: the grid's)")
    return lambda a: report.write_report(a.out, a.embeddings) and None


def cmd_compare(p):
    from . import report
    p.add_argument("results", help="a results directory or its results.json")
    p.add_argument("--against", help="the table to agree with (default: docs/demo/results.json)")
    return lambda a: int(not report.compare(a.results, a.against))


COMMANDS = {
    "data": ("one-time: COCO captions, a 10,000-photo subset, BERT's vocabulary", cmd_data),
    "export": ("one-time: photos -> DINOv2 embeddings (the [export] extra)", cmd_export),
    "synthetic": ("a SYNTHETIC world: COCO-format captions + image embeddings", cmd_synthetic),
    "train": ("train a text encoder with one objective", cmd_train),
    "replicate": ("the grid: objectives x seeds, the lr search, the results", cmd_replicate),
    "scaling": ("the scaling sweep: sizes x objectives x seeds", lambda p: cmd_replicate(p, True)),
    "evaluate": ("score train runs (image alignment given --embeddings)", cmd_evaluate),
    "report": ("write results.md, results.json and the figures of OUT", cmd_report),
    "compare": ("does a results table agree with the demo within the seeds' spread", cmd_compare),
    "exercises": ("the course kit: a student copy with every exercise blanked", cmd_exercises),
    "grade": ("the course kit: a class's copies against the solutions, into one CSV", cmd_grade),
}


def parser(command=None):
    """The parser; with `command`, only that command's flags are built (and its modules
    imported): `grade` in a student copy must not import a student's unfinished file."""
    top = argparse.ArgumentParser(prog="python -m minialign", description=
                                  "Good views vs next-token prediction for text-image alignment.")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help, build) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        if command in (None, name):
            p.set_defaults(run=build(p))
    return top


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be, so a run stops the same clean way."""


def terminate(signum, frame):
    raise Terminated()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None      # None: argparse's error
    signal.signal(signal.SIGTERM, terminate)
    keep_freed_memory()
    try:
        args = parser(command).parse_args(argv)     # imports: a student's file may not parse
        return args.run(args) or 0
    except FloatingPointError as e:                    # checkpoint.Diverged
        print(f"minialign {command}: {e}", file=sys.stderr)
        return 3
    except BrokenPipeError:                            # `... | head`: end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (OSError, ValueError, ImportError, NotImplementedError, SyntaxError) as e:
        how = "not done yet" if isinstance(e, NotImplementedError) else "error"  # an exercise
        print(f"minialign {command}: {how}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a second signal: no traceback
        how, code = ("terminated", 143) if isinstance(stop, Terminated) else ("interrupted", 130)
        again = "with --resume" if command == "train" else "the same command"
        print(f"minialign {command}: {how}; rerun {again} to continue from the last "
              f"checkpoint", file=sys.stderr)
        return code
