"""The command line refuses nonsense flags before it writes anything (issue #7), with one line
that names the flag and its valid range, exit code 2; the dataclasses refuse the same values
from Python. Every refusal comes before the captions are read; one tiny run checks that
--anticollapse sigreg trains end to end."""
import argparse
import json
import re

import numpy as np
import pytest

from minialign.machinery.run import flags
from minialign.machinery.experiment.protocol import planned_runs
from minialign.machinery.images.synthetic import write_world
from minialign.__main__ import main
from minialign.machinery import fastpath
from minialign.model import ModelConfig
from minialign.objectives import ANTICOLLAPSE
from minialign.train import TrainConfig

TRAIN_BAD = [  # (flags, the line printed after "minialign train: error: ")
    (["--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
    (["--steps", "-5"], "argument --steps: must be an integer >= 1, got '-5'"),
    (["--lr", "0"], "argument --lr: must be a number > 0, got '0'"),
    (["--lr=-1e-3"], "argument --lr: must be a number > 0, got '-1e-3'"),
    (["--lr", "nan"], "argument --lr: must be a number > 0, got 'nan'"),
    (["--mask-rate", "1"], "argument --mask-rate: must be a number in [0, 1), got '1'"),
    (["--mask-rate", "-0.1"], "argument --mask-rate: must be a number in [0, 1), got '-0.1'"),
    (["--warmup-steps", "-1"], "argument --warmup-steps: must be an integer >= 0, got '-1'"),
    (["--eval-every", "0"], "argument --eval-every: must be an integer >= 1, got '0'"),
    (["--batch-photos", "1"], "argument --batch-photos: must be an integer >= 2, got '1'"),
    (["--d-model", "0"], "argument --d-model: must be an integer >= 1, got '0'"),
    (["--n-layers", "0"], "argument --n-layers: must be an integer >= 1, got '0'"),
    (["--n-heads", "0"], "argument --n-heads: must be an integer >= 1, got '0'"),
    (["--mlp-ratio", "0"], "argument --mlp-ratio: must be an integer >= 1, got '0'"),
    (["--max-len", "2"], "argument --max-len: must be an integer >= 3, got '2'"),
    (["--weight-decay", "-0.01"], "argument --weight-decay: must be a number >= 0, got '-0.01'"),
    (["--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
    (["--anticollapse", "barlow"],
     "argument --anticollapse: must be one of vicreg, sigreg, got 'barlow'"),
    (["--layers", "textbook"], "argument --layers: must be one of fast, reference, got 'textbook'"),
    (["--sigreg-weight", "-1"], "argument --sigreg-weight: must be a number >= 0, got '-1'"),
    (["--sigreg-directions", "0"],
     "argument --sigreg-directions: must be an integer >= 1, got '0'"),
    (["--sigreg-t-max", "0"], "argument --sigreg-t-max: must be a number > 0, got '0'"),
    (["--sigreg-points", "1"], "argument --sigreg-points: must be an integer >= 2, got '1'"),
]
REPLICATE_BAD = [
    (["--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
    (["--lr", "0"], "argument --lr: must be a number > 0, got '0'"),
    (["--eval-every", "0"], "argument --eval-every: must be an integer >= 1, got '0'"),
    (["--batch-photos", "1"], "argument --batch-photos: must be an integer >= 2, got '1'"),
    (["--warmup-steps", "-2"], "argument --warmup-steps: must be an integer >= 0, got '-2'"),
    (["--lr-min", "0"], "argument --lr-min: must be a number > 0, got '0'"),
    (["--lr-max", "-1"], "argument --lr-max: must be a number > 0, got '-1'"),
    (["--lr-per-decade", "0"], "argument --lr-per-decade: must be an integer >= 1, got '0'"),
    (["--max-extensions", "-1"], "argument --max-extensions: must be an integer >= 0, got '-1'"),
    (["--d-model", "0"], "argument --d-model: must be an integer >= 1, got '0'"),
    (["--seeds"], "argument --seeds: expected at least one argument"),
    (["--seeds", "0", "1", "0"], "argument --seeds: each value at most once, 0 repeated"),
    (["--seeds", "-1"], "argument --seeds: must be an integer >= 0, got '-1'"),
    (["--objectives", "good_views", "good_views"],
     "argument --objectives: each value at most once, good_views repeated"),
    (["--anticollapse", "VICReg"],
     "argument --anticollapse: must be one of vicreg, sigreg, got 'VICReg'"),
    (["--sigreg-weight", "-2"], "argument --sigreg-weight: must be a number >= 0, got '-2'"),
]
BENCH_BAD = [
    (["--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
    (["--warmup", "-1"], "argument --warmup: must be an integer >= 0, got '-1'"),
    (["--batch-photos", "1"], "argument --batch-photos: must be an integer >= 2, got '1'"),
    (["--d-model", "0"], "argument --d-model: must be an integer >= 1, got '0'"),
    (["--gemm-square", "0"], "argument --gemm-square: must be an integer >= 1, got '0'"),
]


def error_lines(capsys):
    """stderr's lines: the refusal alone, no usage block above it (flags.Parser)."""
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


def run_refused(argv, capsys):
    """main(argv) must stop with exit code 2; returns its one error line."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    (line,) = error_lines(capsys)
    return line


@pytest.mark.parametrize("bad, message", TRAIN_BAD)
def test_train_refuses_bad_flags_before_writing(tmp_path, capsys, bad, message):
    out = tmp_path / "run"
    line = run_refused(["train", "--objective", "good_views", "--captions",
                        str(tmp_path / "captions.json"), "--out", str(out), *bad], capsys)
    assert line == f"minialign train: error: {message}"
    assert not out.exists()


@pytest.mark.parametrize("bad, message", REPLICATE_BAD)
def test_replicate_refuses_bad_flags_before_writing(tmp_path, capsys, bad, message):
    out = tmp_path / "results"
    line = run_refused(["replicate", "--captions", str(tmp_path / "c.json"), "--out", str(out),
                        "--image-eval", "off", *bad], capsys)
    assert line == f"minialign replicate: error: {message}"
    assert not out.exists()


@pytest.mark.parametrize("bad, message", BENCH_BAD)
def test_bench_refuses_bad_flags(tmp_path, capsys, bad, message):
    line = run_refused(["bench", "--captions", str(tmp_path / "c.json"), *bad], capsys)
    assert line == f"minialign bench: error: {message}"


HEADS = "--d-model 30 is not divisible by --n-heads 4 (each head gets d_model / n_heads dimensions)"


def test_width_not_divisible_by_heads_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--objective", "good_views", "--captions", str(tmp_path / "c.json"),
                 "--out", str(out), "--d-model", "30", "--n-heads", "4"])
    assert code == 2 and not out.exists()
    assert error_lines(capsys) == [f"minialign train: error: {HEADS}"]
    code = main(["replicate", "--captions", str(tmp_path / "c.json"), "--out", str(out),
                 "--image-eval", "off", "--d-model", "30", "--n-heads", "4"])
    assert code == 2 and not out.exists()
    assert error_lines(capsys) == [f"minialign replicate: error: {HEADS}"]
    assert main(["bench", "--captions", str(tmp_path / "c.json"), "--d-model", "30",
                 "--n-heads", "4"]) == 2
    assert error_lines(capsys) == [f"minialign bench: error: {HEADS}"]


def test_replicate_lr_range_must_be_increasing_when_searching(tmp_path, capsys):
    out = tmp_path / "results"
    assert main(["replicate", "--captions", str(tmp_path / "c.json"), "--out", str(out),
                 "--image-eval", "off", "--lr-min", "1e-2", "--lr-max", "1e-3"]) == 2
    assert error_lines(capsys) == ["minialign replicate: error: --lr-max 0.001 must be greater "
                                   "than --lr-min 0.01 (or pass --lr-search off)"]
    assert not out.exists()


@pytest.mark.parametrize("fields, message", [
    ({"steps": 0}, "TrainConfig: steps=0 must be an integer >= 1"),
    ({"steps": -3}, "TrainConfig: steps=-3 must be an integer >= 1"),
    ({"lr": 0.0}, "TrainConfig: lr=0.0 must be a number > 0"),
    ({"lr": float("inf")}, "TrainConfig: lr=inf must be a number > 0"),
    ({"loss": {"mask_rate": 1.0}}, "ObjectiveConfig: mask_rate=1.0 must be a number in [0, 1)"),
    ({"warmup_steps": -1}, "TrainConfig: warmup_steps=-1 must be an integer >= 0"),
    ({"eval_every": 0}, "TrainConfig: eval_every=0 must be an integer >= 1"),
    ({"batch_photos": 1}, "TrainConfig: batch_photos=1 must be an integer >= 2"),
    ({"weight_decay": -0.05}, "TrainConfig: weight_decay=-0.05 must be a number >= 0"),
    ({"min_lr_ratio": 1.5}, "TrainConfig: min_lr_ratio=1.5 must be a number in [0, 1]"),
    ({"grad_clip": 0.0}, "TrainConfig: grad_clip=0.0 must be a number > 0"),
    ({"seed": -1}, "TrainConfig: seed=-1 must be an integer >= 0"),
    ({"steps": 2.5}, "TrainConfig: steps=2.5 must be an integer >= 1"),
    ({"model": {"d_model": 30, "n_heads": 4}}, "d_model=30 is not divisible by n_heads=4"),
    ({"model": {"d_model": 0}}, "ModelConfig: d_model=0 must be an integer >= 1"),
    ({"model": {"n_layers": 0}}, "ModelConfig: n_layers=0 must be an integer >= 1"),
    ({"model": {"max_len": 2}}, "ModelConfig: max_len=2 must be an integer >= 3"),
    ({"model": {"mlp_ratio": 0}}, "ModelConfig: mlp_ratio=0 must be an integer >= 1"),
    ({"model": {"vocab_size": 4}}, "ModelConfig: vocab_size=4 must be an integer >= 5"),
    ({"model": {"layers": "slow"}}, "ModelConfig: layers='slow' must be one of fast, reference"),
    ({"loss": {"anticollapse": "none"}},
     "ObjectiveConfig: anticollapse='none' must be one of vicreg, sigreg"),
    ({"loss": {"sigreg_points": 1}}, "ObjectiveConfig: sigreg_points=1 must be an integer >= 2"),
    ({"loss": {"sigreg_t_max": -3.0}}, "ObjectiveConfig: sigreg_t_max=-3.0 must be a number > 0"),
])
def test_dataclasses_refuse_out_of_range_fields(fields, message):
    with pytest.raises(ValueError) as info:
        TrainConfig(**fields)
    assert str(info.value) == message


def test_dataclasses_accept_the_edges_of_each_range():
    cfg = TrainConfig(steps=1, batch_photos=2, warmup_steps=0, eval_every=1,
                      weight_decay=0.0, min_lr_ratio=1.0, lr=1e-9, loss={"mask_rate": 0.0},
                      model=ModelConfig(d_model=1, n_heads=1, n_layers=1, mlp_ratio=1, max_len=3))
    assert (cfg.steps, cfg.model.max_len, cfg.loss.mask_rate) == (1, 3, 0.0)


def test_flag_types_return_values_and_name_the_range():
    assert flags.positive_int("7") == 7 and flags.nonnegative_int("0") == 0
    assert flags.fraction_in_0_1("0.25") == 0.25 and flags.positive_float("1e-3") == 1e-3
    assert flags.nonnegative_float("0") == 0.0 and flags.int_at_least(2)("2") == 2
    for parse, text, message in [(flags.positive_int, "1.5", "an integer >= 1, got '1.5'"),
                                 (flags.fraction_in_0_1, "inf", "in [0, 1), got 'inf'"),
                                 (flags.positive_float, "x", "a number > 0, got 'x'")]:
        with pytest.raises(argparse.ArgumentTypeError, match=message.replace("[", r"\[")
                           .replace(")", r"\)")):
            parse(text)


def test_anticollapse_flag_lists_the_objectives_choices():
    assert flags.TRAIN_FLAGS["anticollapse"][1].choices == ANTICOLLAPSE
    assert flags.one_of("a", "b")("b") == "b"


@pytest.mark.parametrize("objective", ["good_views", "next_token"])
def test_train_with_sigreg_end_to_end(tmp_path, capsys, objective):
    """A tiny run under --anticollapse sigreg: config.json records it and SIGReg's settings,
    log.jsonl carries a finite sigreg term every step, and it evaluates to the end."""
    captions, _ = write_world(tmp_path / "world", n_scenes=120, seed=0, world="v1")
    out = tmp_path / "run"
    assert main(["train", "--objective", objective, "--captions", str(captions), "--out",
                 str(out), "--steps", "4", "--batch-photos", "16", "--warmup-steps", "1",
                 "--eval-every", "2", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
                 "--anticollapse", "sigreg", "--sigreg-directions", "32",
                 "--sigreg-points", "9", "--sigreg-t-max", "4"]) in (0, None)
    loss_cfg = json.loads((out / "config.json").read_text())["config"]["loss"]
    assert (loss_cfg["anticollapse"], loss_cfg["sigreg_directions"], loss_cfg["sigreg_points"],
            loss_cfg["sigreg_t_max"]) == ("sigreg", 32, 9, 4.0)
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(np.isfinite(r["sigreg"]) and r["sigreg"] > 0 and np.isfinite(r["loss"])
               for r in rows)
    assert "var" not in rows[0] and "cov" not in rows[0]
    final = json.loads((out / "metrics.json").read_text())["final"]
    assert final["step"] == 4 and np.isfinite(final["val"]["paraphrase_R@1"])


@pytest.mark.parametrize("command, extra", [
    ("train", ["--objective", "good_views", "--captions", "c.json", "--out", "o"]),
    ("replicate", ["--captions", "c.json", "--out", "o"]),
    ("scaling", ["--captions", "c.json", "--out", "o"])])
def test_every_command_that_trains_takes_layers(command, extra):
    """--layers reference reaches the config each command trains with (default: fast; in a
    student copy, which has no fast path, reference)."""
    from minialign.machinery import cli
    p = cli.parser()
    default = "fast" if fastpath.PRESENT else "reference"
    for given, wanted in (([], default), (["--layers", "reference"], "reference")):
        args = p.parse_args([command, *extra, *given])
        if command == "train":
            cfg = flags.config_from_args(args, TrainConfig())
        else:
            protocol = (cli.protocol_from_args(args) if command == "replicate"
                        else cli.scaling_run.protocol_from_args(args))
            cfg = planned_runs(protocol)[0]             # one run's config, sized for scaling
        assert cfg.model.layers == wanted


def test_no_help_text_names_a_path_outside_the_repository():
    """Every command's --help (and bench_torch's) works from a fresh clone: no default or help
    names ../shared, the development machine's data, or an absolute path."""
    from minialign.machinery.timing import bench_torch
    from minialign.machinery import cli
    top = cli.parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    helps = {name: p.format_help() for name, p in sub.choices.items()}
    helps["bench_torch"] = bench_torch.parser().format_help()
    outside = re.compile(r"\.\./|/shared/|/work/|/home/|\(default: /")
    wrong = {name: outside.findall(text) for name, text in helps.items() if outside.search(text)}
    assert not wrong, wrong
