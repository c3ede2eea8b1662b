"""The objective: success_ci_low first, tie-breakers after it, never NaN; and a trial's
reports with Optuna/Tune out of the loop (a list collects them)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.scoring.metrics import AggregateMetrics, wilson_interval
from service.scoring.objective import OBJECTIVE, closeness, objective_value
from service.search.loading import parse_space
from service.sweep.results import STEP, is_metric_key
from service.sweep.trial import run_trial

STEPS = 10_000
THRESHOLDS = {"extrapolation": 0.1}


def agg(successes: int, n: int, solved_at: float | None = None, sparsity: float | None = 0.01,
        mse: float | None = 1.0) -> AggregateMetrics:
    low, high = wilson_interval(successes, n)
    return AggregateMetrics(
        n_seeds=n, successes=successes, success_rate=successes / n, success_ci_low=low,
        success_ci_high=high, success_rate_per_range={"extrapolation": successes / n},
        solved_at_median=solved_at, sparsity_error_mean=sparsity, diverged=0,
        interpolation_mse_median=mse, extrapolation_mse_median={"extrapolation": mse},
    )


@given(n=st.integers(1, 5000), data=st.data())
@settings(max_examples=200, deadline=None)
def test_more_successes_always_win(n, data):
    """k < k' successes rank lower whatever the tie-breakers (worst vs best)."""
    k = data.draw(st.integers(0, n - 1))
    worse = objective_value(agg(k, n, solved_at=0.0, sparsity=0.0, mse=0.0), STEPS, THRESHOLDS)
    better = objective_value(agg(k + 1, n, solved_at=float(STEPS), sparsity=1.0, mse=1e9), STEPS, THRESHOLDS)
    assert worse < better


def test_objective_is_the_ci_low_up_to_tie_breakers():
    a = agg(12, 16, solved_at=4000.0, sparsity=0.02)
    assert objective_value(a, STEPS) == pytest.approx(a.success_ci_low, abs=1e-6)


def test_tie_breakers_in_order():
    fast = objective_value(agg(8, 16, solved_at=2000.0, sparsity=0.3), STEPS)
    slow = objective_value(agg(8, 16, solved_at=6000.0, sparsity=0.0), STEPS)
    assert fast > slow  # solved_at before sparsity
    sparse = objective_value(agg(8, 16, solved_at=2000.0, sparsity=0.01), STEPS)
    assert sparse > fast


@pytest.mark.parametrize("undefined", [None, float("nan"), float("inf")])
def test_undefined_tie_breakers_count_as_the_worst(undefined):
    """A setting whose sparsity error (or solved_at) is unknown ranks as if it were the
    worst possible, below the same setting with any known value."""
    def value(solved_at=2000.0, sparsity=0.5):
        return objective_value(agg(8, 16, solved_at=solved_at, sparsity=sparsity), STEPS)

    assert value(sparsity=undefined) == value(sparsity=1.0) < value(sparsity=0.99) < value(sparsity=0.0)
    assert value(solved_at=undefined) == value(solved_at=float(STEPS)) < value(solved_at=STEPS - 1.0)


def test_settings_without_success_are_ranked_by_closeness_to_the_threshold():
    near = objective_value(agg(0, 16, mse=0.5), STEPS, THRESHOLDS)
    far = objective_value(agg(0, 16, mse=1e4), STEPS, THRESHOLDS)
    hopeless = objective_value(agg(0, 16, mse=float("nan")), STEPS, THRESHOLDS)
    one_success = objective_value(agg(1, 16, mse=1e6), STEPS, THRESHOLDS)
    assert hopeless == 0.0 < far < near < one_success
    assert closeness(agg(0, 16, mse=0.05), THRESHOLDS) == 1.0


maybe = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))


@given(successes=st.integers(0, 16), solved=maybe, sparsity=maybe, mse=maybe)
def test_objective_is_never_nan(successes, solved, sparsity, mse):
    value = objective_value(agg(successes, 16, solved, sparsity, mse), STEPS, THRESHOLDS)
    assert math.isfinite(value) and 0.0 <= value <= 1.0 + 1e-6


def test_metric_keys():
    assert is_metric_key("success_ci_low") and is_metric_key("objective")
    assert is_metric_key("extrapolation_mse_median.extrapolation")
    assert is_metric_key("small_mul.success_rate")
    assert not is_metric_key("time_this_iter_s") and not is_metric_key("training_iteration")


# -- a whole trial, without Ray: real training at a tiny size --------------------------------------------
def _tiny_space(**extra) -> object:
    data = {
        "name": "tiny", "steps": 200, "eval_every": 50, "seeds": 4,
        "task": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000},
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off",
                  "train": {"batch_size": 32, "regularizer": {"lambda_max": 0.1, "t_start": 50, "t_end": 150}}},
        "params": {"lr": {"type": "loguniform", "low": 1e-2, "high": 1e-1, "target": "train.optimizer.lr"}},
    }
    data.update(extra)
    return parse_space(data)


def test_trial_reports_every_evaluation_after_step_zero():
    reports = []
    progress = run_trial({"lr": 0.05}, _tiny_space(), reports.append)
    assert [r[STEP] for r in reports] == [50.0, 100.0, 150.0, 200.0]
    assert all(math.isfinite(r[OBJECTIVE]) for r in reports)
    assert progress.completed and progress.reports == 4
    final = reports[-1]
    assert final == {**progress.final_metrics, STEP: 200.0}
    for key in ("success_rate", "success_ci_low", "success_ci_high", "diverged", "n_seeds",
                "interpolation_mse_median", "extrapolation_mse_median.extrapolation"):
        assert key in final
    assert final["n_seeds"] == 4


def test_a_stop_inside_report_leaves_the_trial_not_completed():
    """ASHA stops a trial by raising inside `report`; the caller sees how far it got."""
    def report(metrics):
        if metrics[STEP] >= 100:
            raise SystemExit(0)

    from service.sweep.trial import TrialProgress

    progress = TrialProgress()
    with pytest.raises(SystemExit):
        run_trial({"lr": 0.05}, _tiny_space(), report, progress=progress)
    assert not progress.completed and progress.reports == 2


def test_several_tasks_are_scored_by_the_worst():
    space = _tiny_space(task=None, tasks={
        "small_mul": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000},
        "harder": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000,
                   "extrapolation": {"far": "U[2,20]"}},
    })
    reports = []
    progress = run_trial({"lr": 0.05}, space, reports.append)
    assert [r[STEP] for r in reports] == [50.0, 100.0, 150.0, 200.0, 250.0, 300.0, 350.0, 400.0]
    final = progress.final_metrics
    assert final[OBJECTIVE] == min(final["small_mul.objective"], final["harder.objective"])
    assert "harder.extrapolation_mse_median.far" in final
