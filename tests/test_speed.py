"""machinery/experiment/speed.py: steps to a target, to 50% / 90% of the final value, area under the curve,
on curves small enough to check by hand."""
import pytest

from minialign.machinery.experiment.speed import (curve_auc, first_step_reaching, mean_std,
                                                  speed_numbers, speed_summary)

STEPS = [100, 200, 300, 400]
VALUES = [0.05, 0.20, 0.30, 0.32]


def test_first_step_reaching_is_on_the_evaluation_grid():
    assert first_step_reaching(STEPS, VALUES, 0.20) == 200      # >=, not >
    assert first_step_reaching(STEPS, VALUES, 0.21) == 300
    assert first_step_reaching(STEPS, VALUES, 0.33) is None


def test_auc_is_the_trapezoid_mean_over_training():
    # (100 * (0.05 + 0.20) / 2 + 100 * (0.20 + 0.30) / 2 + 100 * (0.30 + 0.32) / 2) / 300
    assert curve_auc(STEPS, VALUES) == pytest.approx((12.5 + 25.0 + 31.0) / 300, abs=1e-15)
    assert curve_auc([50], [0.4]) == 0.4
    with pytest.raises(ValueError, match="empty curve"):
        curve_auc([], [])


def test_speed_numbers_of_one_curve():
    # final 0.32: 50% = 0.16 first reached at 200, 90% = 0.288 at 300; target 0.148 at 200
    assert speed_numbers(STEPS, VALUES, target=0.148) == {
        "steps_to_target": 200, "steps_to_50": 200, "steps_to_90": 300,
        "auc": pytest.approx(68.5 / 300)}
    assert speed_numbers(STEPS, VALUES)["steps_to_target"] is None
    flat = speed_numbers([10, 20], [0.0, 0.0], target=0.1)
    assert flat["steps_to_50"] is None and flat["steps_to_90"] is None
    assert flat["steps_to_target"] is None and flat["auc"] == 0.0


def run(seed, values, steps=(10, 20, 30)):
    return {"seed": seed, "curve": {"step": list(steps), "m": list(values)}}


def test_speed_summary_over_seeds():
    """Targets are next_token's final at the same seed (0.30 and 0.20); seed 2 has no finished
    next_token run, so it is neither compared nor counted as "never"."""
    runs = {"g0": run(0, [0.10, 0.35, 0.40]), "g1": run(1, [0.25, 0.30, 0.31]),
            "g2": run(2, [0.50, 0.50, 0.50]), "b0": run(0, [0.05, 0.10, 0.20]),
            "b1": run(1, [0.10, 0.20, 0.25]), "n0": run(0, [0.10, 0.20, 0.30]),
            "n1": run(1, [0.05, 0.10, 0.20])}
    seed_runs = {"good_views": ["g0", "g1", "g2"], "bad_views": ["b0", "b1"],
                 "next_token": ["n0", "n1"]}
    summary = speed_summary(runs, seed_runs, "m")
    good = summary["good_views"]
    assert good["steps_to_target"] == {"mean": 15.0, "std": pytest.approx(50 ** 0.5),
                                       "values": [20, 10]}                    # 0.35 >= 0.30, 0.25 >= 0.20
    assert good["not_reached"] == 0
    assert good["target"] == {"mean": 0.25, "std": pytest.approx(0.5 ** 0.5 * 0.1),
                              "values": [0.30, 0.20]}
    bad = summary["bad_views"]                # 0.20 < 0.30 at seed 0; 0.20 >= 0.20 at 20, seed 1
    assert bad["steps_to_target"]["values"] == [20] and bad["not_reached"] == 1
    assert summary["next_token"]["steps_to_target"]["values"] == [30, 30]
    assert summary["good_views"]["steps_to_50"]["values"] == [20, 10, 10]
    assert mean_std([]) is None and mean_std([2.0]) == {"mean": 2.0, "std": None, "values": [2.0]}
