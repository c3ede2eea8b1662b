"""One trial's metrics from its tasks: a setting is only as robust as its worst task."""

from __future__ import annotations

from service.scoring.metrics import AggregateMetrics
from service.scoring.objective import OBJECTIVE, metrics_of


def combine_tasks(per_task: dict[str, tuple[float, AggregateMetrics]]) -> dict[str, float]:
    """Objective = the worst task's; unprefixed metrics are that task's; with several tasks
    each task's metrics are also given as ``<task>.<metric>``."""
    worst = min(per_task, key=lambda n: per_task[n][0])
    value, agg = per_task[worst]
    metrics = {OBJECTIVE: value, **metrics_of(agg)}
    if len(per_task) > 1:
        for name, (v, a) in per_task.items():
            metrics[f"{name}.{OBJECTIVE}"] = v
            metrics.update(metrics_of(a, prefix=f"{name}."))
    return metrics

