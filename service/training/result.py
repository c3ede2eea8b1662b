"""The outcome of one run: per-seed metrics, their aggregate, curves and final weights."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.config import RunConfig
from service.scoring.metrics import AggregateMetrics, EvalHistory, SeedMetrics
from service.scoring.sequence import longest_solved_summary


def _finite_or_none(a: np.ndarray) -> list:
    """JSON has no NaN/inf: write them as null."""
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, dtype=np.float64).ravel()]


@dataclass
class RunResult:
    config: RunConfig
    thresholds: dict[str, float]
    seeds: list[SeedMetrics]
    aggregate: AggregateMetrics
    history: EvalHistory
    weights: dict[str, np.ndarray]  # name -> [S, out, in]
    reinitialisations: list[int]
    elapsed_s: float
    device: str
    compiled: bool
    params_sha256: str = ""  # digest of the final parameters (bit-identical runs share it)

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain JSON values (NaN/inf become null)."""
        h = self.history
        return {
            "config": self.config.model_dump(mode="json"),
            # the schedule λ(t) actually used (the scaled reference default when none was given)
            "regularizer": self.config.regularizer().model_dump(mode="json"),
            "thresholds": self.thresholds,
            "aggregate": self.aggregate.model_dump(mode="json"),
            "seeds": [
                {**s.model_dump(mode="json"), "reinitialisations": r}
                for s, r in zip(self.seeds, self.reinitialisations)
            ],
            "history": {
                "steps": h.steps.tolist(),
                "interpolation_mse": [_finite_or_none(row) for row in h.interpolation_mse],
                "extrapolation_mse": {
                    n: [_finite_or_none(row) for row in v] for n, v in h.extrapolation_mse.items()
                },
            },
            "weights": {
                name: [[_finite_or_none(row) for row in w] for w in ws]
                for name, ws in self.weights.items()
            },
            **self._sequence_summary(),
            "elapsed_s": self.elapsed_s,
            "device": self.device,
            "compiled": self.compiled,
            "params_sha256": self.params_sha256,
        }

    def _sequence_summary(self) -> dict[str, Any]:
        """Recurrent tasks: the test lengths and each seed's longest length solved."""
        task = self.config.task
        if not getattr(task, "recurrent", False):
            return {}
        values, median = longest_solved_summary(task, self.seeds)
        return {"sequence": {"train_length": task.train_length, "test_lengths": list(task.test_lengths),
                             "longest_length_solved": values, "longest_length_solved_median": median}}

    def save_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False, default=_json_default)
        path.write_text(text)
        return path


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
