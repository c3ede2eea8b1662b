"""The end of a sweep: make MLflow agree with what Tune saw, count the trials by outcome
and close the parent run, waiting out a tracking server that is away."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import UserError
from service.formatting import redact
from service.sweep.results import (
    DONE, PACK_MEMBERS, PRUNED, STATE, STEP, is_metric_key, last_report, member_key, member_results, stopped_early,
    trial_key,
)
from service.tracking import runs, store
from service.tracking.best import record_best
from service.tracking.queries import tally, trial_rows
from service.tracking.store import Outcome

if TYPE_CHECKING:
    from service.sweep.display import SweepBoard
    from service.sweep.options import SweepOptions

@dataclass
class TuneTrial:
    """What Tune knows of one trial at the end of `fit`: its last result and final state."""

    state: str  # done, pruned, failed, running
    last_result: dict[str, Any]


def tune_trials(grid: Any, board: SweepBoard, total_steps: int) -> dict[str, TuneTrial]:
    """Every trial of the (possibly restored) Tune experiment, by trial id: the board's view
    for trials run by this process, the result grid's for those finished before a restart."""
    out: dict[str, TuneTrial] = {}
    keys: dict[str, str] = {}  # Tune trial id -> the key of its run, where another (`trial_key`)
    for result in grid or []:
        trial_id = Path(str(result.path)).name.removeprefix("trial-")
        keys[trial_id] = trial_key(trial_id, result.config)
        metrics = dict(result.metrics or {})
        if PACK_MEMBERS in (result.config or {}):
            out.update(pack_trials(trial_id, len(result.config[PACK_MEMBERS]), metrics, result.error is not None))
            continue
        if result.error is not None:
            state = "failed"
        else:
            state = "pruned" if stopped_early(metrics, total_steps) else "done"
        out[keys[trial_id]] = TuneTrial(state, metrics)
    for trial_id, line in board.trials.items():
        key = keys.get(trial_id, trial_id)
        if line.state != "pending":
            out[key] = TuneTrial(line.state, dict(line.last_result) or out.get(key, TuneTrial("", {})).last_result)
    return out


def pack_trials(trial_id: str, size: int, metrics: dict[str, Any], error: bool) -> dict[str, TuneTrial]:
    """The members of a pack (`service.sweep.pack`), by trial key, from the pack's last
    result: each as it reported itself, else failed with the pack (or, as a lone trial
    that stopped early, pruned)."""
    members = member_results(metrics)
    out = {}
    for index in range(size):
        shown = members.get(index, {})
        state = {DONE: "done", PRUNED: "pruned"}.get(shown.get(STATE), "failed" if error else "pruned")
        out[member_key(trial_id, index)] = TuneTrial(state, shown)
    return out


def finished_reports(client: Any, experiment_id: str, parent_run_id: str, total_steps: int) -> dict[int, dict[str, float]]:
    """``{Optuna trial number: last report}`` of the trial runs closed as completed or pruned
    (a resumed sweep's `TrialSettings.replay`): the run's last metrics, at its last step (a
    completed run's is the trial's end). Tune's last snapshot may hold such a trial as still
    running (it finished after the snapshot): Tune then gets this report back instead of a
    second training, which could end otherwise (ASHA's rungs are restored older too) than
    the run and the study already say."""
    from service.scoring.objective import OBJECTIVE

    out = {}
    for run in runs.trial_runs(client, experiment_id, parent_run_id):
        tags = run.data.tags
        outcome, number = tags.get(store.TAG_OUTCOME), tags.get(store.TAG_OPTUNA_TRIAL, "")
        if run.info.status != "FINISHED" or outcome not in (Outcome.COMPLETED, Outcome.PRUNED) or not number.isdigit():
            continue
        step = total_steps
        if outcome == Outcome.PRUNED:
            history = store.retry(lambda run=run: client.get_metric_history(run.info.run_id, OBJECTIVE))
            step = max((int(m.step) for m in history), default=0)
        if (report := last_report(run.data.metrics, step)) is not None:
            out[int(number)] = report
    return out


