"""The sweep objective: how robustly a setting learns, as one finite number (higher is better).

Primary: ``success_ci_low``, the lower end of the 95% Wilson interval of the success rate
(docs/domain/metrics.md: judge a setting by the lower end, not the point estimate; a diverged seed is a
failed seed). Tie-breakers, lexicographically: a lower median ``solved_at`` (as a fraction
of the step budget), then a lower mean ``sparsity_error`` (over solved seeds, each at its
best-validation step: the NAU paper's figure). They enter with weights far below
the smallest gap between two Wilson lower ends (``≈ 0.18 / S``, between 0 and 1 success;
above 1.7e-6 for S ≤ 10⁵), so they only order settings whose ``success_ci_low`` is equal:

    objective = success_ci_low + 1e-7 · (1 − solved_at_fraction) + 1e-10 · (1 − sparsity)

A setting with no successful seed (yet) has ``success_ci_low = 0`` and no ``solved_at``, and
the sparsity of wrong weights says nothing (weights stuck at 0 are perfectly "sparse").
Such settings are ranked instead by how far their median extrapolation MSE is above the
success threshold, so ASHA can tell a nearly-there setting from a hopeless one early:

    objective = 1e-10 · (1 − clip(log10(median MSE / threshold) / 10, 0, 1))

(worst range; 10 decades above the threshold or NaN count as 0). Any setting with a
success ranks above every setting without one. Undefined parts count as the worst value,
so the objective is never NaN and Optuna always receives a number.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # torch comes with the metrics: the read-only verbs need only OBJECTIVE
    from service.scoring.metrics import AggregateMetrics

SOLVED_AT_WEIGHT = 1e-7
SPARSITY_WEIGHT = 1e-10
CLOSENESS_WEIGHT = 1e-10
CLOSENESS_DECADES = 10.0
OBJECTIVE = "objective"


def _unit_interval(value: float | None, undefined: float) -> float:
    if value is None or not math.isfinite(float(value)):
        return undefined
    return min(1.0, max(0.0, float(value)))


def closeness(aggregate: AggregateMetrics, thresholds: Mapping[str, float] | None) -> float:
    """``1`` at or below every range's threshold, falling linearly in log10 of the worst
    median-MSE-to-threshold ratio to ``0`` at 10 decades above it (or when undefined)."""
    if not thresholds:
        return 0.0
    worst = 0.0
    for name, threshold in thresholds.items():
        mse = aggregate.extrapolation_mse_median.get(name)
        if mse is None or not math.isfinite(mse) or not threshold > 0:
            return 0.0
        worst = max(worst, math.log10(max(mse, 1e-300) / threshold))
    return 1.0 - _unit_interval(worst / CLOSENESS_DECADES, 1.0)


def objective_value(aggregate: AggregateMetrics, total_steps: int,
                    thresholds: Mapping[str, float] | None = None) -> float:
    """The lexicographic scalar of the module docstring, in ``[0, 1 + 1.1e-7]``."""
    if aggregate.successes == 0:
        return CLOSENESS_WEIGHT * closeness(aggregate, thresholds)
    ci_low = _unit_interval(aggregate.success_ci_low, 0.0)
    solved = aggregate.solved_at_median
    fraction = _unit_interval(None if solved is None else solved / max(1, total_steps), 1.0)
    sparsity = _unit_interval(aggregate.sparsity_error_mean, 1.0)
    return ci_low + SOLVED_AT_WEIGHT * (1.0 - fraction) + SPARSITY_WEIGHT * (1.0 - sparsity)


def metrics_of(aggregate: AggregateMetrics, prefix: str = "") -> dict[str, float]:
    """Flat finite metrics for MLflow and Tune (``prefix`` + AggregateMetrics keys)."""
    return {f"{prefix}{k}": v for k, v in aggregate.to_metrics().items()}
