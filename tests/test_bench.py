"""The benchmark's FLOP count against a hand count, and one tiny end-to-end run (no timing
asserts: speed is what `python -m minialign bench` reports, not what the tests check)."""
import argparse
import json
import math

import numpy as np
import pytest

from minialign.machinery.bench import KEYS, step_flops, token_counts
from minialign.machinery.cli import add_bench_args, run_bench
from minialign.model import ModelConfig
from minialign.objectives import OBJECTIVES
from minialign.tokenizer import BOS, EOS, PAD


def test_step_flops_hand_count():
    # 2 sequences padded to T = 4: lengths 4 and 2 -> n = 6 real tokens; next-token targets:
    # positions 0-2 of the first, position 0 of the second -> n_t = 4
    tokens = np.array([[BOS, 7, 8, EOS], [BOS, EOS, PAD, PAD]])
    counts = token_counts("next_token", tokens)
    assert counts == {"n_tokens": 6, "n_seqs": 2, "T": 4, "n_targets": 4}
    assert token_counts("good_views", tokens)["n_targets"] == 0
    cfg = ModelConfig(vocab_size=10, d_model=4, n_layers=2, n_heads=2, mlp_ratio=2)  # F = 8
    # per block: 2 * 6 * (3*16 + 16 + 2*4*8) = 12 * 128 = 1536 per-token
    #            + 4 * 2 * 4^2 * 4 = 512 attention                      -> 2048
    # forward: 2 blocks * 2048 = 4096, + head 2 * 4 * 4 * 10 = 320      -> 4416
    # step = forward + backward (2 x forward) = 3 * 4416 = 13248
    assert step_flops(6, 2, 4, cfg, n_targets=4) == 13248
    assert step_flops(6, 2, 4, cfg) == 3 * 4096


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
    assert [r["objective"] for r in results] == list(OBJECTIVES)
    for r in results:
        for key in KEYS[1:]:
            assert math.isfinite(r[key]) and r[key] > 0, (r["objective"], key, r[key])
        assert r["steps"] == 1 and r["sequences"] == 8



def test_use_cores_sets_numpy_blas_threads_and_refuses_zero():
    from minialign.machinery import machine
    before = machine.cores()
    try:
        assert machine.use_cores(1) is True          # numpy's wheels ship OpenBLAS
        assert machine.cores() == 1 and machine.blas_threads() == 1
        machine.use_cores(2)
        assert machine.cores() == 2 and machine.blas_threads() == min(2, machine.available_cores())
        with pytest.raises(ValueError, match="n=0 must be an integer >= 1"):
            machine.use_cores(0)
    finally:
        machine.use_cores(before)
