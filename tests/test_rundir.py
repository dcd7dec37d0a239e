"""The run directory on the command line: --force replaces only a run, a rerun of replicate
after a bad input reuses --out, a diverged run has its own exit code and record.

Each test runs `python -m minialign ...` in-process (minialign.__main__.main) on a tiny model.
"""
import json
import os
from pathlib import Path

import pytest

from minialign.machinery import cli
from minialign.machinery.images import synthetic
from minialign.__main__ import main

TINY = ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--batch-photos", "8",
        "--warmup-steps", "1", "--eval-every", "2"]


@pytest.fixture(scope="module")
def captions(tmp_path_factory):
    return synthetic.write_world(tmp_path_factory.mktemp("world"), n_scenes=120, seed=0,
                                 world="v1")[0]


def train_cli(captions, out, *extra, steps=3):
    return main(["train", "--objective", "good_views", "--captions", str(captions),
                 "--out", str(out), "--steps", str(steps), *TINY, *extra])


def tree(path):
    """{relative path: bytes} of every file under path."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(Path(path).rglob("*"))
            if p.is_file()}


def test_force_replaces_a_finished_run(captions, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli(captions, out) == 0
    first = json.loads((out / "metrics.json").read_text())["final"]
    assert train_cli(captions, out) == 2                          # no flag: refused
    assert "not empty" in capsys.readouterr().err
    assert train_cli(captions, out, "--force") == 0
    assert json.loads((out / "metrics.json").read_text())["final"] == first


def test_force_refuses_a_folder_with_other_files_and_deletes_nothing(captions, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli(captions, out) == 0
    (out / "notes.txt").write_text("my notes")
    (out / "captions" / "mine.npz").write_bytes(b"x")
    before = tree(out)
    capsys.readouterr()
    assert train_cli(captions, out, "--force") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{out}: holds 2 file(s) that no minialign run writes" in err
    assert "notes.txt" in err and tree(out) == before


def test_force_refuses_when_the_captions_lie_inside_out(captions, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    inside = out / "captions.json"
    inside.write_bytes(Path(captions).read_bytes())
    assert train_cli(inside, out, "--force") == 2
    assert f"{out}: holds {inside}, an input of this run" in capsys.readouterr().err
    assert inside.read_bytes() == Path(captions).read_bytes()


@pytest.mark.parametrize("target", [".", ".."])
def test_force_never_removes_the_current_directory_or_a_parent(captions, tmp_path, capsys,
                                                              monkeypatch, target):
    here = tmp_path / "work" / "here"
    here.mkdir(parents=True)
    (here / "precious.txt").write_text("keep me")
    monkeypatch.chdir(here)
    assert train_cli(captions, target, "--force") == 2
    assert "is the current directory or one of its parents" in capsys.readouterr().err
    assert (here / "precious.txt").read_text() == "keep me"
    assert sorted(os.listdir(here)) == ["precious.txt"]


def test_a_diverged_run_exits_3_with_a_record_and_is_not_retried(captions, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli(captions, out, "--lr", "1e6", steps=6) == cli.EXIT_DIVERGED == 3
    err = capsys.readouterr().err
    record = json.loads((out / "diverged.json").read_text())
    assert record["lr"] == 1e6 and 1 <= record["step"] <= 6 and "float16" in record["error"] \
        or "nan" in record["error"] or "inf" in record["error"]
    assert err == (f"minialign train: {out}: diverged ({record['error']}) at lr 1e+06; recorded "
                   f"in diverged.json. Lower --lr, or pass --force to start over\n")   # once
    assert train_cli(captions, out, "--lr", "1e6", "--resume", steps=6) == 3
    assert capsys.readouterr().err == (
        f"minialign train: {out / 'diverged.json'}: this run diverged earlier "
        f"({record['error']}); not retried: lower --lr, or pass --force to start it over\n")
    assert not (out / "model.npz").exists()


def test_replicate_with_bad_captions_writes_nothing_and_the_fixed_rerun_works(captions, tmp_path,
                                                                              capsys):
    """Issue 8.6: bad captions used to leave protocol.json, which refused the corrected rerun."""
    bad, out = tmp_path / "bad.json", tmp_path / "results"
    bad.write_text('{"annotations": [{"image_id": 1, "id": 1, "caption": "a cat"}]}')
    grid = ["replicate", "--image-eval", "off", "--out", str(out), "--seeds", "0", "--steps", "2",
            "--objectives", "good_views", "--lr-search", "off", *TINY]
    assert main([*grid, "--captions", str(bad)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"minialign replicate: error: {bad}: ")
    assert not out.exists()
    out.mkdir()                                       # an --out holding no run may be reused,
    (out / "protocol.json").write_text(json.dumps({"base": {}, "seeds": [7]}))  # even so
    assert main([*grid, "--captions", str(captions)]) == 0
    assert (out / "runs" / "good_views-lr1.00e-03-seed0" / "metrics.json").exists()
