"""Command line: python -m minialign {train,bench,export,...} --help."""
import argparse
import ctypes
import sys


RESUME_HINT = {  # what to do after Ctrl-C: nothing finished is lost, the rest continues
    "train": "rerun the same command with --resume to continue from the last checkpoint",
    "data": "rerun the same command: finished steps are skipped",
    "replicate": "rerun the same command: finished runs are skipped, the interrupted one "
                 "continues from its last checkpoint",
}


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help when X says something (not None/False)."""

    def _get_help_string(self, action):
        help = action.help or ""
        if "default" in help or any(action.default is x for x in (None, False, argparse.SUPPRESS)):
            return help
        return help + " (default: %(default)s)"


def keep_freed_memory():
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS.
    Each training step allocates and frees the same large activations; by default glibc maps
    every array over 32 MB afresh and unmaps it when freed, and touching new pages costs far
    more than the arithmetic (a page fault per 4 KB). Process-wide, so called once at the
    entry point (here, and in bench's child processes). No effect outside glibc (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4                                 # from glibc's malloc.h
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**30))


def main(argv=None):
    from . import train
    from .machinery import bench, coco, evaluate, replicate, report, synthetic, train_cli
    parser = argparse.ArgumentParser(
        prog="python -m minialign",
        description="Good views vs next-token prediction for text-image alignment, in NumPy.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {}

    def command(name, help, add_args, run):
        add_args(sub.add_parser(name, help=help, description=help,
                                formatter_class=DefaultsFormatter))
        commands[name] = run

    command("data", "one-time: COCO 2017 captions, the replication's 10,000-photo subset and "
            "its photos",
            coco.add_data_args, coco.run_data)
    command("train", "train a text encoder with one objective on COCO captions",
            train_cli.add_train_args, train_cli.run_train)
    command("bench", "time training steps of each objective against numpy's GEMM peak",
            bench.add_bench_args, bench.run_bench)
    command("synthetic", "write a small SYNTHETIC world (COCO-format captions + embeddings .npz)",
            synthetic.add_synthetic_args, synthetic.run_synthetic)
    command("evaluate", "score saved runs: text-side metrics, and image alignment given --embeddings",
            evaluate.add_evaluate_args, evaluate.run_evaluate)
    command("replicate", "the replication grid: objectives x seeds, lr search, results table",
            replicate.add_replicate_args, replicate.run_replicate)
    command("report", "rebuild results.md and the figures from saved runs",
            report.add_report_args, report.run_report)
    try:
        from .machinery import export
        command("export", "one-time: COCO images -> frozen DINOv2 embeddings (.npz); "
                "needs the [export] extra", export.add_export_args, export.run_export)
    except ImportError:
        pass
    args = parser.parse_args(argv)
    keep_freed_memory()
    try:
        commands[args.command](args)
    except train.Diverged as e:                      # the run's own outcome, recorded on disk
        print(f"minialign {args.command}: diverged: {e}", file=sys.stderr)
        return train.EXIT_DIVERGED
    except (OSError, ValueError, ImportError) as e:   # bad input: one clear line, exit 2
        print(f"minialign {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"minialign {args.command}: interrupted; {RESUME_HINT.get(args.command, '')}"
              .rstrip("; "), file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
