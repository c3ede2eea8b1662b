"""Read sweeps back from MLflow for `nalu-sweep status` and `nalu-sweep best`."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from service.errors import UserError
from service.scoring.objective import OBJECTIVE
from service.tracking import runs, store
from service.tracking.pooled import pooled_validations, validation_runs  # noqa: F401 - read from here too
from service.tracking.store import Outcome

if TYPE_CHECKING:
    from service.search.space import SearchSpace


@dataclass
class TrialRow:
    run_id: str
    name: str
    status: str
    outcome: str
    params: dict[str, str]
    metrics: dict[str, float]
    start_time: int | None = None
    run_name: str = ""  # the MLflow run name: the trial's settings (`formatting.settings_label`)
    race: str = ""  # a racing trial: where it stands or left ("eliminated after block 1"; `race_standing`)

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
        return tally(self.trials)[0]

    def ranked(self, include_pruned: bool = False) -> list[TrialRow]:
        """Finished trials by objective, best first (pruned ones only if asked)."""
        return ranked(self.trials, include_pruned)


def ranked(trials: Iterable[TrialRow], include_pruned: bool = False) -> list[TrialRow]:
    """Finished trials by objective, best first (pruned ones only if asked)."""
    keep = (Outcome.COMPLETED, Outcome.PRUNED) if include_pruned else (Outcome.COMPLETED,)
    rows = [t for t in trials if t.outcome in keep and t.objective is not None]
    return sorted(rows, key=lambda t: (t.objective, t.outcome == Outcome.COMPLETED), reverse=True)


def tally(trials: Iterable[TrialRow]) -> tuple[dict[str, int], float | None]:
    """Trials by outcome (a run still RUNNING counts as running whatever its tag says) and
    the best objective of the completed ones."""
    counts, best = Outcome.counts(), None
    for t in trials:
        key = Outcome.RUNNING if t.status == "RUNNING" else (t.outcome or Outcome.RUNNING)
        counts[key] = counts.get(key, 0) + 1
        if key == Outcome.COMPLETED and t.objective is not None and (best is None or t.objective > best):
            best = t.objective
    return counts, best


def trial_rows(client: Any, experiment_id: str, parent_run_id: str) -> list[TrialRow]:
    """The trial runs of a sweep's parent run, oldest first."""
    return sorted((_trial_row(r) for r in runs.trial_runs(client, experiment_id, parent_run_id)),
                  key=lambda t: t.start_time or 0)


def _trial_row(run: Any) -> TrialRow:
    """A trial's row; its ``name`` is Tune's trial name (``trial-<id>``, from the trial key),
    its ``run_name`` the MLflow run's (the settings)."""
    run_name = run.info.run_name or run.info.run_id
    key = run.data.tags.get(store.TAG_TRIAL_KEY)
    return TrialRow(
        run_id=run.info.run_id, name=f"trial-{key}" if key else run_name, status=run.info.status,
        outcome=run.data.tags.get(store.TAG_OUTCOME, ""), params=dict(run.data.params),
        metrics=dict(run.data.metrics), start_time=run.info.start_time, run_name=run_name,
        race=race_standing(run.data.tags),
    )


def race_standing(tags: dict[str, str]) -> str:
    """A racing trial's standing from its run's tags: ``incumbent`` (the pick once the sweep
    ended), or why and after which block it left (`service.sweep.race_scheduler`); "" else."""
    reason = tags.get(store.TAG_RACE_EXIT, "")
    if not reason or reason == "incumbent":
        return reason
    if tags.get(store.TAG_RACE_EXIT_BLOCK) == "0":  # stopped inside its first block (by steps)
        return f"{reason} in block 1"
    return f"{reason} after block {tags.get(store.TAG_RACE_EXIT_BLOCK, '?')}"


def _view(client: Any, experiment_id: str, parent: Any, with_trials: bool) -> SweepView:
    view = SweepView(
        name=parent.data.tags.get(store.TAG_SWEEP, parent.info.run_name), experiment_id=experiment_id,
        run_id=parent.info.run_id, status=parent.info.status,
        outcome=parent.data.tags.get(store.TAG_OUTCOME, ""), params=dict(parent.data.params),
        tags=dict(parent.data.tags), start_time=parent.info.start_time,
    )
    if with_trials:
        view.trials = trial_rows(client, experiment_id, parent.info.run_id)
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


def sweep_names(client: Any) -> list[str]:
    """The names of every sweep in the store (one query; sorted)."""
    ids = [e.experiment_id for e in store.retry(lambda: client.search_experiments())]
    names: set[str] = set()
    for i in range(0, len(ids), 100):  # MLflow caps the experiments of one search
        names.update(r.data.tags.get(store.TAG_SWEEP, "") for r in
                     runs.all_runs(client, ids[i:i + 100], f"tags.`{store.TAG_ROLE}` = '{store.ROLE_SWEEP}'"))
    return sorted(n for n in names if n)


def validated_metrics(client: Any, view: "SweepView") -> dict[str, dict[str, float]]:
    """``{trial run id: metrics on fresh seeds}``: every validation of the trial pooled
    (`service.tracking.pooled`)."""
    return {trial: pooled.metrics for trial, pooled in pooled_validations(client, view).items()}


def sweep_space(client: Any, parent_run_id: str) -> "SearchSpace":
    """The resolved search space the sweep ran with (an artifact of its parent run)."""
    from service.search.loading import parse_space

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = store.retry(lambda: client.download_artifacts(parent_run_id, store.SPEC_ARTIFACT, tmp))
        except Exception as e:  # noqa: BLE001
            raise UserError(f"the sweep's parent run has no {store.SPEC_ARTIFACT} ({e})") from None
        data = json.loads(Path(path).read_text())
    return parse_space(data, source="the sweep's resolved spec")
