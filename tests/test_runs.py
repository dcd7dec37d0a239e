"""A run's files (machinery/runs.py, checkpoint.py): atomic writes, same arrays same bytes,
one-line errors naming the file, the OS lock; the core's one reach into the machinery."""
import ast
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import POSIX_SIGNALS, ROOT

from minialign.machinery import runs
from minialign.tokenizer import SPECIALS, Tokenizer
from minialign.wordpiece import SPECIALS as BERT_SPECIALS, WordPieceTokenizer


def test_atomic_write_leaves_the_old_file_or_the_new_one(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "a.json"
    runs.write_json(path, {"x": 1})
    assert runs.read_json(path) == {"x": 1}

    def cut(fd):
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", cut)                  # dies after writing, before replace
    with pytest.raises(OSError, match="disk full"):
        runs.atomic_write(path, "x" * 10_000)
    assert runs.read_json(path) == {"x": 1}
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]      # no temporary left


def test_savez_same_arrays_same_bytes_and_errors_name_the_file(tmp_path):
    arrays = {"z": np.arange(6, dtype=np.float16).reshape(2, 3), "ids": np.array([3, 1])}
    runs.savez(tmp_path / "a.npz", **arrays)
    runs.savez(tmp_path / "b.npz", **arrays)
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    loaded = runs.load_npz(tmp_path / "a.npz")
    assert loaded.keys() == arrays.keys() and all(
        np.array_equal(loaded[k], v) and loaded[k].dtype == v.dtype for k, v in arrays.items())
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "config.json").write_text('{"config": {"no_such_field": 1}}')
    for read, arg, named, error in [(runs.load_npz, "bad.npz", "bad.npz", ValueError),
                                    (runs.load_npz, "no.npz", "no.npz", FileNotFoundError),
                                    (runs.read_json, "bad.json", "bad.json", ValueError),
                                    (runs.read_json, "no.json", "no.json", FileNotFoundError),
                                    (runs.read_config, ".", "config.json", ValueError)]:
        with pytest.raises(error) as err:
            read(tmp_path / arg)
        assert str(err.value).startswith(f"{tmp_path / named}: ") and "\n" not in str(err.value)


def test_caption_files_and_slots(tmp_path):
    slots = {f"slot{s}_{k}": (np.arange(n) * 7 if k == "image_ids" else np.ones((n, 3), np.float16))
             for s, n in enumerate((4, 4, 2)) for k in ("image_ids", "z")}
    for name in ("val_step00010.npz", "val_step00003.npz", "test_step00003.npz", "val_x.npz"):
        runs.savez(tmp_path / "captions" / name, **slots)
    found = runs.caption_files(tmp_path, "val")
    assert list(found) == [3, 10] and found[10].name == "val_step00010.npz"
    slots = runs.load_caption_slots(found[3])
    assert [(ids.tolist(), z.dtype, z.shape) for ids, z in slots] == \
        [([0, 7, 14, 21], np.float32, (4, 3))] * 2 + [([0, 7], np.float32, (2, 3))]
    runs.savez(tmp_path / "one.npz", slot0_image_ids=np.arange(2), slot0_z=np.ones((2, 3)))
    runs.savez(tmp_path / "odd.npz", slot0_image_ids=np.arange(2), slot0_z=np.ones((3, 3)))
    for bad in ("one.npz", "odd.npz"):
        with pytest.raises(ValueError, match=f"^{tmp_path / bad}: "):
            runs.load_caption_slots(tmp_path / bad)


def test_model_npz_brings_back_its_tokenizer():
    words = Tokenizer(vocab=SPECIALS + ("a", "dog"))
    pieces = WordPieceTokenizer(vocab=BERT_SPECIALS + ("a", "##s"))
    for tok in (words, pieces):
        back = runs.tokenizer_from_vocab(np.array(tok.vocab))
        assert type(back) is type(tok) and back.vocab == tok.vocab


HOLD = """import sys, time
from minialign.machinery.runs import lock
with lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)"""


@POSIX_SIGNALS
def test_the_lock_refuses_a_second_process_in_one_line_until_the_first_dies(tmp_path, captions,
                                                                             capsys):
    from minialign.__main__ import main
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT)                   # imports ./minialign
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(runs.Locked) as err:
            with runs.lock(run):
                pass
        assert str(err.value).startswith(f"{run}: in use by another minialign process")
        assert main(["train", "--captions", str(captions), "--out", str(run), "--steps", "1",
                     "--batch-photos", "4", "--d-model", "8", "--n-heads", "2"]) == 2
        assert capsys.readouterr().err == f"minialign train: error: {err.value}\n"
        assert [p.name for p in run.iterdir()] == [".lock"]              # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)                            # no clean-up of any kind
        holder.wait()
    with runs.lock(run):                                             # the OS released it
        pass


def test_the_core_reaches_into_the_machinery_once_and_guarded():
    """minialign/*.py but __main__.py import from the machinery only model.py's fast layers,
    in a try whose ImportError falls back to layers.py."""
    reaches = []
    for path in sorted(set((ROOT / "minialign").glob("*.py")) - {ROOT / "minialign/__main__.py"}):
        tree = ast.parse(path.read_text())
        guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
                   and any(getattr(h.type, "id", "") == "ImportError" for h in t.handlers)
                   for n in ast.walk(t)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [f"{'.' * node.level}{node.module or ''}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any("machinery" in n for n in names):
                reaches.append((path.name, names, id(node) in guarded))
    assert reaches == [("model.py", [".machinery.fast"], True)]
