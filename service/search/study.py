"""The Optuna side of a resumed sweep: keep the study consistent with what Tune restores.

Tune saves its trials and the searcher together, every few seconds; a driver killed in
between leaves the Optuna study (in a database: ``--optuna-storage``) a little ahead of
that snapshot:

- a trial asked just before the kill is RUNNING in the study but unknown to the restored
  searcher: nothing will ever finish it, so `fail_abandoned_trials` marks it FAIL;
- a trial that finished just before the kill is COMPLETE in the study but still running in
  Tune's snapshot: Tune runs it again from its checkpoint, and its reports and final
  ``tell`` hit a finished Optuna trial (`optuna.exceptions.UpdateFinishedTrialError`).
  The study already holds its result: `ResumableOptunaSearch` ignores the repeat.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from ray.tune.search.optuna import OptunaSearch

logger = logging.getLogger(__name__)


def fail_abandoned_trials(study: Any, known: Iterable[int]) -> list[int]:
    """Mark FAIL every RUNNING trial of ``study`` whose number is not in ``known`` (the
    trials the restored searcher will finish); returns the numbers marked."""
    import optuna

    keep = set(known)
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    failed = []
    for trial in running:
        if trial.number not in keep:
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            failed.append(trial.number)
    return failed


class ResumableOptunaSearch(OptunaSearch):
    """`OptunaSearch` that survives being restored from a snapshot older than its study."""

    def restore(self, checkpoint_path: str) -> None:
        super().restore(checkpoint_path)
        known = [t.number for t in self._ot_trials.values()]
        failed = fail_abandoned_trials(self._ot_study, known)
        if failed:
            logger.warning("Optuna trial(s) %s were started by the interrupted driver after Tune's "
                           "last snapshot; marked FAIL", failed)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        from optuna.exceptions import UpdateFinishedTrialError

        try:
            super().on_trial_result(trial_id, result)
        except UpdateFinishedTrialError:
            pass  # finished before the driver died: the study keeps its first result

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is not None and ot_trial.storage.get_trial(ot_trial._trial_id).state.is_finished():
            self._completed_trials.add(trial_id)  # told before the driver died
            return
        super().on_trial_complete(trial_id, result, error)
