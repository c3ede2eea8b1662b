"""Per-length metrics of recurrent tasks: each test length is one "extrapolation range"
(``length_<L>``: the cell judged on the seed's own read-out) of the ordinary pipeline, and
so is the read-out's accuracy (``readout``); a length counts as solved only with the
read-out and every shorter length (`SequenceTask.range_prerequisites`), so per-seed
success, the Wilson interval, ``success_rate_per_range`` and the objective need nothing
new. This adds the per-length view and the longest length solved (docs/metrics-sequence.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from service.scoring.metrics import SeedMetrics, wilson_interval
from service.tasks.sequence import READOUT, SequenceTask, length_name


@dataclass(frozen=True)
class LengthRow:
    length: int | None  # None: the read-out's row
    successes: int
    n_seeds: int
    ci_low: float
    ci_high: float
    mse_median: float | None  # the cell's squared error on the seed's own read-out
    threshold: float

    @property
    def success_rate(self) -> float:
        return self.successes / self.n_seeds if self.n_seeds else 0.0


def longest_solved(seed: SeedMetrics, lengths: Sequence[int]) -> int:
    """The longest test length up to which the seed succeeds at every test length
    (0 when it fails the shortest; a length's success already needs the shorter ones')."""
    best = 0
    for length in sorted(lengths):
        if not seed.success_per_range.get(length_name(length), False):
            break
        best = length
    return best


def length_rows(task: SequenceTask, seeds: Sequence[SeedMetrics], thresholds: dict[str, float]) -> list[LengthRow]:
    """Success (with a 95% Wilson interval) and the cell's median squared error at each
    test length; then the read-out's row (``length`` None; its per-step MSE)."""
    rows = []
    for length, name in [*((n, length_name(n)) for n in task.test_lengths), (None, READOUT)]:
        ok = sum(s.success_per_range.get(name, False) for s in seeds)
        low, high = wilson_interval(ok, len(seeds))
        mse = np.array([s.extrapolation_mse.get(name, np.nan) for s in seeds], dtype=np.float64)
        mse = mse[~np.isnan(mse)]
        rows.append(LengthRow(length, ok, len(seeds), low, high,
                              float(np.median(mse)) if mse.size else None, thresholds[name]))
    return rows


def longest_solved_summary(task: SequenceTask, seeds: Sequence[SeedMetrics]) -> tuple[list[int], float | None]:
    """Every seed's longest solved length and their median."""
    values = [longest_solved(s, task.test_lengths) for s in seeds]
    return values, (float(np.median(values)) if values else None)


LONGEST_SOLVED = "longest_length_solved_median"
"""The metric key (MLflow, Tune) of the median over seeds of the longest length solved."""


def sequence_metrics(per_task: dict[str, tuple[object, Sequence[SeedMetrics]]]) -> dict[str, float]:
    """``{longest_length_solved_median: …}`` for a trial's recurrent tasks (``{task name:
    (task, seeds)}``; other tasks are skipped); prefixed ``<task>.`` when there are several."""
    out: dict[str, float] = {}
    for name, (task, seeds) in per_task.items():
        if isinstance(task, SequenceTask) and seeds:
            _, median = longest_solved_summary(task, seeds)
            key = LONGEST_SOLVED if len(per_task) == 1 else f"{name}.{LONGEST_SOLVED}"
            out[key] = float(median)
    return out
