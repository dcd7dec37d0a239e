"""What a user sees when a command is refused or stopped: one line per refusal (no argparse
usage block; a mistyped flag names the closest one), SIGTERM stopped like Ctrl-C (the resume
hint, exit code 143, no leaked-semaphore warning), the warm-up warning only for a run that
starts, and evaluate's hint naming the embeddings file of the run's own photos."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import POSIX_SIGNALS
from minialign.machinery import cli
from minialign.machinery.images import evaluate, synthetic
from minialign.machinery.run import flags
from minialign.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--batch-photos", "16"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    captions, embeddings = synthetic.write_world(tmp_path_factory.mktemp("world"), 300, seed=0,
                                                 world="v1")
    return {"captions": str(captions), "embeddings": str(embeddings)}


# ---------------------------------------------------------------- 1. one line per refusal
REFUSED = [  # (argv, the whole of stderr)
    (["train", "--stpes", "10", "--objective", "good_views", "--captions", "c.json",
      "--out", "r"], "minialign train: error: unrecognized arguments: --stpes (did you mean "
                     "--steps?)"),
    (["train", "--objective", "good_views", "--captions", "c.json", "--out", "r",
      "--stpes=10", "--sed", "1"], "minialign train: error: unrecognized arguments: --stpes "
                                   "(did you mean --steps?), --sed (did you mean --seed?)"),
    (["train", "--stpes", "10"], "minialign train: error: unrecognized arguments: --stpes (did "
                                 "you mean --steps?)"),            # before the missing flags
    (["replicate", "--jobs", "0", "--jbos", "2", "--captions", "c.json", "--out", "o"],
     "minialign replicate: error: unrecognized arguments: --jbos (did you mean --jobs?)"),
    (["--verbose", "train"], "minialign: error: unrecognized arguments: --verbose"),
    (["evaluate", "--run", "r", "stray"], "minialign evaluate: error: unrecognized arguments: "
                                          "stray"),
    (["replicate", "--jobs", "0", "--captions", "c.json", "--out", "o"],
     "minialign replicate: error: argument --jobs: must be an integer >= 1, got '0'"),
    (["train", "--objective", "good_views"], "minialign train: error: the following arguments "
                                             "are required: --captions, --out"),
    (["synthetic", "--out", "r", "--seed", "-1"], "minialign synthetic: error: argument "
                                                  "--seed: must be an integer >= 0, got '-1'"),
    ([], "minialign: error: the following arguments are required: COMMAND"),
    (["trian", "--steps", "2"], "minialign: error: argument COMMAND: invalid choice: 'trian' "
                                "(did you mean train?)"),
    (["train", "--objective", "good_view", "--captions", "c.json", "--out", "r"],
     "minialign train: error: argument --objective: invalid choice: 'good_view' (choose from "
     "'bad_views', 'good_views', 'next_token') (did you mean good_views?)"),
    (["xyzzy"], "minialign: error: argument COMMAND: invalid choice: 'xyzzy' (choose from "
                "'data', 'train', 'bench', 'synthetic', 'evaluate', 'replicate', 'scaling', "
                "'ablations', "
                "'report', 'compare', 'export', 'exercises', 'grade')"),  # nothing close: all
]


@pytest.mark.parametrize("argv, line", REFUSED)
def test_a_refused_command_prints_one_line(argv, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    captured = capsys.readouterr()
    assert stop.value.code == 2 and captured.out == ""
    assert captured.err == line + "\n"
    assert not (tmp_path / "r").exists()


def test_did_you_mean_skips_a_flags_value_and_far_names():
    p = flags.Parser(prog="python -m minialign train")
    p.add_argument("--steps")
    p.add_argument("--hidden", help=flags.argparse.SUPPRESS)
    assert flags.did_you_mean(p, ["--stpes", "10", "20"]) == "--stpes (did you mean --steps?)"
    assert flags.did_you_mean(p, ["x", "--zzzzzz"]) == "x, --zzzzzz"
    assert "--hidden" not in flags.did_you_mean(p, ["--hiddn"])   # a hidden flag: not suggested


def test_help_still_prints_the_whole_usage(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and out.startswith("usage: python -m minialign train")
    assert "--steps STEPS" in out and "--warmup-steps" in out
    words = " ".join(out.split())                       # help text, unwrapped
    assert "SIGReg's weight, >= 0" in words and "(default: 5.26316)" in words   # floats as %g
    assert "5.2631578947368425" not in words and "(default: 0.001)" in words


# ---------------------------------------------------------------- 2. SIGTERM = Ctrl-C
def start(argv, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "minialign", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def wait_for(process, text):
    """Read process's stdout until a line contains `text` (the command got that far)."""
    for line in process.stdout:
        if text in line:
            return
    raise AssertionError(f"{text!r} never printed: {process.communicate()[1]}")


@pytest.mark.parametrize("command", ["replicate", "scaling"])
def test_ctrl_c_of_a_grid_says_every_interrupted_run_resumes(command, monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "run_command", interrupted)
    argv = [command, "--captions", "c.json", "--out", "o"]
    assert main(argv) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err == (
        f"minialign {command}: interrupted; rerun the same command: finished runs are skipped, "
        f"interrupted runs resume from their last checkpoint (from step 0 if none was saved "
        f"yet)\n")


