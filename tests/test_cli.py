"""The command line (machinery/cli.py): a bad input is one line naming the file, exit 2, before
anything is written; a bad flag exits 2; 0 done, 3 diverged, 130, 143; every --help."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from conftest import POSIX_SIGNALS, ROOT, write_captions

from minialign import train
from minialign.__main__ import main
from minialign.machinery import cli

TINY = ["--steps", "2", "--batch-photos", "8", "--eval-every", "2", "--warmup-steps", "1",
        "--d-model", "8", "--n-layers", "1", "--n-heads", "2"]


def train_cli(captions, out, *extra):
    return main(["train", "--captions", str(captions), "--out", str(out), *TINY, *extra])


def one_line(capsys):
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.rstrip("\n")


def test_a_bad_input_is_one_line_naming_it_before_anything_is_written(tmp_path, capsys,
                                                                      captions, monkeypatch):
    (tmp_path / "bad.json").write_text("{not json")
    write_captions(tmp_path / "few.json", n_photos=10)             # no split of 3 photos each
    out = tmp_path / "run"
    vocab = tmp_path / "no-vocab.txt"
    for given, extra, path in [(tmp_path / "none.json", [], tmp_path / "none.json"),
                               (tmp_path / "bad.json", [], tmp_path / "bad.json"),
                               (tmp_path / "few.json", [], tmp_path / "few.json"),
                               (captions, ["--tokenizer", "wordpiece", "--vocab", vocab], vocab)]:
        assert train_cli(given, out, *map(str, extra)) == 2
        assert one_line(capsys).startswith(f"minialign train: error: {path}:")  # :line: too
        assert not out.exists()
    for extra, message in [(["--d-model", "30", "--n-heads", "4"], "d_model 30 is not "
                                                                    "divisible by n_heads 4"),
                           (["--batch-photos", "100"], f"{captions}: batch_photos=100")]:
        assert train_cli(captions, out, *extra) == 2
        assert one_line(capsys).startswith(f"minialign train: error: {message}")
        assert not out.exists()
    unparsed = lambda p: compile("def f(:", "layers.py", "exec")  # a student's unfinished file
    monkeypatch.setitem(cli.COMMANDS, "train", ("", unparsed))     # imported by the flags' build
    assert train_cli(captions, out) == 2
    assert re.match(r"minialign train: error: .* \(layers.py, line 1\)$", one_line(capsys))


@pytest.mark.parametrize("flag, value", [("--steps", "0"), ("--lr", "-1e-3"), ("--lr", "nan"),
                                         ("--mask-rate", "1"), ("--warmup-steps", "-1"),
                                         ("--layers", "textbook"), ("--dtype", "float16"),
                                         ("--objective", "good_view"), ("--stpes", "3"),
                                         ("--force", "--resume")])
def test_a_bad_flag_exits_2_naming_it(flag, value, tmp_path, capsys, captions):
    with pytest.raises(SystemExit) as stop:
        train_cli(captions, tmp_path / "run", flag, value)
    assert stop.value.code == 2 and not (tmp_path / "run").exists()
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("python -m minialign") and ": error: " in last and flag in last


def test_exit_codes(tmp_path, capsys, captions):
    assert train_cli(captions, tmp_path / "done") == 0
    assert json.loads((tmp_path / "done" / "metrics.json").read_text())["final"]["step"] == 2
    assert train_cli(captions, tmp_path / "done") == 2                  # not empty: refused
    assert "not empty" in one_line(capsys)
    assert train_cli(captions, tmp_path / "done", "--force") == 0
    assert train_cli(captions, tmp_path / "boom", "--lr", "1e6", "--grad-clip", "0",
                     "--steps", "30") == 3
    assert capsys.readouterr().err.startswith(f"minialign train: {tmp_path / 'boom'}: diverged")


@POSIX_SIGNALS
@pytest.mark.parametrize("signum, code, how", [(signal.SIGINT, 130, "interrupted"),
                                               (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_and_sigterm_stop_with_the_resume_hint(signum, code, how, tmp_path, capsys,
                                                      captions, monkeypatch):
    def stopped(*a, **k):                # Ctrl-C raises KeyboardInterrupt (a shell may ignore
        if signum == signal.SIGINT:      # SIGINT in background jobs); SIGTERM, main's handler
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)
    monkeypatch.setattr(train, "train", stopped)
    before = signal.getsignal(signal.SIGTERM)                # main installs its own handler
    try:
        assert train_cli(captions, tmp_path / "run") == code
    finally:
        signal.signal(signal.SIGTERM, before)
    assert one_line(capsys).startswith(f"minialign train: {how}; rerun")    # the resume hint


@pytest.mark.parametrize("command", [None, *cli.COMMANDS])
def test_every_commands_help(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main([command, "--help"] if command else ["--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0
    assert out.startswith(f"usage: python -m minialign {command or ''}".rstrip())
    assert "/work/" not in out and "../" not in out                     # no path of this machine


def test_nothing_needs_a_python_newer_than_requires_python():
    """vermin's static check of the package and tests against pyproject's requires-python (a
    dev tool: skipped without it); numpy 1.x and 2.x are checked by running (make test-oldest)."""
    pytest.importorskip("vermin", reason="vermin is not installed (pip install -e '.[dev]')")
    oldest = re.search(r'^requires-python = ">=(3\.\d+)"$', (ROOT / "pyproject.toml").read_text(),
                       re.M).group(1)
    done = subprocess.run([sys.executable, "-c", "import sys, vermin; sys.argv[0] = 'vermin'; "
                           "sys.exit(vermin.main())", "-q", "--no-tips", "--violations",
                           "--eval-annotations", f"-t={oldest}-", "minialign", "tests"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr
