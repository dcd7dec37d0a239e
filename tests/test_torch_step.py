"""benchmarks/torch_step.py, the PyTorch step `make bench-torch` times minialign against, is the
same model and loss: from the same weights, on the same ragged batch, its first-step loss equals
minialign's good_views / next_token loss to float32 rounding. Skipped without torch (the
optional [bench] extra)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minialign.data import Batch
from minialign.model import ModelConfig, init_params
from minialign.objectives import OBJECTIVES
from minialign.tokenizer import BOS, EOS
from minialign.train import TrainConfig

TORCH_STEP = Path(__file__).resolve().parents[1] / "benchmarks" / "torch_step.py"


def ragged_tokens(rng, captions, T, V):
    """(captions, T) ids: BOS, words, EOS, then PAD; lengths 3..T."""
    tokens = np.zeros((captions, T), np.int32)
    for row, n in zip(tokens, rng.integers(3, T + 1, size=captions)):
        row[:n] = [BOS, *rng.integers(5, V, size=n - 2), EOS]
    return tokens


@pytest.mark.parametrize("objective, kind", [("good_views", "views"), ("next_token", "ntp")])
def test_torch_step_computes_minialigns_loss(objective, kind, tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[bench]')")
    rng = np.random.default_rng(0)
    B, T, V = 6, 7, 30
    tokens = ragged_tokens(rng, 2 * B, T, V)                              # (2B, T) a | b
    cfg = TrainConfig(model=ModelConfig(vocab_size=V, d_model=16, n_layers=2, n_heads=2,
                                        max_len=8))
    params = init_params(cfg.model, np.random.default_rng(1))
    loss, _, _ = OBJECTIVES[objective](params, Batch(np.arange(B), tokens[:B], tokens[B:]),
                                       cfg, np.random.default_rng(2))
    np.savez(tmp_path / "params.npz", **params)
    np.save(tmp_path / "tokens.npy", tokens)
    out = subprocess.run([sys.executable, str(TORCH_STEP), "--kind", kind,
                          "--tokens", str(tmp_path / "tokens.npy"),
                          "--params", str(tmp_path / "params.npz"), "--n-heads", "2",
                          "--warmup", "0", "--steps", "1", "--threads", "1"],
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert (r["T"], r["real_tokens"]) == (T, int((tokens != 0).sum()))
    assert r["first_loss"] == pytest.approx(loss, rel=1e-5)
