"""benchmarks/lockstep.py, the measurement behind docs/protocol.md's rounding table: two runs
of one config from the same weights and batches. The same run twice stays bit-identical; fast
and reference in float64 stay within float64 rounding; the two losses it prints are those the
objective computes."""
import importlib.util
from pathlib import Path

import pytest
from conftest import NEEDS_FAST_PATH

from minialign.machinery.images.synthetic import CAPTIONS_NAME, write_world

LOCKSTEP = Path(__file__).resolve().parents[1] / "benchmarks" / "lockstep.py"


@pytest.fixture(scope="module")
def lockstep():
    spec = importlib.util.spec_from_file_location("lockstep", LOCKSTEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    write_world(out, n_scenes=60, seed=0)
    return str(out / CAPTIONS_NAME)


def tiny(world, *more):
    return ["--captions", world, "--steps", "6", "--batch-photos", "8", "--warmup-steps", "2",
            "--d-model", "8", "--n-layers", "1", "--n-heads", "2", "--at", "1,3", *more]


def test_the_same_run_twice_stays_identical(lockstep, world, capsys):
    rows = lockstep.main(tiny(world, "--a", "reference:float32", "--b", "reference:float32"))
    assert [r[0] for r in rows] == [1, 3, 6]
    assert all(rel == 0.0 and a == b for _, rel, a, b in rows)
    assert capsys.readouterr().out.splitlines()[0].startswith("step 1: ||w_a - w_b|| / ||w_b|| = 0.00e+00; loss ")


@NEEDS_FAST_PATH
def test_fast_and_reference_in_float64_stay_within_float64_rounding(lockstep, world):
    rows = lockstep.main(tiny(world, "--a", "fast:float64", "--b", "reference:float64",
                              "--objective", "next_token"))
    assert all(0 <= rel < 1e-12 and a == pytest.approx(b, rel=1e-12) for _, rel, a, b in rows)


def test_relative_difference_by_hand(lockstep):
    import numpy as np
    wa = {"x": np.array([3.0, 0.0], np.float32), "y": np.array([[0.0]], np.float32)}
    wb = {"x": np.array([0.0, 0.0]), "y": np.array([[4.0]])}
    assert lockstep.relative_difference(wa, wb) == pytest.approx(5.0 / 4.0)
    with pytest.raises(SystemExit):
        lockstep.parse(["--captions", "c", "--a", "fast:float16"])