def settle_trial_runs(client: Any, experiment_id: str, parent_run_id: str,
                       trials: dict[str, TuneTrial], complete: bool) -> None:
    """Make MLflow agree with Tune once `fit` is over.

    A child run still RUNNING (or closed as ``interrupted`` when a resume began) whose trial
    Tune saw finish was stopped before its own ``finally`` ran (Tune does not wait for a
    stopped trial's thread, nor for a killed driver's): close it as Tune reports it
    (pruned / failed / completed); one whose run an earlier attempt finished (its final
    parameters' digest is there: a trial run again after a resume) stays completed. Runs
    of trials unknown to Tune were started just before a crash, after Tune last saved its
    state: the restored sweep never runs them, so once the sweep is complete they are
    deleted rather than left as phantom trials.
    """
    outcomes = {"done": Outcome.COMPLETED, "pruned": Outcome.PRUNED, "failed": Outcome.FAILED}
    for run in runs.trial_runs(client, experiment_id, parent_run_id):
        open_run = run.info.status in ("RUNNING", "SCHEDULED")
        interrupted = run.data.tags.get(store.TAG_OUTCOME) == Outcome.INTERRUPTED
        if not (open_run or interrupted):
            continue
        trial = trials.get(run.data.tags.get(store.TAG_TRIAL_KEY, ""))
        if trial is not None and trial.state in outcomes:
            result = {k: v for k, v in trial.last_result.items() if is_metric_key(k)}
            trained = trial.state == "pruned" and store.TAG_PARAMS_SHA256 in run.data.tags
            runs.settle_trial_run(client, run.info.run_id, outcomes["done" if trained else trial.state], result,
                                  int(trial.last_result.get(STEP, 0) or 0))
        elif trial is None and complete:
            store.retry(lambda: client.delete_run(run.info.run_id))
        elif open_run:
            runs.settle_trial_run(client, run.info.run_id, Outcome.INTERRUPTED)


def record_end(client: Any, options: SweepOptions, experiment_id: str, parent_run_id: str,
                trials: dict[str, TuneTrial], outcome: str, planned: int) -> tuple[dict[str, int], float | None, str]:
    """Settle the trial runs and close the parent run; returns the counts, the best
    objective and the sweep's outcome. A tracking server that is away when the sweep ends
    is waited for (with backoff, up to the spool's patience) rather than leaving the sweep
    half-recorded; every step here is idempotent, so a retry repeats it from the start."""
    from service.tracking.spool import patience_s

    def record() -> tuple[dict[str, int], float | None, str]:
        runs.send_left_over_writes(client, experiment_id, parent_run_id)  # stopped trials' journals first
        settle_trial_runs(client, experiment_id, parent_run_id, trials, complete=outcome == Outcome.COMPLETED)
        rows = trial_rows(client, experiment_id, parent_run_id)
        counts, best = tally(rows)
        record_best(client, parent_run_id, options.name, rows)
        finished = counts["completed"] + counts["pruned"] + counts["failed"]
        final = Outcome.INTERRUPTED if outcome == Outcome.COMPLETED and finished < planned else outcome
        runs.finish_sweep_run(client, parent_run_id, final, {
            "trials_completed": counts["completed"], "trials_pruned": counts["pruned"],
            "trials_failed": counts["failed"], **({"best_objective": best} if best is not None else {}),
        })
        return counts, best, final

    patience = patience_s()
    try:
        return store.retry(record, attempts=1, patience_s=patience)
    except Exception as e:  # noqa: BLE001 - still unreachable after waiting
        if not store.is_transient(e):
            raise
        raise UserError(
            f"the MLflow tracking store {redact(options.tracking_uri)} did not answer for {patience:.0f} s "
            f"when the sweep ended ({type(e).__name__}); the trials' results are in it or in the local spool "
            f"(upload with: python -m service.tracking.spool upload). Once it is back, run the same command "
            f"with --resume to record the sweep's end") from None

