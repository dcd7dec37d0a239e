""""Aligns faster", measured: how quickly a run's validation curve gets somewhere, from the
evaluations it saved (metrics.json "evals": every eval_every steps and the last step).

For one run's curve (steps s_1 < ... < s_K, values v_1..v_K of one metric, higher is better):
    steps_to_target   the first evaluated step with v_k >= target; the paper's sense of
                      "faster" uses target = next-token prediction's final value at the same
                      seed (how many steps good views need to get where next-token ends)
    steps_to_50 / 90  the first evaluated step with v_k >= 0.5 v_K / 0.9 v_K (its own final)
    auc               the area under the curve by the trapezoid rule, divided by s_K - s_1:
                      the curve's mean value over training, in the metric's units
Steps are resolved to the evaluation grid (eval_every): no interpolation between evaluations.
Step 0 (the untrained encoder, evaluated since #22) is where fig_curves starts each curve, not
a result of training: these numbers read the evaluations after it, as before it existed.
A target never reached gives None (reported as "not reached", never as a number).
speed_summary: these per objective, mean_std over its seeds (report.collect's "speed").
"""
import numpy as np


def first_step_reaching(steps, values, target):
    """The first steps[k] with values[k] >= target, or None. steps, values: equal-length
    sequences (K,), steps increasing."""
    for step, value in zip(steps, values):
        if value >= target:
            return int(step)
    return None


def curve_auc(steps, values):
    """Trapezoid area under values(steps) over [steps[0], steps[-1]], divided by its length:
    the mean value over training. One point: that value. Raises ValueError for no points."""
    s = np.asarray(steps, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if len(s) == 0:
        raise ValueError("curve_auc: empty curve")
    if len(s) == 1:
        return float(v[0])
    area = np.sum((s[1:] - s[:-1]) * (v[1:] + v[:-1]) / 2)
    return float(area / (s[-1] - s[0]))


def speed_numbers(steps, values, target=None):
    """{"steps_to_target", "steps_to_50", "steps_to_90", "auc"} of one run's val curve.
    target: the value for steps_to_target (e.g. next_token's final at the same seed); None
    leaves steps_to_target None. A final value <= 0 leaves steps_to_50/90 None (a fraction of
    it says nothing)."""
    final = values[-1]
    fraction = (lambda f: first_step_reaching(steps, values, f * final)) if final > 0 else \
        (lambda f: None)
    return {"steps_to_target": None if target is None else
            first_step_reaching(steps, values, target),
            "steps_to_50": fraction(0.5), "steps_to_90": fraction(0.9),
            "auc": curve_auc(steps, values)}


def mean_std(values):
    """{"mean", "std" (sample std, ddof 1; None for one value), "values"}; None if empty."""
    if not values:
        return None
    return {"mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)) if len(values) > 1 else None,
            "values": list(values)}


def trained(curve, metric):
    """(steps, values) of a curve's evaluations after step 0 (all of them if it has no other)."""
    kept = [(s, v) for s, v in zip(curve["step"], curve[metric]) if s > 0] or \
        list(zip(curve["step"], curve[metric]))
    return [s for s, _ in kept], [v for _, v in kept]


def speed_summary(runs, seed_runs, metric):
    """Per objective, over its seeds (speed_numbers): steps to next_token's final val value at
    the same seed ("not_reached" counts the seeds whose next_token run has finished but which
    never get there; "target": next_token's final over the seeds compared, what fig_curves
    draws), to 50% / 90% of its own final value, and the curve's mean (auc), each as mean_std.
    runs: {name: report.run_numbers dict}; seed_runs: {objective: names of its finished
    seed-grid runs}; metric: the curves' key."""
    finals = {runs[n]["seed"]: runs[n]["curve"][metric][-1]
              for n in seed_runs.get("next_token", []) if metric in runs[n]["curve"]}
    summary = {}
    for obj, names in seed_runs.items():
        seeds = [runs[n]["seed"] for n in names if metric in runs[n]["curve"]]
        per_seed = [speed_numbers(*trained(runs[n]["curve"], metric), finals.get(runs[n]["seed"]))
                    for n in names if metric in runs[n]["curve"]]
        summary[obj] = {key: mean_std([s[key] for s in per_seed if s[key] is not None])
                        for key in ("steps_to_target", "steps_to_50", "steps_to_90", "auc")}
        summary[obj]["not_reached"] = sum(s["steps_to_target"] is None
                                          for seed, s in zip(seeds, per_seed) if seed in finals)
        summary[obj]["target"] = mean_std([finals[seed] for seed in seeds if seed in finals])
    return summary
