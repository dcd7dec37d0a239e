"""argparse `type=` functions that refuse a nonsense flag value on the command line, before
anything is read or written, with one line (Parser: no usage block) naming the valid range:

    minialign train: error: argument --steps: must be an integer >= 1, got '0'
    minialign train: error: unrecognized arguments: --stpes (did you mean --steps?)

The dataclasses (train.TrainConfig, model.ModelConfig, objectives.ObjectiveConfig) check the
same ranges again, so the Python API refuses them too. TRAIN_FLAGS declares every training
flag once, from the config fields; config_from_args builds the config from them (cli.py).
Numpy-free; imports nothing of minialign.
"""
import argparse
import dataclasses
import difflib
import math
import re
import sys

DEFAULT_VOCAB = "coco/bert-base-uncased-vocab.txt"  # --vocab: where `make data` puts BERT's
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")   # argparse's own test of a value like -1


def closest_choice(message):
    """argparse's "invalid choice: 'good_view' (choose from ...)" with the closest choice named
    ("... (did you mean good_views?)"); any other message as it is."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if not found or "did you mean" in message:
        return message
    choices = [c.strip().strip("'") for c in found.group(2).split(",")]
    close = difflib.get_close_matches(found.group(1), choices, n=1)
    return message + (f" (did you mean {close[0]}?)" if close else "")


class Parser(argparse.ArgumentParser):
    """argparse, but every refusal is ONE line, `minialign COMMAND: error: MESSAGE` (no usage
    block above it: --help prints that), exit code 2; an unrecognized flag names the closest
    flag of its command (did_you_mean). Sub-command parsers are of this class too."""

    def error(self, message):
        self.exit(2, f"{self.prog.removeprefix('python -m ')}: error: {closest_choice(message)}\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but unrecognized arguments are refused by the parser of the command
        they were given to (argparse's top parser would name no command, nor a close flag),
        and an unknown flag is refused first, before a missing required flag or a bad value:
        `train --stpes 10` names --steps, not the other flags train needs."""
        args = sys.argv[1:] if args is None else list(args)
        self.refuse_mistyped_command(args)            # before its flags, unknown to the top
        command, unknown = self.unknown_flags(args)
        if unknown:
            command.error(f"unrecognized arguments: {did_you_mean(command, unknown)}")
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            command = getattr(self, "commands", {}).get(getattr(parsed, "command", None), self)
            command.error(f"unrecognized arguments: {did_you_mean(command, extra)}")
        return parsed

    def refuse_mistyped_command(self, args):
        """A command word that is no command but close to one: argparse's refusal, naming the
        closest command (difflib) instead of listing them all."""
        commands = getattr(self, "commands", {})
        word = next((a for a in args if not a.startswith("-")), None)
        close = difflib.get_close_matches(word, commands, n=1) if word and commands else []
        if word not in commands and close:
            self.error(f"argument COMMAND: invalid choice: {word!r} (did you mean {close[0]}?)")

    def unknown_flags(self, args):
        """(the parser that refuses, [the flags in args it has no option for, nor is an
        abbreviation of one]): the top parser for flags before the command, else the command's
        parser (self without sub-commands). Stops at "--"; a negative number is a value, not a
        flag (as argparse reads it)."""
        commands, parser, unknown = getattr(self, "commands", {}), self, []
        for arg in args:
            if arg == "--":
                break
            if parser is self and arg in commands:
                if unknown:                        # flags before the command: the top's
                    break
                parser = commands[arg]
            elif arg.startswith("-") and len(arg) > 1 and not NEGATIVE_NUMBER.match(arg):
                flag = arg.split("=", 1)[0]
                known = parser._option_string_actions
                if flag not in known and not (parser.allow_abbrev and flag.startswith("--") and
                                              any(o.startswith(flag) for o in known)):
                    unknown.append(flag)
        return parser, unknown


def did_you_mean(parser, extra):
    """The unrecognized arguments `extra` (argparse's leftovers) as one phrase: each unknown
    flag, without the value given to it, with the closest flag of `parser` (difflib) if one is
    close: ['--stpes', '10'] -> '--stpes (did you mean --steps?)'."""
    flags = [s for a in parser._actions if a.help is not argparse.SUPPRESS
             for s in a.option_strings]
    named, after_flag = [], False
    for arg in extra:
        if arg.startswith("-") and len(arg) > 1:
            flag = arg.split("=", 1)[0]
            close = difflib.get_close_matches(flag, flags, n=1)
            named.append(flag + (f" (did you mean {close[0]}?)" if close else ""))
            after_flag = True
        elif not after_flag:                       # a stray word, not a flag's value
            named.append(arg)
    return ", ".join(named)


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


