"""The keys of what a trial reports to Tune, read back by the driver (progress display,
outcomes, the pack searcher) without loading the training code."""

from __future__ import annotations

from typing import Any

from service.scoring.metrics import AggregateMetrics
from service.scoring.objective import OBJECTIVE
from service.scoring.sequence import LONGEST_SOLVED

STEP = "step"
"""Reported with every result: training steps done by the trial (summed over its tasks)."""
ENDED_BEFORE = "ended_before"
"""In the one report of a trial run again whose earlier attempt trained all its steps
(`service.sweep.trainable`): that attempt's end, which its MLflow run holds, report by
report; the searcher tells the study from the run, not from this report's iteration."""



def stopped_early(result: dict[str, Any], total_steps: int) -> bool:
    """Whether a trial whose last report was ``result`` ended before training its
    ``total_steps``: the scheduler (ASHA) stopped it. Tune tells neither its searcher nor
    its results why a trial ended; a trial that ends without an error has trained all its
    steps unless it was stopped."""
    return float(result.get(STEP, 0) or 0) < total_steps


def last_report(metrics: dict[str, Any], step: int) -> dict[str, float] | None:
    """The report a trial made last, rebuilt from its run's latest metrics (``step``: the
    training step it ended at), or None where the run holds no objective."""
    kept = {k: float(v) for k, v in metrics.items() if is_metric_key(k)}
    return {**kept, STEP: float(step)} if OBJECTIVE in kept else None


_METRIC_FIELDS = frozenset(AggregateMetrics.model_fields) | {OBJECTIVE, LONGEST_SOLVED}


def is_metric_key(key: str) -> bool:
    """True for the keys `run_trial` reports (``success_rate``, ``objective``,
    ``extrapolation_mse_median.<range>``, ``<task>.<metric>``), not Tune's own."""
    return any(c.split(".")[0] in _METRIC_FIELDS for c in (key, key.partition(".")[2]) if c)


RUN_CONFIGS = "__run_configs__"
"""Key of a Tune trial's config that holds its ``{task: RunConfig}``, built in the driver."""
OPTUNA_TRIAL = "__optuna_trial__"
"""Key of a Tune trial's config that holds its Optuna trial number (tagged on its run)."""
TRIAL_KEY = "__trial_key__"
"""Key of a Tune trial's config that names the MLflow run it continues (the trial key of a
trial an interrupted driver started after Tune's last snapshot: `service.sweep.searcher`);
absent, the run is keyed by the Tune trial's own id."""
PACK_MEMBERS = "__pack__"
"""Key of a pack's Tune config: its members, ``[{number, params, RUN_CONFIGS}]``."""
MEMBERS = "members"
"""Prefix of a pack's result keys for its members: ``members/<index>/<metric, STEP or STATE>``
(flat, as Tune flattens results for its searcher)."""
STATE = "state"
RUNNING, PRUNED, DONE = "running", "pruned", "done"


def trial_key(trial_id: str, config: dict[str, Any] | None) -> str:
    """The trial key of a lone Tune trial's MLflow run (``TRIAL_KEY``, else its own id)."""
    return str((config or {}).get(TRIAL_KEY) or trial_id)


def member_key(trial_id: str, index: int) -> str:
    """A member's trial key (its MLflow run's ``nalu_sweep.trial_key``; ``trial-<key>`` in
    the CLI): the Tune trial of its pack and its place there."""
    return f"{trial_id}.{index}"


def member_results(result: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """``{member index: its metrics, STEP and STATE}`` from a pack's result."""
    out: dict[int, dict[str, Any]] = {}
    for key, value in result.items():
        prefix, _, rest = key.partition("/")
        index, _, name = rest.partition("/")
        if prefix == MEMBERS and index.isdigit() and name:
            out.setdefault(int(index), {})[name] = value
    return out
