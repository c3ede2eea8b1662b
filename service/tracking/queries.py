"""Read sweeps back from MLflow for `nalu-sweep status` and `nalu-sweep best`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.search.objective import OBJECTIVE
from service.tracking import runs, store


@dataclass
class TrialRow:
    run_id: str
    name: str
    status: str
    outcome: str
    params: dict[str, str]
    metrics: dict[str, float]
    start_time: int | None = None

    @property
    def objective(self) -> float | None:
        return self.metrics.get(OBJECTIVE)


@dataclass
class SweepView:
    name: str
    experiment_id: str
    run_id: str
    status: str
    outcome: str
    params: dict[str, str]
    tags: dict[str, str]
    start_time: int | None
    trials: list[TrialRow] = field(default_factory=list)

    @property
    def searched(self) -> list[str]:
        text = self.params.get("searched", "")
        return [] if text in ("", "(none)") else [p.strip() for p in text.split(",")]

    @property
    def planned_trials(self) -> int | None:
        value = self.params.get("trials")
        return int(value) if value and value.isdigit() else None

    def counts(self) -> dict[str, int]:
        out = {"completed": 0, "pruned": 0, "failed": 0, "running": 0, "interrupted": 0}
        for t in self.trials:
            key = "running" if t.status == "RUNNING" else (t.outcome or "running")
            out[key] = out.get(key, 0) + 1
        return out

    def ranked(self, include_pruned: bool = False) -> list[TrialRow]:
        """Finished trials by objective, best first (pruned ones only if asked)."""
        keep = ("completed", "pruned") if include_pruned else ("completed",)
        rows = [t for t in self.trials if t.outcome in keep and t.objective is not None]
        return sorted(rows, key=lambda t: (t.objective, t.outcome == "completed"), reverse=True)


def _trial_row(run: Any) -> TrialRow:
    return TrialRow(
        run_id=run.info.run_id, name=run.info.run_name or run.info.run_id, status=run.info.status,
        outcome=run.data.tags.get(store.TAG_OUTCOME, ""), params=dict(run.data.params),
        metrics=dict(run.data.metrics), start_time=run.info.start_time,
    )


def _view(client: Any, experiment_id: str, parent: Any, with_trials: bool) -> SweepView:
    view = SweepView(
        name=parent.data.tags.get(store.TAG_SWEEP, parent.info.run_name), experiment_id=experiment_id,
        run_id=parent.info.run_id, status=parent.info.status,
        outcome=parent.data.tags.get(store.TAG_OUTCOME, ""), params=dict(parent.data.params),
        tags=dict(parent.data.tags), start_time=parent.info.start_time,
    )
    if with_trials:
        view.trials = sorted((_trial_row(r) for r in runs.trial_runs(client, experiment_id, parent.info.run_id)),
                             key=lambda t: t.start_time or 0)
    return view


def load_sweep(client: Any, name: str) -> SweepView | None:
    """The sweep ``name`` (its latest parent run) with every trial, or ``None``."""
    exp = store.retry(lambda: client.get_experiment_by_name(name))
    if exp is None:
        return None
    parent = runs.find_sweep_run(client, exp.experiment_id, name)
    if parent is None:
        return None
    return _view(client, exp.experiment_id, parent, with_trials=True)


def list_sweeps(client: Any) -> list[SweepView]:
    """Every sweep in the store (newest first), with its trials."""
    views = []
    for exp in store.retry(lambda: client.search_experiments()):
        parent = runs.find_sweep_run(client, exp.experiment_id, exp.name)
        if parent is not None:
            views.append(_view(client, exp.experiment_id, parent, with_trials=True))
    return sorted(views, key=lambda v: v.start_time or 0, reverse=True)
