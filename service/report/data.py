"""Everything a report needs, read once from MLflow: the sweep, its trials, the resolved
search space, validation runs, and the per-seed artifacts of the top settings."""

from __future__ import annotations

import csv
import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.search.space import SearchSpace
from service.tracking import store
from service.tracking.queries import SweepView, TrialRow, load_sweep
from service.tracking.store import Outcome


@dataclass
class Validation:
    """A setting's validations on fresh seeds, pooled (`service.tracking.pooled`): the
    latest run's id and name, every pooled run's seed ids, the pooled metrics, and the
    per-seed rows of every pooled run."""

    run_id: str
    name: str
    source_run_id: str
    seed_ids: str
    metrics: dict[str, float]
    seeds: list[dict[str, str]] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)


@dataclass
class ReportData:
    view: SweepView
    space: SearchSpace | None
    tracking_uri: str
    validations: dict[str, Validation] = field(default_factory=dict)  # by source trial run id
    seeds: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # trial run id → seeds.csv rows
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)  # "best"/"failed" → weights JSON
    weights_source: str = ""
    # a raced sweep's trials, block by block: trial run id → [(seeds so far, rate, CI low, CI high)]
    race_blocks: dict[str, list[tuple[int, float, float, float]]] = field(default_factory=dict)

    @property
    def raced(self) -> bool:
        """Whether the sweep raced its settings by seed blocks (``scheduler: race``)."""
        return self.space is not None and self.space.scheduler.type == "race"

    def ranked(self, top: int | None = None) -> list[TrialRow]:
        rows = self.view.ranked(include_pruned=False) or self.view.ranked(include_pruned=True)
        return rows[:top] if top else rows

    @property
    def searched(self) -> list[str]:
        return list(self.space.params) if self.space is not None else self.view.searched

    @property
    def recurrent(self) -> bool | None:
        """Whether the sweep trains a recurrent (sequence) task; ``None`` when its search
        space could not be read. Panels about test lengths apply only then."""
        if self.space is None:
            return None
        from service.tasks import TASKS

        kinds = [str(task.get("kind")) for task in self.space.task_configs().values()]
        return any(getattr(TASKS.get(kind), "recurrent", False) for kind in kinds)

    def diverged_trials(self) -> list[TrialRow]:
        return [t for t in self.view.trials if (t.metrics.get("diverged") or 0) > 0]

    def ranges(self) -> list[str]:
        names: list[str] = []
        rows = list(self.view.trials) + [type("V", (), {"metrics": v.metrics})() for v in self.validations.values()]
        for t in rows:
            for key in t.metrics:
                if key.startswith("extrapolation_mse_median."):
                    name = key.partition(".")[2]
                    if name not in names:
                        names.append(name)
        return names


    def thresholds(self) -> dict[str, float]:
        """The success threshold of each extrapolation range, from the per-seed tables
        (``threshold.<range>``) and the learned-weights files of the top settings."""
        from service.formatting import finite

        out: dict[str, float] = {}
        tables = [*self.seeds.values(), *(v.seeds for v in self.validations.values())]
        for row in (r for table in tables for r in table):
            for key, value in row.items():
                if key.startswith("threshold.") and finite(value) is not None:
                    out.setdefault(key.partition(".")[2], float(value))
        for w in self.weights.values():
            for name, value in (w.get("thresholds") or {}).items():
                if finite(value) is not None:
                    out.setdefault(name, float(value))
        return out


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _download(client: Any, run_id: str, artifact: str, tmp: str) -> Path | None:
    try:
        return Path(store.retry(lambda: client.download_artifacts(run_id, artifact, tmp)))
    except Exception:  # noqa: BLE001 - a pruned or failed trial has no artifacts
        return None


def _task_dirs(client: Any, run_id: str, wanted: str) -> list[str]:
    """Where a trial's per-task artifacts are: ``[""]`` when ``wanted`` (a file or folder)
    is at the top (one task), else the task folders that hold it (``["task/", …]``)."""
    top = store.retry(lambda: client.list_artifacts(run_id))
    if any(a.path == wanted for a in top):
        return [""]
    found = []
    for d in sorted(a.path for a in top if a.is_dir):
        if any(a.path == f"{d}/{wanted}" for a in store.retry(lambda: client.list_artifacts(run_id, d))):
            found.append(f"{d}/")
    return found


def _seed_rows(client: Any, run_id: str) -> list[dict[str, str]]:
    """The per-seed table of a trial (of its first task when it trained several)."""
    dirs = _task_dirs(client, run_id, "seeds.csv")
    if not dirs:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        path = _download(client, run_id, f"{dirs[0]}seeds.csv", tmp)
        return _read_csv(path) if path else []


