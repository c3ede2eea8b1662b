"""Metrics against hand-computed values; success thresholds by simulation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from service.scoring.metrics import (
    AggregateMetrics,
    EvalHistory,
    aggregate,
    mean_interval,
    median_interval,
    per_seed_metrics,
    sparsity_error,
    t_quantile,
    wilson_interval,
)
from service.tasks import ArithmeticTask, IdentityTask, SingleUnitTask, SmallMulTask
from service.tasks import base as task_base

EPS = 1e-5


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NALU_SWEEP_CACHE_DIR", str(tmp_path))


# -- intervals -----------------------------------------------------------------------------------
def test_wilson_interval_by_hand() -> None:
    low, high = wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    low2, high2 = wilson_interval(2, 10)
    assert low2 == pytest.approx(1 - high) and high2 == pytest.approx(1 - low)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(16, 16)[0] == pytest.approx(0.8064, abs=1e-4)


def test_t_quantiles_match_the_tables() -> None:
    for df, value in [(1, 12.706), (2, 4.303), (9, 2.262), (30, 2.042), (100, 1.984), (5000, 1.960)]:
        assert t_quantile(0.95, df) == pytest.approx(value, abs=1e-3)


def test_mean_and_median_intervals_by_hand() -> None:
    mean, low, high = mean_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.1824 * math.sqrt(5 / 3) / 2
    assert mean == 2.5 and low == pytest.approx(2.5 - half, abs=1e-3) and high == pytest.approx(2.5 + half, abs=1e-3)
    assert mean_interval([0.03, 0.25], floor=0.0) == pytest.approx((0.14, 0.0, mean_interval([0.03, 0.25])[2]))
    assert mean_interval([1.0, 2.0, 3.0, 4.0], floor=0.0) == (mean, low, high)  # above the floor: unchanged
    assert mean_interval([7.0]) == (7.0, None, None)
    assert mean_interval([]) == (None, None, None)
    # n = 10: [x(2), x(9)] covers the median with probability 1 − 2·11/1024 ≈ 0.979
    assert median_interval(np.arange(10.0, 0.0, -1.0)) == (5.5, 2.0, 9.0)
    assert median_interval(np.arange(100.0))[1:] == (39.0, 60.0)
    assert median_interval([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)  # too few: the sample range
    assert median_interval([]) == (None, None, None)


# -- success thresholds -------------------------------------------------------------------------------
def test_threshold_arithmetic_mul_and_add_match_the_spec() -> None:
    mul = ArithmeticTask(operation="mul", threshold_samples=20_000).success_thresholds()
    add = ArithmeticTask(operation="add", threshold_samples=20_000).success_thresholds()
    assert list(mul) == ["extrapolation"]
    assert mul["extrapolation"] == pytest.approx(0.16, rel=0.1)
    assert add["extrapolation"] == pytest.approx(1.6e-5, rel=0.1)


def test_threshold_add_closed_form() -> None:
    """Arithmetic add on U[2,6]: δ = Σ_i c_i·ε·x_i with c_i = −2 on A∩B, 0 on A xor B and +2
    elsewhere, so MSE = ε²(μ²(Σc)² + σ²Σc²) = ε²(16·100² + 4/3·(12·4 + 62·4))."""
    task = ArithmeticTask(operation="add", threshold_samples=20_000)
    coeff = (task.perturbed_selection() - task.selection()).sum(0) / EPS
    assert sorted(set(coeff.round().tolist())) == [-2.0, 0.0, 2.0]
    assert coeff.sum().item() == pytest.approx(100.0)
    expected = EPS ** 2 * (16.0 * 100.0 ** 2 + 4.0 / 3.0 * (12 * 4 + 62 * 4))
    assert task.success_thresholds()["extrapolation"] == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("redundant", [0, 10])
def test_threshold_single_unit_add_closed_form(redundant: int) -> None:
    """One NAU row [1, 1, 0…] → [1−ε, 1−ε, ε…]: δ = ε(Σ_r x_r − x1 − x2), so on U[2,6]
    MSE = ε²((2 + R)σ² + (R − 2)²μ²)."""
    task = SingleUnitTask(operation="add", redundant_inputs=redundant, threshold_samples=20_000)
    mu, var = 4.0, 16.0 / 12.0
    expected = EPS ** 2 * ((2 + redundant) * var + (redundant - 2) ** 2 * mu ** 2)
    assert task.success_thresholds()["extrapolation"] == pytest.approx(expected, rel=0.03)


def test_threshold_identity_closed_form_per_range() -> None:
    task = IdentityTask(extrapolation={"wide": "U[-20,20]", "far": "U[20,40]"}, threshold_samples=20_000)
    got = task.success_thresholds()
    assert list(got) == ["wide", "far"]
    assert got["wide"] == pytest.approx(EPS ** 2 * 400 / 3, rel=0.03)  # ε² E[x²]
    assert got["far"] == pytest.approx(EPS ** 2 * (20 ** 2 + 20 * 40 + 40 ** 2) / 3, rel=0.03)


def test_threshold_is_cached_in_memory_and_on_disk(tmp_path) -> None:
    task = SmallMulTask(threshold_samples=5_000)
    first = task.success_thresholds()
    assert SmallMulTask(threshold_samples=5_000).success_thresholds() == first
    files = list((tmp_path / "thresholds").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["thresholds"] == first
    task_base._thresholds_cached.cache_clear()
    (files[0]).write_text(json.dumps({"thresholds": {"extrapolation": 123.0}}))
    assert task.success_thresholds() == {"extrapolation": 123.0}  # read back from disk
    # eval_samples does not change the threshold's key
    assert SmallMulTask(threshold_samples=5_000, eval_samples=50).success_thresholds() == {"extrapolation": 123.0}


# -- per seed ------------------------------------------------------------------------------------------------
NAN = float("nan")


def _history() -> EvalHistory:
    # seeds: 0 succeeds, 1 fails at its best step, 2 is all NaN, 3 diverged after looking solved
    interp = [[1.0, 1.0, NAN, 1.0],
              [0.5, NAN, NAN, 0.01],
              [0.1, 0.3, NAN, NAN],
              [0.2, 0.4, NAN, NAN]]
    near = [[10.0, 1.0, NAN, 1.0],
            [0.05, NAN, NAN, 0.001],
            [0.01, 0.5, NAN, NAN],
            [0.5, 0.05, NAN, NAN]]
    far = [[10.0, 1.0, NAN, 1.0],
           [5.0, NAN, NAN, 0.001],
           [0.5, 0.5, NAN, NAN],
           [0.9, 0.5, NAN, NAN]]
    return EvalHistory(steps=[0, 1000, 2000, 3000], interpolation_mse=interp,
                       extrapolation_mse={"near": near, "far": far})


def _seeds():
    return per_seed_metrics(
        _history(), {"near": 0.1, "far": 1.0},
        sparsity_error=[0.01, 0.2, NAN, 0.0],
        diverged=[False, False, True, True],
        diverged_at=[None, -1, 0, 2000],
        seed_ids=[10, 11, 12, 13],
        final_sparsity_error=[0.03, 0.25, NAN, 0.5],
    )


def test_per_seed_metrics_by_hand() -> None:
    s0, s1, s2, s3 = _seeds()
    assert [s.seed for s in (s0, s1, s2, s3)] == [10, 11, 12, 13]

    assert s0.best_step == 2000 and s0.interpolation_mse == 0.1
    assert s0.extrapolation_mse == {"near": 0.01, "far": 0.5}
    assert s0.success and s0.success_per_range == {"near": True, "far": True}
    assert s0.solved_at == 2000  # near is below from 1000, far only from 2000
    assert s0.solved_at_per_range == {"near": 1000, "far": 2000}
    assert not s0.diverged and s0.diverged_at is None

    assert s1.best_step == 2000  # NaN at step 1000 ranks as +inf
    assert not s1.success and s1.success_per_range == {"near": False, "far": True}
    assert s1.solved_at is None  # below at step 3000, but a failed seed has no solved_at
    assert s1.solved_at_per_range == {"near": None, "far": 2000}
    assert s1.diverged_at is None

    assert s2.best_step == 0 and math.isnan(s2.interpolation_mse)
    assert not s2.success and s2.solved_at is None and s2.diverged_at == 0

    assert s3.best_step == 1000 and s3.extrapolation_mse == {"near": 0.001, "far": 0.001}
    assert not s3.success and s3.success_per_range == {"near": False, "far": False}
    assert s3.solved_at is None and s3.diverged and s3.diverged_at == 2000


def test_per_seed_metrics_checks_its_inputs() -> None:
    with pytest.raises(ValueError, match="far"):
        per_seed_metrics(_history(), {"near": 0.1}, [0.0] * 4, [False] * 4)
    with pytest.raises(ValueError, match="sparsity_error"):
        per_seed_metrics(_history(), {"near": 0.1, "far": 1.0}, [0.0] * 3, [False] * 4)
    empty = EvalHistory(steps=[], interpolation_mse=np.zeros((0, 2)),
                        extrapolation_mse={"e": np.zeros((0, 2))})
    seeds = per_seed_metrics(empty, {"e": 1.0}, [0.0, 0.0], [False, False])
    assert [s.best_step for s in seeds] == [None, None] and not any(s.success for s in seeds)


def test_seed_metrics_json_has_no_nan() -> None:
    s2 = _seeds()[2]
    data = s2.model_dump(mode="json")
    assert data["interpolation_mse"] is None and data["sparsity_error"] is None
    assert data["final_sparsity_error"] is None
    json.dumps(data, allow_nan=False)


# -- over seeds ----------------------------------------------------------------------------------------------
def test_aggregate_by_hand() -> None:
    agg = aggregate(_seeds())
    assert (agg.n_seeds, agg.successes, agg.success_rate, agg.diverged) == (4, 1, 0.25, 2)
    assert (agg.success_ci_low, agg.success_ci_high) == pytest.approx(wilson_interval(1, 4))
    assert agg.success_rate_per_range == {"near": 0.25, "far": 0.5}
    assert (agg.solved_at_median, agg.solved_at_median_ci_low, agg.solved_at_median_ci_high) == (2000, 2000, 2000)
    assert agg.solved_at_mean == 2000 and agg.solved_at_mean_ci_low is None
    # the papers' figure: solved seeds only (seed 0), at the best step
    assert agg.sparsity_error_mean == pytest.approx(0.01)
    assert agg.sparsity_error_ci_low is None and agg.sparsity_error_ci_high is None  # one value
    # the final model's figure: the two non-diverged seeds, kept under its own name
    _, low, high = mean_interval([0.03, 0.25])
    assert agg.final_sparsity_error_mean == pytest.approx(0.14)
    # 0.14 ± 1.40 from two seeds: a sparsity error is never negative, so the interval ends at 0
    assert low < 0 and (agg.final_sparsity_error_ci_low, agg.final_sparsity_error_ci_high) == pytest.approx((0, high))
    assert agg.to_metrics()["final_sparsity_error_mean"] == pytest.approx(0.14)
    assert agg.interpolation_mse_median == pytest.approx(0.1)  # of 0.1, 0.3, 0.01 (NaN left out)
    assert agg.extrapolation_mse_median == {"near": pytest.approx(0.01), "far": pytest.approx(0.5)}
    metrics = agg.to_metrics()
    assert metrics["success_rate"] == 0.25 and metrics["extrapolation_mse_median.far"] == 0.5
    assert "solved_at_mean_ci_low" not in metrics
    json.dumps(agg.model_dump(mode="json"), allow_nan=False)


def test_aggregate_of_failed_and_empty_runs() -> None:
    failed = [s for s in _seeds() if not s.success]
    agg = aggregate(failed)
    assert agg.successes == 0 and agg.success_ci_low == 0.0
    assert agg.solved_at_median is None and agg.solved_at_mean is None
    assert agg.solved_at_median_ci_low is None and agg.solved_at_mean_ci_high is None
    empty = aggregate([])
    assert isinstance(empty, AggregateMetrics)
    assert (empty.n_seeds, empty.success_rate, empty.success_ci_low, empty.success_ci_high) == (0, 0.0, 0.0, 1.0)
    assert empty.sparsity_error_mean is None and empty.interpolation_mse_median is None
    all_nan = per_seed_metrics(
        EvalHistory(steps=[0], interpolation_mse=[[NAN, NAN]], extrapolation_mse={"e": [[NAN, NAN]]}),
        {"e": 1.0}, [NAN, NAN], [True, True], [0, 0])
    agg = aggregate(all_nan)
    assert agg.diverged == 2 and agg.interpolation_mse_median is None
    assert agg.extrapolation_mse_median == {"e": None} and agg.sparsity_error_mean is None
    assert agg.final_sparsity_error_mean is None


def test_sparsity_error_is_averaged_over_solved_seeds_only() -> None:
    """The NAU paper's figure: failed (even non-diverged, very sparse) seeds and diverged ones
    do not enter ``sparsity_error_mean``; every non-diverged seed enters the final figure."""
    history = EvalHistory(steps=[0, 10], interpolation_mse=[[1.0, 1.0, 1.0, 1.0, NAN], [0.1, 0.1, 2.0, 0.1, NAN]],
                          extrapolation_mse={"e": [[9.0, 9.0, 9.0, 9.0, NAN], [0.5, 0.5, 0.5, 5.0, NAN]]})
    seeds = per_seed_metrics(history, {"e": 1.0}, sparsity_error=[0.1, 0.3, 0.0, 0.0, NAN],
                             diverged=[False, False, False, False, True],
                             final_sparsity_error=[0.2, 0.4, 0.0, 0.0, NAN])
    # seed 2's best step is 0 (its MSE rose): it fails there; seed 3 fails at its best step
    assert [s.success for s in seeds] == [True, True, False, False, False]
    agg = aggregate(seeds)
    mean, low, high = mean_interval([0.1, 0.3], floor=0.0)
    assert agg.sparsity_error_mean == pytest.approx(0.2) == pytest.approx(mean)
    assert (agg.sparsity_error_ci_low, agg.sparsity_error_ci_high) == pytest.approx((low, high))
    assert agg.final_sparsity_error_mean == pytest.approx(0.15)  # (0.2 + 0.4 + 0 + 0) / 4
    assert [s.final_sparsity_error for s in seeds[:4]] == [0.2, 0.4, 0.0, 0.0]


# -- sparsity error -------------------------------------------------------------------------------------------
def test_sparsity_error_by_hand() -> None:
    w1 = [[[0.1, 0.95, -1.0]], [[0.5, 0.0, 1.0]]]  # per seed: max(0.1, 0.05, 0) and max(0.5, 0, 0)
    w2 = [[[-0.3]], [[0.2]]]
    got = sparsity_error([np.array(w1), np.array(w2)])
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, [0.3, 0.5])
    got_t = sparsity_error([torch.tensor(w1), torch.tensor(w2)])
    assert isinstance(got_t, torch.Tensor)
    torch.testing.assert_close(got_t, torch.tensor([0.3, 0.5], dtype=got_t.dtype))
    with_nan = sparsity_error([torch.tensor([[[NAN, 0.0]], [[1.0, 0.0]]])])
    assert math.isnan(with_nan[0].item()) and with_nan[1].item() == 0.0
    assert sparsity_error([np.array([[[-1.2, 1.5]]])])[0] == pytest.approx(0.5)  # |1 − |W|| out of bounds
