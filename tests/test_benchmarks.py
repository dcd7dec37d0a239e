"""The tools beside the package: benchmarks/ (bench.py, torch_step.py, lockstep.py) and
scripts/ablations.py, on numbers worked out by hand and tiny runs. No timing is asserted: a
speed is what the tools print."""
import json
import math
import sys

import numpy as np
import pytest
from conftest import NEEDS_FAST_PATH, ROOT
from test_layers import ragged_tokens

from minialign.data import Batch
from minialign.model import ModelConfig, init_params
from minialign.objectives import OBJECTIVES
from minialign.tokenizer import BOS, EOS, PAD
from minialign.train import TrainConfig

sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "scripts")]
import ablations  # noqa: E402
import bench  # noqa: E402
import lockstep  # noqa: E402
import torch_step  # noqa: E402

TINY = dict(vocab_size=10, max_len=8, d_model=4, n_layers=2, n_heads=2, mlp_ratio=2)  # F 8, Dh 2
# a | b of B = 2 photos: lengths 4, 2 | 3, 3; n = 12 real tokens, T = 4
TOKENS = np.array([[BOS, 7, 8, EOS], [BOS, EOS, PAD, PAD], [BOS, 5, EOS, PAD], [BOS, 6, EOS, PAD]])
SIZES = ["--batch-photos", "4", "--d-model", "8", "--n-layers", "1", "--n-heads", "2",
         "--warmup", "1", "--steps", "1", "--threads", "1"]


def step_flops(objective, layers):
    gemms = bench.step_gemms(bench.encoded(objective, TOKENS), ModelConfig(**TINY, layers=layers),
                             objective)
    return bench.flops(gemms)


# per block, n = 12 rows: qkv 2*12*4*12 + out 2*12*4*4 + mlp 2 * 2*12*4*8 = 3072, x3 with the
# backward's dx and dw = 9216; two blocks: 18432. Attention: 6 products of 2 Tg^2 Dh per
# caption and head (H = 2) = 48 Bg Tg^2 per block. VICReg: 2 views x (C, dz) x 2 D^2 N (N = 2) = 256.
@NEEDS_FAST_PATH
def test_step_flops_by_hand_fast():
    # length groups (Bg, Tg) = (1, 2), (2, 3), (1, 4): 48 (4 + 18 + 16) = 1824 per block
    assert step_flops("good_views", "fast") == 18432 + 2 * 1824 + 256
    # next_token: + the tied head on n_t = 3 + 1 + 2 + 2 rows: 3 * 2 * 8 * D * V = 1920
    assert step_flops("next_token", "fast") == 18432 + 2 * 1824 + 256 + 1920
    # bad_views encodes a | a: groups (2, 2), (2, 4): 48 (8 + 32) = 1920 per block
    assert step_flops("bad_views", "fast") == 18432 + 2 * 1920 + 256


def test_step_flops_by_hand_reference():
    # attention's projections on the padded 4 x 4 grid: 3 * (2*16*4*12 + 2*16*4*4) + 3 * 1536
    # = 10752 per block; its one grid (4, 4): 48 * 4 * 16 = 3072 per block; the pool (B2, n)
    # @ (n, D) and its backward: 2 * 2*4*12*4 = 768
    assert step_flops("good_views", "reference") == 2 * 10752 + 2 * 3072 + 768 + 256


def test_bench_prints_each_objective(captions, capsys):
    """On the reference layers (the fast ones take the same path, their FLOPs counted above)."""
    results = bench.main(["--captions", str(captions), "--layers", "reference", "--gemms", *SIZES])
    out = capsys.readouterr().out.splitlines()
    assert [(r["objective"], r["layers"]) for r in results] == [
        (o, "reference") for o in ("good_views", "bad_views", "next_token")]
    for r in results:
        assert r["T"] >= 3 and r["real_tokens"] > 0 and r["steps_ms"] and r["threads"] == 1
        for key in ("ms_per_step", "gflop_per_step", "gflops", "peak_gflops", "gemm_ms"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["objective"], key)
        row = next(line for line in out if line.split()[:2] == [r["objective"], r["layers"]])
        assert f"{r['gflop_per_step']:.2f}" in row
    assert sum(line.startswith("  attn qkv dw ") for line in out) == len(results)


def test_bench_refuses_a_missing_captions_file_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"bench.py: error: .*nope.json"):
        bench.main(["--captions", str(tmp_path / "nope.json")])


