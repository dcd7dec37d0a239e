"""The benchmark's FLOP count (machinery/timing/gemms.py) against hand counts, the replayed GEMMs'
operands, one tiny end-to-end run, and bench_torch's checks and children (no timing asserts:
speed is what `python -m minialign bench` reports, not what the tests check)."""
import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from minialign.machinery.timing import bench_torch
from minialign.machinery.timing.bench import KEYS, print_row, token_counts
from minialign.machinery.cli import add_bench_args, run_bench
from minialign.machinery.fastpath.fast_layers import packed_layout
from minialign.machinery.timing.gemms import attention_grids, gemm_calls, step_flops, step_gemms
from minialign.model import ModelConfig
from minialign.objectives import OBJECTIVES
from minialign.tokenizer import BOS, EOS, PAD

TINY = ModelConfig(vocab_size=10, d_model=4, n_layers=2, n_heads=2, mlp_ratio=2)  # F = 8


def test_token_counts_hand_count():
    # 2 sequences padded to T = 4: lengths 4 and 2 -> n = 6 real tokens; next-token targets:
    # positions 0-2 of the first, position 0 of the second -> n_t = 4
    tokens = np.array([[BOS, 7, 8, EOS], [BOS, EOS, PAD, PAD]])
    counts = token_counts("next_token", tokens)
    assert counts.pop("lengths").tolist() == [4, 2]
    assert counts == {"n_tokens": 6, "n_seqs": 2, "T": 4, "n_targets": 4}
    assert token_counts("good_views", tokens)["n_targets"] == 0


def test_step_flops_hand_count_two_grids():
    # lengths 4, 2: n = 6, attention grids (Bg, Tg) = (1, 2), (1, 4), two views of N = 1 caption
    # per block: 2 * 6 * (3*16 + 16 + 2*4*8) = 1536 linear + 4 * 4 * (2^2 + 4^2) = 320 attention
    # blocks: 3 * 2 blocks * 1856 = 11136; VICReg: 2 views x 2 products x 2*4*1*4 = 128
    # head on n_t = 4 rows: 3 * 2 * 4 * 4 * 10 = 960
    assert step_flops([4, 2], TINY) == 11136 + 128
    assert step_flops([4, 2], TINY, n_targets=4) == 11136 + 128 + 960


def test_step_flops_hand_count_length_groups():
    # lengths 5, 1, 3, 2: every length its own group -> grids (1, 1), (1, 2), (1, 3), (1, 5)
    assert attention_grids([5, 1, 3, 2], group_size=2) == [(1, 1), (1, 2), (1, 3), (1, 5)]
    assert attention_grids([3, 3, 3, 0, 2], group_size=2) == [(1, 2), (2, 3), (1, 3)]
    # per block: 2 * 11 * 128 = 2816 linear + 4 * 4 * (1 + 4 + 9 + 25) = 624 attention
    # blocks: 3 * 2 * (2816 + 624) = 20640; VICReg, N = 2: 4 * 2*4*2*4 = 256; head n_t = 7:
    # 3 * 2*7*4*10 = 1680
    assert step_flops([5, 1, 3, 2], TINY, n_targets=7, group_size=2) == 20640 + 256 + 1680
    assert step_flops([5, 1, 3, 2], TINY) == 20640 + 256


def test_attention_grids_match_fast_layers():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 20, size=150)                               # ragged, some empty
    mask = np.arange(lengths.max())[None, :] < lengths[:, None]           # (150, T)
    groups = packed_layout(mask, False, np.float32).groups
    assert [(g.Bg, g.Tg) for g in groups] == attention_grids(lengths)
    assert sum(g.Bg for g in groups) == np.count_nonzero(lengths)          # empty: in no group