def one_of(*choices):
    """A `type=` function: one of the given words, else argparse's error listing them (used
    instead of argparse's choices= so that every flag refuses in the same words)."""
    def parse(text):
        if text not in choices:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(choices)}, got {text!r}")
        return text
    parse.__name__ = "one_of_" + "_".join(choices)
    parse.choices = choices
    return parse


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


# ---------------------------------------------------------------- the training flags, once
# Every training flag of every command: {config field: (help, type)}. A field of TrainConfig,
# of its ModelConfig (.model) or of its ObjectiveConfig (.loss); the flag is the field's name
# with dashes, its default the dataclass's. A command says which fields it exposes.
TRAIN_FLAGS = {
    "steps": ("optimizer steps, >= 1", positive_int),
    "seed": ("init/batch/mask seed, >= 0", nonnegative_int),
    "lr": ("peak learning rate, > 0 (replicate: the seed grid's shared lr)", positive_float),
    "batch_photos": ("photos per step, two captions each, >= 2", int_at_least(2)),
    "warmup_steps": ("linear warm-up steps before the cosine decay; keep it below --steps",
                     nonnegative_int),
    "weight_decay": ("decoupled AdamW weight decay, >= 0", nonnegative_float),
    "eval_every": ("steps between val evaluations, saved caption embeddings and checkpoints, "
                   ">= 1", positive_int),
    "split_seed": ("photo split seed, >= 0, independent of --seed", nonnegative_int),
    "mask_rate": ("bad_views: word masking probability, in [0, 1)", fraction_in_0_1),
    "anticollapse_weight": ("next_token: weight on the anti-collapse terms (VICReg var+cov or "
                            "SIGReg), >= 0", nonnegative_float),
    "sim_weight": ("VICReg invariance (lambda) weight, >= 0", nonnegative_float),
    "var_weight": ("VICReg variance (mu) weight, >= 0; 0 with --cov-weight 0 lets the "
                   "embeddings collapse", nonnegative_float),
    "cov_weight": ("VICReg covariance (nu) weight, >= 0", nonnegative_float),
    "anticollapse": ("anti-collapse term of every objective: vicreg (variance + covariance) or "
                     "sigreg (LeJEPA's SIGReg in their place)", one_of("vicreg", "sigreg")),
    "sigreg_weight": ("SIGReg's weight, >= 0 (next_token: times --anticollapse-weight)",
                      nonnegative_float),
    "sigreg_directions": ("SIGReg: random unit directions M drawn each step, >= 1", positive_int),
    "sigreg_t_max": ("SIGReg: Epps-Pulley integral over t in [-t_max, t_max], > 0",
                     positive_float),
    "sigreg_points": ("SIGReg: trapezoid knots on [0, t_max], >= 2", int_at_least(2)),
    "d_model": ("model width D, >= 1, divisible by --n-heads", positive_int),
    "n_layers": ("transformer blocks, >= 1", positive_int),
    "n_heads": ("attention heads, >= 1", positive_int),
    "mlp_ratio": ("MLP hidden width / D, >= 1", positive_int),
    "max_len": ("longest caption in tokens, BOS and EOS included, >= 3", int_at_least(3)),
    "tokenizer": ("words (a vocabulary of the training captions' words, tokenizer.py) or "
                  "wordpiece (BERT's uncased WordPiece, wordpiece.py, from --vocab)",
                  one_of("words", "wordpiece")),                  # train.TOKENIZERS
    "vocab": (f"--tokenizer wordpiece: its vocabulary file, one entry a line (default: "
              f"{DEFAULT_VOCAB}, which `make data` downloads)", str),
    "layers": ("the layer set the model runs: fast (machinery/fastpath/fast.py) or reference "
               "(minialign/layers.py, the readable one; slower, same maths)",
               one_of("fast", "reference")),    # model.LAYER_SETS
    "dtype": ("the arithmetic: float32 (as the replication trains), or float64, whose "
              "rounding is too small for training to carry into the results (slower; "
              "docs/protocol.md, \"Results that do not depend on rounding\")",
              one_of("float32", "float64")),      # model.DTYPES
    # the choices the replication's write-up leaves unsaid (docs/protocol.md), today's default
    "projector_dim": ("VICReg's projector (expander) after the encoder: Linear-LayerNorm-GELU-"
                      "Linear of this width, the loss on its output, every metric on z before "
                      "it; 0: none", nonnegative_int),
    "causal_pool": ("next_token's caption vector z: mean over its tokens, or the last token's "
                    "hidden state", one_of("mean", "last")),     # model.POOLS
    "mask_mode": ("bad_views: a masked word is replaced by <mask>, or dropped (the caption "
                  "closes up)", one_of("replace", "drop")),      # objectives.MASK_MODES
    "unseen_params": ("parameters the loss cannot see (ln_f.beta under VICReg alone): train "
                      "them on rounding noise, or freeze them", one_of("train", "freeze")),
}
MODEL_FIELDS = ("d_model", "n_layers", "n_heads", "mlp_ratio", "max_len", "layers",
                "projector_dim", "causal_pool", "dtype")
