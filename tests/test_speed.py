"""machinery/speed.py: steps to a target, to 50% / 90% of the final value, area under the curve,
on curves small enough to check by hand."""
import pytest

from minialign.machinery.speed import curve_auc, first_step_reaching, speed_numbers

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