def test_gemm_calls_shapes_counts_and_layouts():
    gemms = step_gemms([5, 4, 3, 2], TINY, n_targets=7, group_size=2)  # no size-1 axis
    calls = gemm_calls(gemms, np.random.default_rng(0))
    assert len(calls) == sum(g.count for g in gemms)
    expanded = [g for g in gemms for _ in range(g.count)]
    for g, (a, b, out) in zip(expanded, calls):
        lead = () if g.batch == 1 else (g.batch,)
        assert (a.shape, b.shape, out.shape) == (lead + (g.M, g.K), lead + (g.K, g.N),
                                                 lead + (g.M, g.N)), g
        assert a.swapaxes(-1, -2).flags.c_contiguous == g.a_t, g       # x.T: a transposed view
        assert b.swapaxes(-1, -2).flags.c_contiguous == g.b_t, g
        assert not np.shares_memory(out, a) and not np.shares_memory(out, b), g
    assert sum(g.flops for g in gemms) == sum(2 * a.size // a.shape[-1] * a.shape[-1]
                                              * b.shape[-1] for a, b, _ in calls)


def tiny_coco(path, n_photos=20):
    """A COCO-format captions file: n_photos photos with 3 captions of 2-6 words each."""
    rng = np.random.default_rng(0)
    words = ["a", "dog", "cat", "red", "car", "on", "the", "street", "runs", "sits"]
    annotations = [{"id": 10 * p + c, "image_id": p + 1,
                    "caption": " ".join(rng.choice(words, size=rng.integers(2, 7)))}
                   for p in range(n_photos) for c in range(3)]
    path.write_text(json.dumps({"images": [{"id": p + 1} for p in range(n_photos)],
                                "annotations": annotations}))
    return path


def test_run_bench_tiny_json(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_bench_args(parser)
    args = parser.parse_args([
        "--captions", str(tiny_coco(tmp_path / "caps.json")), "--json", "--steps", "1",
        "--warmup", "1", "--batch-photos", "4", "--d-model", "8", "--n-layers", "1",
        "--n-heads", "2", "--mlp-ratio", "2", "--gemm-rows", "64", "--gemm-square", "64"])
    results = run_bench(args)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == results
    assert [(r["objective"], r["layers"]) for r in results] == [
        (name, layers) for name in OBJECTIVES for layers in ("fast", "reference")]
    for r in results:
        for key in KEYS[1:-1]:
            assert math.isfinite(r[key]) and r[key] > 0, (r["objective"], key, r[key])
        assert r["steps"] == 1 and r["sequences"] == 8
        # a difference of two timings: on a busy machine one slow replay can make it negative
        assert r["non_gemm_share"] == pytest.approx(1 - r["gemm_ms"] / r["ms_per_step"])



def test_negative_non_gemm_share_is_printed_as_host_noise(capsys):
    row = {"objective": "good_views", "T": 16, "real_tokens": 5000, "ms_per_step": 3386,
           "ms_per_step_min": 3300, "gflop_per_step": 40.0, "gflops": 11.8, "peak_gflops": 50.0,
           "fraction_of_peak": 0.236, "gemm_ms": 3666, "non_gemm_share": 1 - 3666 / 3386,
           "peak_rss_mb": 700}
    print_row(row)                                           # the replay outran the step
    print_row(dict(row, gemm_ms=2709, non_gemm_share=0.2))
    assert capsys.readouterr().out.splitlines() == [
        "good_views  fast       16     5000    3386 (3300)      40.00     11.8      50.0     24%"
        "    3666      <0*     700",
        "  * non-GEMM <0: the GEMM replay was slower than the whole step (host noise); rerun",
        "good_views  fast       16     5000    3386 (3300)      40.00     11.8      50.0     24%"
        "    2709      20%     700"]


def test_use_cores_sets_numpy_blas_threads_and_refuses_zero():
    from minialign.machinery.run import machine
    before = machine.cores()
    try:
        assert machine.use_cores(1) is True          # numpy's wheels ship OpenBLAS
        assert machine.cores() == 1 and machine.blas_threads() == 1
        machine.use_cores(2)
        assert machine.cores() == 2 and machine.blas_threads() == 1   # the pool holds the cores
        with pytest.raises(ValueError, match="n=0 must be an integer >= 1"):
            machine.use_cores(0)
    finally:
        machine.use_cores(before)


# ---------------------------------------------------------------- bench_torch
def test_pairs_default_to_the_repository_torch_step():
    args = bench_torch.parser().parse_args([])
    cfg = bench_torch.config_from_args(args, bench_torch.TrainConfig())
    bench_torch.check_pair_args(args, cfg)
    assert Path(args.torch_step) == Path(__file__).resolve().parents[1] / "benchmarks" / "torch_step.py"
    assert "shared" not in bench_torch.parser().format_help()       # no path outside the repository


def test_pairs_refuse_what_torch_step_cannot_time(tmp_path):
    args = bench_torch.parser().parse_args(["--torch-step", str(tmp_path / "nope.py")])
    cfg = bench_torch.config_from_args(args, bench_torch.TrainConfig())
    with pytest.raises(FileNotFoundError, match="--torch-step .*nope.py: no such file"):
        bench_torch.check_pair_args(args, cfg)
    args.torch_step = str(tiny_coco(tmp_path / "torch_step.py"))         # any existing file
    small = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, d_model=128))
    with pytest.raises(ValueError, match="--d-model 128: torch_step.py's model has d_model = 256"):
        bench_torch.check_pair_args(args, small)
    with pytest.raises(ValueError, match="--batch-photos 100: .* 512 captions"):
        bench_torch.check_pair_args(args, dataclasses.replace(cfg, batch_photos=100))


