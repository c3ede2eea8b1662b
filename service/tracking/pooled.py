"""Which validation counts: every validation of one setting on fresh seeds, pooled.

Each ``nalu-sweep validate`` re-trains a setting on seeds no earlier run used (the search's
nor an earlier validation's), so two validations of one setting are two disjoint samples
of the same success probability: one body of evidence. Their successes and seeds add up
(32/32 then 5/8 is 37/40) and the Wilson interval is that of the pool. A validation is
pooled with the latest one of its setting when it tested the same extrapolation ranges (a
validation with an extra ``--range`` asks a harder question) and its seeds overlap none of
those already pooled; the others are left out of the figure.

The pooled figure keeps the latest validation's other metrics (MSE medians, ``solved_at``),
and says where it came from: ``pooled_seeds.0``, ``pooled_seeds.1``, … (the seeds of each
pooled validation, oldest first; `parts`, `provenance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.scoring.intervals import wilson_interval
from service.tracking import runs as tracking_runs
from service.tracking import store

PARTS_KEY = "pooled_seeds."
RANGE_RATE_KEY = "success_rate_per_range."


def seed_range(run: Any) -> range | None:
    """The seed ids of a validation run (its ``first-last`` tag); ``None`` when unreadable."""
    first, sep, last = run.data.tags.get(store.TAG_SEED_IDS, "").partition("-")
    if not sep or not first.isdigit() or not last.isdigit() or int(last) < int(first):
        return None
    return range(int(first), int(last) + 1)


def _batch(run: Any) -> int:
    """Which `validate` call made the run (1, 2, …): the order of runs started in one millisecond."""
    text = run.data.tags.get(store.TAG_BATCH, "")
    return int(text) if text.isdigit() else 0


def _ranges(run: Any) -> set[str]:
    return {k for k in run.data.metrics if k.startswith(RANGE_RATE_KEY)}


@dataclass(frozen=True)
class PooledValidation:
    runs: tuple[Any, ...]  # the pooled validation runs of one setting, oldest first
    metrics: dict[str, float]

    @property
    def latest(self) -> Any:
        return self.runs[-1]

    @property
    def run_ids(self) -> list[str]:
        return [r.info.run_id for r in self.runs]

    @property
    def seed_ids(self) -> str:
        """``4-35, 36-43``: the seed ids of each pooled validation."""
        return ", ".join(r.data.tags.get(store.TAG_SEED_IDS, "?") for r in self.runs)


def pool(runs: list[Any]) -> PooledValidation | None:
    """The pooled validation of one setting from its finished validation runs (any order)."""
    done = sorted((r for r in runs if r.info.status == "FINISHED" and "n_seeds" in r.data.metrics),
                  key=lambda r: (r.info.start_time or 0, _batch(r)))
    if not done:
        return None
    latest = done[-1]
    chosen, seen = [latest], set(seed_range(latest) or ())
    for run in reversed(done[:-1]):
        seeds = seed_range(run)
        if seeds is None or not seen or seen & set(seeds) or _ranges(run) != _ranges(latest):
            continue
        chosen.insert(0, run)
        seen |= set(seeds)
    return PooledValidation(tuple(chosen), pooled_metrics([r.data.metrics for r in chosen]))


def pooled_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """The success metrics of several validations of one setting as one sample: successes,
    seeds, diverged seeds and per-range successes added up, the rate and its Wilson interval
    on the sum; the last part's other metrics; ``pooled_seeds.i`` the seeds of part ``i``."""
    latest = parts[-1]
    n = sum(int(p.get("n_seeds", 0)) for p in parts)
    k = sum(int(round(p.get("successes", 0))) for p in parts)
    out = {key: value for key, value in latest.items() if not key.startswith(PARTS_KEY)}
    if len(parts) > 1 and n > 0:
        low, high = wilson_interval(k, n)
        out.update(successes=float(k), n_seeds=float(n), success_rate=k / n, success_ci_low=low,
                   success_ci_high=high, diverged=float(sum(p.get("diverged", 0) for p in parts)))
        for key in [name for name in latest if name.startswith(RANGE_RATE_KEY)]:
            out[key] = sum(p.get(key, 0.0) * p.get("n_seeds", 0) for p in parts) / n
        out.pop("objective", None)  # a single run's: its tie-breakers do not pool
    for i, p in enumerate(parts):
        out[f"{PARTS_KEY}{i}"] = float(p.get("n_seeds", 0))
    return out


def parts(metrics: dict[str, float]) -> list[int]:
    """The seeds of each pooled validation (oldest first); ``[]`` for a single run's metrics."""
    found = sorted((int(k[len(PARTS_KEY):]), int(v)) for k, v in metrics.items()
                   if k.startswith(PARTS_KEY) and k[len(PARTS_KEY):].isdigit())
    return [v for _, v in found]


def provenance(metrics: dict[str, float]) -> str:
    """``from 2 validations: 32 + 8 seeds`` for a pooled figure, ``""`` for one validation."""
    seeds = parts(metrics)
    if len(seeds) < 2:
        return ""
    return f"from {len(seeds)} validations: {' + '.join(map(str, seeds))} seeds"


def validation_runs(client: Any, experiment_id: str, parent_run_id: str) -> list[Any]:
    """The validation child runs of a sweep's parent run (``nalu-sweep validate``), any state."""
    return tracking_runs.all_runs(client, [experiment_id],
                                  f"tags.`{store.TAG_PARENT}` = {tracking_runs.quote(parent_run_id)} AND "
                                  f"tags.`{store.TAG_ROLE}` = '{store.ROLE_VALIDATION}'")


def pooled_validations(client: Any, view: Any) -> dict[str, PooledValidation]:
    """``{trial run id: its pooled validation}`` for every validated trial of a sweep."""
    by_trial: dict[str, list[Any]] = {}
    for run in validation_runs(client, view.experiment_id, view.run_id):
        by_trial.setdefault(run.data.tags.get(store.TAG_SOURCE_RUN, ""), []).append(run)
    out = {}
    for trial, found in by_trial.items():
        pooled = pool(found)
        if pooled is not None:
            out[trial] = pooled
    return out