@pytest.mark.parametrize("objective", ["good_views", "next_token"])
def test_torch_step_computes_minialigns_loss(objective, tmp_path, capsys):
    pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[bench]')")
    rng = np.random.default_rng(0)
    B, V = 6, 30
    tokens = ragged_tokens(rng, rng.integers(1, 8, 2 * B), 7)            # (2B, T) a | b
    cfg = TrainConfig(objective=objective, model=ModelConfig(
        vocab_size=V, d_model=16, n_layers=2, n_heads=2, max_len=8, layers="reference"))
    params = init_params(cfg.model, np.random.default_rng(1))
    loss = OBJECTIVES[objective](params, Batch(np.arange(B), tokens[:B], tokens[B:]), cfg,
                                 np.random.default_rng(2))[0]
    np.savez(tmp_path / "params.npz", **params)
    np.save(tmp_path / "tokens.npy", tokens)
    torch_step.main(["--torch", objective, "--tokens", str(tmp_path / "tokens.npy"), "--params",
                     str(tmp_path / "params.npz"), "--n-heads", "2", "--warmup", "0",
                     "--steps", "1", "--threads", "1"])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (r["T"], r["real_tokens"]) == (7, int((tokens != PAD).sum()))
    assert r["first_loss"] == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize("a, b, objective, tol", [
    ("reference:float32", "reference:float32", "good_views", 0.0),    # the same run twice
    pytest.param("fast:float64", "reference:float64", "next_token", 1e-12, marks=NEEDS_FAST_PATH)])
def test_lockstep_stays_identical_or_within_rounding(captions, capsys, a, b, objective, tol):
    rows = lockstep.main(["--captions", str(captions), "--steps", "4", "--batch-photos", "4",
                          "--warmup-steps", "2", "--d-model", "8", "--n-layers", "1", "--n-heads",
                          "2", "--at", "1,3", "--a", a, "--b", b, "--objective", objective])
    assert [r[0] for r in rows] == [1, 3, 4]
    assert all(0 <= rel <= tol and abs(la - lb) <= tol * abs(lb) for _, rel, la, lb in rows)
    assert capsys.readouterr().out.startswith("step 1: ||w_a - w_b|| / ||w_b|| = ")


def test_lockstep_relative_difference_by_hand():
    wa = {"x": np.array([3.0, 0.0], np.float32), "y": np.array([[0.0]], np.float32)}
    wb = {"x": np.array([0.0, 0.0]), "y": np.array([[4.0]])}
    assert lockstep.relative_difference(wa, wb) == pytest.approx(5.0 / 4.0)


def test_ablation_cell_on_hand_made_numbers():
    base = [0.10, 0.12, 0.14]                        # mean 0.12, std 0.02
    assert ablations.cell(base) == "0.120 ± 0.020"
    # pooled s = 0.02, noise up to 2 s sqrt(2/3) = 0.0327: +0.04 is beyond, +0.03 within
    assert ablations.cell([0.14, 0.16, 0.18], base) == "0.160 (+0.040, beyond 0.033)"
    assert ablations.cell([0.13, 0.15, 0.17], base) == "0.150 (+0.030, within 0.033)"
    assert ablations.cell([0.25], [0.2]) == "0.250 (+0.050, 1 seed)"
    assert ablations.cell([], base) == "-"
    assert ablations.changes("next_token_last") == "next_token"
    assert ablations.changes("bad_views_sigreg") == "bad_views"


def test_ablations_grid_writes_one_table(tmp_path, capsys):
    from minialign.machinery.synthetic import CAPTIONS_NAME, EMBEDDINGS_NAME, write_world
    world = tmp_path / "world"
    write_world(world, n_scenes=60, seed=0)
    table = ablations.main([
        "--captions", str(world / CAPTIONS_NAME), "--embeddings", str(world / EMBEDDINGS_NAME),
        "--out", str(tmp_path / "out"), "--steps", "2", "--batch-photos", "8",
        "--warmup-steps", "1", "--eval-every", "2", "--d-model", "8", "--n-layers", "1",
        "--n-heads", "2", "--seeds", "0", "1", "--jobs", "2"])
    assert (tmp_path / "out" / "ablations.md").read_text() == table
    lines = table.strip().split("\n")
    assert lines[0] == ("| objective | changes | test mutual-kNN@10 | test R@1 | "
                        "test paraphrase R@1 |")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in lines[2:]}
    assert list(rows) == list(ablations.THREE) + list(ablations.VARIANTS)
    assert rows["bad_views_drop"][0] == "bad_views" and rows["good_views"][0] == "(default)"
    assert all(" ± " in c for c in rows["next_token"][1:])
    assert all(("beyond" in c) != ("within" in c) for c in rows["next_token_last"][1:])
    assert "no real-caption column" in capsys.readouterr().out
