"""argparse `type=` functions that refuse a nonsense flag value on the command line, before
anything is read or written, with argparse's own one-line error and the valid range:

    python -m minialign train: error: argument --steps: must be an integer >= 1, got '0'

The dataclasses (train.TrainConfig, model.ModelConfig) check the same ranges again, so the
Python API refuses them too; a check across two flags (d_model % n_heads) is theirs alone.
Numpy-free, and imported by the sub-commands' add_*_args functions only.
"""
import argparse
import math


def int_at_least(low):
    """A `type=` function: an integer >= low, else argparse's error naming the range."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    parse.__name__ = f"int_at_least_{low}"        # argparse quotes it in some messages
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def _float(text, expected):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
    return value


def positive_float(text):
    """A finite float > 0 (learning rates)."""
    value = _float(text, "a number > 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def nonnegative_float(text):
    """A finite float >= 0 (weight decay, loss weights)."""
    value = _float(text, "a number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def fraction_in_0_1(text):
    """A float in [0, 1): a probability that must leave something (the mask rate)."""
    value = _float(text, "a number in [0, 1)")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


class UniqueList(argparse.Action):
    """For nargs="+": refuses a value given twice (`--seeds 0 0`) with argparse's error."""

    def __call__(self, parser, namespace, values, option_string=None):
        repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
        if repeated:
            parser.error(f"argument {option_string}: each value at most once, "
                         f"{', '.join(map(str, repeated))} repeated")
        setattr(namespace, self.dest, list(values))


def check_heads_divide_width(args):
    """The one check across two flags: --d-model must split evenly into --n-heads heads.
    Raises ValueError naming both flags (the CLI prints it as one line, exit code 2)."""
    if args.d_model % args.n_heads:
        raise ValueError(f"--d-model {args.d_model} is not divisible by --n-heads "
                         f"{args.n_heads} (each head gets d_model / n_heads dimensions)")