LOSS_FIELDS = ("mask_rate", "sim_weight", "var_weight", "cov_weight", "anticollapse_weight",
               "anticollapse", "sigreg_weight", "sigreg_directions", "sigreg_t_max",
               "sigreg_points", "mask_mode", "unseen_params")
CHOICE_FIELDS = ("projector_dim", "causal_pool", "mask_mode", "unseen_params")   # (#29)


def add_config_flags(p, fields, defaults):
    """Add one flag per config field in `fields` (TRAIN_FLAGS' help and type), default from
    `defaults`, a TrainConfig."""
    for name in fields:
        help, type = TRAIN_FLAGS[name]
        owner = (defaults.model if name in MODEL_FIELDS else
                 defaults.loss if name in LOSS_FIELDS else defaults)
        metavar = "{" + ",".join(type.choices) + "}" if hasattr(type, "choices") else None
        p.add_argument("--" + name.replace("_", "-"), type=type, default=getattr(owner, name),
                       metavar=metavar, help=help)


def config_from_args(args, base, **fixed):
    """The TrainConfig `base` with every config field present in the parsed `args` (and
    `fixed`, e.g. objective=, captions=) replaced. Raises ValueError for fields that disagree
    (--d-model not divisible by --n-heads), before any file is read or written."""
    given = {k: v for k, v in vars(args).items() if k in TRAIN_FLAGS}
    if given.get("tokenizer", base.tokenizer) == "wordpiece":      # --vocab: wordpiece's only
        given["vocab"] = given.get("vocab") or base.vocab or DEFAULT_VOCAB
    elif given.get("vocab"):
        raise ValueError(f"--vocab {given['vocab']} is --tokenizer wordpiece's vocabulary; the "
                         f"words tokenizer builds its own (pass --tokenizer wordpiece)")
    elif "tokenizer" in given:
        given["vocab"] = ""
    if "d_model" in given or "n_heads" in given:
        check_heads_divide_width(argparse.Namespace(**{**{"d_model": base.model.d_model,
                                                          "n_heads": base.model.n_heads}, **given}))
    model = dataclasses.replace(base.model, **{k: v for k, v in given.items() if k in MODEL_FIELDS})
    loss = dataclasses.replace(base.loss, **{k: v for k, v in given.items() if k in LOSS_FIELDS})
    top = {k: v for k, v in given.items() if k not in MODEL_FIELDS + LOSS_FIELDS}
    return dataclasses.replace(base, model=model, loss=loss, **top, **fixed)


def add_grid_run_flags(p, what, fit):
    """--jobs, --threads, --dry-run, --no-estimate: how a grid of runs (`what`: "grid" for
    replicate, "sweep" for scaling) runs here. fit: what --jobs' default fits in memory."""
    p.add_argument("--jobs", type=positive_int, default=None,
                   help=f"runs at once, each in its own process, >= 1 (default: one per core, "
                        f"{fit}; refused if they would not fit)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="cores each run computes on, >= 1 (default: cores // --jobs)")
    p.add_argument("--dry-run", action="store_true",
                   help=f"time a few steps of each objective (at each size) at --jobs, print the "
                        f"plan and how long the {what} will take, write nothing")
    p.add_argument("--no-estimate", action="store_true",
                   help=f"start at once, without timing the {what} first")