@POSIX_SIGNALS
def test_sigterm_stops_train_like_ctrl_c(world, tmp_path):
    out = tmp_path / "run"
    train = start(["train", "--objective", "good_views", "--captions", world["captions"],
                   "--out", str(out), "--steps", "100000", "--threads", "1", *TINY])
    wait_for(train, "[good_views] step 1/")        # training has started, its progress bar made
    # (not at "vocabulary": tqdm < 4.70 made to stop inside tqdm() says "'tqdm' object has no
    # attribute 'disable'" at exit, after the hint; docs/platforms.md)
    train.send_signal(signal.SIGTERM)
    _, err = train.communicate(timeout=120)
    assert train.returncode == cli.EXIT_TERMINATED == 143
    assert err.splitlines()[-1] == ("minialign train: terminated (SIGTERM); "
                                    + cli.RESUME_HINT["train"])
    assert (out / "config.json").is_file() and not list(out.glob("*.tmp*"))


@POSIX_SIGNALS
def test_sigterm_to_a_dry_run_group_leaks_no_semaphore(world, tmp_path):
    """As `timeout` does: SIGTERM to the whole group, the parent and its timing processes.
    The encoder is big enough that timing lasts ~7 s (TINY's whole dry run took 2.9 s: the
    signal could come after the command had ended, and the parent died of it, exit -15)."""
    dry = start(["replicate", "--captions", world["captions"], "--embeddings",
                 world["embeddings"], "--out", str(tmp_path / "o"), "--dry-run", "--jobs", "2",
                 "--steps", "50", "--d-model", "128", "--n-heads", "2", "--n-layers", "2",
                 "--batch-photos", "64"], start_new_session=True)
    wait_for(dry, "[estimate] timing")
    time.sleep(1)                                    # the timing processes are being spawned
    os.killpg(dry.pid, signal.SIGTERM)
    _, err = dry.communicate(timeout=120)
    assert dry.returncode == 143
    assert "leaked" not in err and "race condition" not in err and "Traceback" not in err
    assert "interrupted" not in err.splitlines()     # the children: silent on the terminal
    assert err.splitlines()[-1] == ("minialign replicate: terminated (SIGTERM); "
                                    "a dry run writes nothing; rerun it to estimate again")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- 4. the warm-up warning
def test_warmup_warning_not_before_an_unrelated_error(world, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    argv = ["train", "--objective", "good_views", "--captions", world["captions"], "--steps",
            "2", "--warmup-steps", "5", "--eval-every", "1", *TINY]
    assert main(argv + ["--out", str(tmp_path / "full")]) == 2
    assert capsys.readouterr().err == (f"minialign train: error: {tmp_path / 'full'}: directory "
                                       f"exists and is not empty (pass --force to replace it, "
                                       f"or --resume to continue it)\n")
    assert main(argv + ["--out", str(tmp_path / "run")]) == 0      # runs: now it warns
    assert ("warning: --warmup-steps 5 >= --steps 2: the learning rate never reaches its peak "
            "0.001") in capsys.readouterr().err.splitlines()


# ---------------------------------------------------------------- 3. evaluate's hint
def test_evaluate_hint_names_the_embeddings_of_the_runs_own_photos(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    val = evaluate.missing_embeddings_note("coco/annotations/captions_val2017.json")
    assert ("Create it once with `python -m minialign export --captions "
            "coco/annotations/captions_val2017.json --images coco/val2017 --model "
            "facebook/dinov2-base --out embeddings/coco_val2017_dinov2-base.npz` (COCO images + "
            "the [export] extra; see embeddings/README.md), then rerun with --embeddings "
            "embeddings/coco_val2017_dinov2-base.npz.") in val and "\n" not in val
    assert "subset" not in val and "rerun with --embeddings embeddings/coco_val2017_" in val
    subset = evaluate.missing_embeddings_note("coco/captions_train2017_subset10000_seed0.json")
    assert "`make embeddings`" in subset and "export --captions" not in subset
    assert f"rerun with --embeddings {evaluate.DEFAULT_EMBEDDINGS}." in subset
    assert evaluate.expected_embeddings("coco/captions_train2017_subset5000_seed1.json") == \
        "embeddings/coco_train2017_subset5000_seed1_dinov2-base.npz"      # README's name
    assert evaluate.SYNTHETIC_FILES == (synthetic.CAPTIONS_NAME, synthetic.EMBEDDINGS_NAME)
    world = evaluate.missing_embeddings_note("w/captions_synthetic.json")      # not written
    assert ("`python -m minialign synthetic --out w`; then rerun with --embeddings "
            "w/embeddings_synthetic.npz.") in world and "export" not in world
    (tmp_path / "embeddings").mkdir()
    (tmp_path / "embeddings" / "coco_val2017_dinov2-base.npz").write_bytes(b"")
    assert ("embeddings/coco_val2017_dinov2-base.npz exists: rerun with --embeddings "
            "embeddings/coco_val2017_dinov2-base.npz.") in \
        evaluate.missing_embeddings_note("captions_val2017.json")