def test_pair_children_time_the_same_saved_batch(tmp_path):
    args = bench_torch.parser().parse_args(["--torch-step", "step.py", "--threads", "1"])
    cfg = dataclasses.replace(bench_torch.config_from_args(args, bench_torch.TrainConfig()),
                              model=dataclasses.replace(TINY, vocab_size=5814))
    ours, theirs = bench_torch.side_argvs("next_token", args, cfg, tmp_path / "b.npy")
    assert ours[ours.index("--tokens") + 1] == theirs[theirs.index("--tokens") + 1]
    assert " ".join(theirs[2:6]) == "--kind ntp --head valid"
    assert theirs[theirs.index("--V") + 1] == ours[ours.index("--vocab-size") + 1] == "5814"
    assert theirs[theirs.index("--threads") + 1] == ours[ours.index("--threads") + 1] == "1"


def test_pair_child_times_the_saved_batch(tmp_path, capsys):
    tokens = np.array([[BOS, 7, 8, EOS], [BOS, 9, EOS, PAD],
                       [BOS, 5, EOS, PAD], [BOS, 6, 7, EOS]])                # (2B, T), B = 2
    np.save(tmp_path / "b.npy", tokens)
    args = bench_torch.parser().parse_args([
        "--child", "good_views", "--tokens", str(tmp_path / "b.npy"), "--vocab-size", "12",
        "--max-len", "8", "--timed-steps", "1", "--warmup", "0"])
    args.gemm_rows = args.gemm_square = 64
    bench_torch.run_child_side(args)
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (r["objective"], r["T"], r["real_tokens"], r["sequences"]) == ("good_views", 4, 14, 4)
    cfg = ModelConfig(vocab_size=12, max_len=8)                           # the default sizes
    assert r["gflop_per_step"] == pytest.approx(step_flops([4, 3, 3, 4], cfg) / 1e9)


def test_pair_child_failure_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"the torch_step.py views process failed \(exit code 3\)"):
        bench_torch.run_json([sys.executable, "-c", "import sys; sys.exit(3)"],
                             "torch_step.py views")
    assert bench_torch.run_json([sys.executable, "-c", "print('x'); print('{\"a\": 1}')"],
                                "child") == {"a": 1}