def _weights(client: Any, run_id: str) -> tuple[dict[str, dict[str, Any]], str]:
    """The learned weights of a trial's best and failed seed, and the task they are of
    (``""`` for a one-task trial). With several tasks, the first one that has a failed
    seed is shown (a failure says more), else the first task."""
    try:
        dirs = _task_dirs(client, run_id, "weights")
    except Exception:  # noqa: BLE001 - no artifacts at all
        return {}, ""
    chosen: tuple[dict[str, dict[str, Any]], str] = ({}, "")
    with tempfile.TemporaryDirectory() as tmp:
        for d in dirs:
            out = {}
            for role in ("best", "failed"):
                path = _download(client, run_id, f"{d}weights/{role}_seed.json", tmp)
                if path is not None and path.is_file():
                    out[role] = json.loads(path.read_text())
            if out and not chosen[0]:
                chosen = (out, d.rstrip("/"))
            if "failed" in out:
                return out, d.rstrip("/")
    return chosen


def _number(text: str | None) -> float:
    try:
        return float(text)  # "inf" and "nan" included, as seeds.csv writes them
    except (TypeError, ValueError):
        return math.nan


def _with_pooled_medians(metrics: dict[str, float], rows: list[dict[str, str]]) -> dict[str, float]:
    """Pooled validation metrics with each range's median extrapolation MSE taken over the
    seeds of every pooled run, when their per-seed rows cover all of them (one task)."""
    from service.tracking.pooled import parts

    if len(parts(metrics)) < 2 or len(rows) != int(metrics.get("n_seeds", -1)):
        return metrics
    out = dict(metrics)
    for key in [k for k in rows[0] if k.startswith("extrapolation_mse.")]:
        values = sorted(v for v in map(_number, (row.get(key) for row in rows)) if not math.isnan(v))
        if values:  # as `aggregate`: NaN (a diverged seed) left out, inf counted
            mid = len(values) // 2
            median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
            if math.isfinite(median):
                out[f"extrapolation_mse_median.{key.partition('.')[2]}"] = median
    return out


_BLOCK_METRICS = ("n_seeds", "success_rate", "success_ci_low", "success_ci_high")


def _race_blocks(client: Any, run_id: str) -> list[tuple[int, float, float, float]]:
    """A racing trial's figures after each of its blocks (one point per block, at step =
    the block's number; step 0 holds a first block's reports while it trains): ``(seeds
    so far, success rate, CI low, CI high)``."""
    by_block: dict[int, dict[str, float]] = {}
    for key in _BLOCK_METRICS:
        for m in store.retry(lambda key=key: client.get_metric_history(run_id, key)):
            by_block.setdefault(int(m.step), {})[key] = float(m.value)
    return [(int(b["n_seeds"]), *(b[k] for k in _BLOCK_METRICS[1:])) for step, b in sorted(by_block.items())
            if step >= 1 and all(k in b for k in _BLOCK_METRICS)]


def load_report_data(tracking_uri: str, name: str, top: int = 5) -> ReportData | None:
    """The sweep ``name`` with what the panels need (``None`` when there is no such sweep)."""
    from service.errors import UserError
    from service.tracking.pooled import pooled_validations
    from service.tracking.queries import sweep_space

    client = store.client(tracking_uri)
    view = load_sweep(client, name)
    if view is None:
        return None
    try:
        space = sweep_space(client, view.run_id)
    except UserError:
        space = None
    data = ReportData(view=view, space=space, tracking_uri=tracking_uri)
    for source, pooled in pooled_validations(client, view).items():
        latest = pooled.latest
        rows = [row for run_id in pooled.run_ids for row in _seed_rows(client, run_id)]
        data.validations[source] = Validation(latest.info.run_id, latest.info.run_name, source, pooled.seed_ids,
                                              _with_pooled_medians(pooled.metrics, rows), rows, pooled.run_ids)
    if data.raced:
        data.race_blocks = {t.run_id: _race_blocks(client, t.run_id) for t in view.trials}
    for trial in (data.ranked(top) if top > 0 else []):
        if trial.outcome == Outcome.COMPLETED:
            data.seeds[trial.run_id] = _seed_rows(client, trial.run_id)
    ranked = data.ranked(1)
    if ranked and top > 0:
        best = ranked[0]
        val = data.validations.get(best.run_id)
        # prefer the fresh seeds' weights: a failed seed there says more than one in the search
        for run_id, label in ((val.run_id, "validation") if val else (None, ""), (best.run_id, "search")):
            if run_id is None:
                continue
            weights, task = _weights(client, run_id)
            if weights:
                data.weights = weights
                data.weights_source = f"{label} run of {best.name}" + (f", task {task}" if task else "")
                if "failed" in weights or label == "search":
                    break
    return data


