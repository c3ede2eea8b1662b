"""The Optuna side of a packed sweep (``pack: K``): each Tune trial is a pack of up to K
Optuna trials, each told its own result.

For a new Tune trial the searcher asks Optuna for a first trial (define-by-run, as for a
lone trial), then for up to K − 1 more with every parameter that is not packable
(`service.search.packing.packable_params`) fixed to the first one's values — enqueued
with `optuna.Study.enqueue_trial`, which define-by-run then honours — so the sampler only
proposes the continuous settings. A member whose run configs do not share the first
one's `structure_key` after all is not packed with it: it is kept aside and leads a later
pack. The searcher hands out exactly ``trials`` Optuna trials, then tells Tune it has
finished (`Searcher.FINISHED`): Tune's ``num_samples`` is only an upper bound.

Each member's result reaches its own Optuna trial: its objective at every report
(intermediate values, at Tune's ``training_iteration``), PRUNED when its pack reports it
stopped, and COMPLETE with its final objective (or FAIL, when the pack failed for good).
Its state is saved and restored with Tune's (``--resume``); a restore also refills the
rung board (`service.sweep.rungs`) from the members' intermediate values, including those
of members whose results it read back from MLflow (`service.sweep.study_sync`). Members an
interrupted driver asked after Tune's last snapshot and that did not finish are not marked
FAIL: they are packed again (`resume_study`), so a resumed sweep trains exactly its plan.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from service.pack_structure import structure_key
from service.search.assign import active_params, run_configs
from service.search.packing import packable_params
from service.search.space import SearchSpace
from service.sweep import kill_points
from service.sweep.race_board import RACE_TAGS, RaceBoardSpec, race_board
from service.sweep.race_trial import RACE_BLOCK
from service.sweep.results import (
    DONE,
    PACK_MEMBERS,
    PRUNED,
    RUN_CONFIGS,
    STATE,
    member_key,
    member_results,
)
from service.sweep.rungs import RungSpec, board
from service.sweep.searcher import ResumableOptunaSearch

logger = logging.getLogger(__name__)

def rung_spec(space: SearchSpace, sweep: str) -> RungSpec | None:
    """The per-member ASHA of a packed sweep (Tune's ASHA settings), or None without ASHA."""
    if space.scheduler.type != "asha":
        return None
    return RungSpec(name=sweep, grace=space.grace_reports(), max_t=space.total_reports(),
                    reduction_factor=space.scheduler.reduction_factor, brackets=space.scheduler.brackets)


def race_spec(space: SearchSpace, sweep: str, storage_path: str) -> RaceBoardSpec | None:
    """A race's settings (the race, its file in the sweep's storage path: `race_file`, and
    with ``grace_period`` its first-block rungs), or None without a race."""
    if space.scheduler.type != "race":
        return None
    from service.sweep.race_scheduler import race_file

    rungs = None  # with grace_period, first blocks are stopped by steps as ASHA would
    if space.scheduler.first_block_rungs:
        rungs = RungSpec(name=sweep, grace=space.grace_reports(), max_t=space.total_reports(),
                         reduction_factor=space.scheduler.reduction_factor)
    return RaceBoardSpec(sweep, space.scheduler.race(), race_file(storage_path, sweep), rungs)


class PackedOptunaSearch(ResumableOptunaSearch):
    """`ResumableOptunaSearch` whose Tune trials are packs of Optuna trials (see the module)."""

    def __init__(self, *, pack: int, planned: int, rungs: RungSpec | None = None,
                 race: RaceBoardSpec | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pack, self._planned, self._rungs, self._race = pack, planned, rungs, race
        self._groups: dict[str, list[Any]] = {}  # Tune trial id -> its members' Optuna trials
        self._params: dict[int, dict[str, Any]] = {}  # Optuna trial number -> searched values
        self._keys: dict[int, list[str] | None] = {}  # -> structure keys of its run configs
        self._spare: list[Any] = []  # asked, not packed with their first member: lead a later pack
        self._asked = 0

    @property
    def _sweep_space(self) -> SearchSpace:
        return self._space.space

    def _ask(self) -> Any:
        trial = self._ot_study.ask()
        self._asked += 1
        return self._adopt(trial)

    def _adopt(self, trial: Any) -> Any:
        """Note a trial's searched values and structure keys (define-by-run: a trial asked
        before, run again after a resume, gets the values it has)."""
        space = self._sweep_space
        values = self._suggest_from_define_by_run_func(self._space, trial)
        params = active_params(space, {k: v for k, v in values.items() if k in space.params})
        self._params[trial.number] = params
        try:
            self._keys[trial.number] = [structure_key(c) for c in run_configs(space, params).values()]
        except Exception:  # noqa: BLE001 - the trial fails in its own run, alone
            self._keys[trial.number] = None
        return trial

    def _member(self, trial: Any) -> dict[str, Any]:
        params = self._params[trial.number]
        member: dict[str, Any] = {"number": trial.number, "params": params}
        if self._keys[trial.number] is not None:
            member[RUN_CONFIGS] = run_configs(self._sweep_space, params)
        return member

    def suggest(self, trial_id: str) -> dict | str | None:
        if trial_id in self._groups:
            return {PACK_MEMBERS: [self._member(t) for t in self._groups[trial_id]]}
        if not self._ot_study.get_trials(deepcopy=False):
            kill_points.reached("before_trials")
        # a member the study finished meanwhile (told at its rung by a killed driver, its run
        # left open and closed as the study has it) is not run again
        self._spare = [t for t in self._spare if not self._is_finished(t)]
        if self._asked >= self._planned and not self._spare:
            return self.FINISHED
        if self._rungs is not None and not self._groups:
            board(self._rungs)  # before the first pack reports
        if getattr(self, "_race", None) is not None and not self._groups:
            race_board(self._race)  # the same board after a restore: it reads the race file back
        leader = self._spare.pop(0) if self._spare else self._ask()
        members = [leader]
        if self._keys[leader.number] is not None:
            for trial in [t for t in self._spare if self._keys[t.number] == self._keys[leader.number]]:
                if len(members) < self._pack:
                    members.append(trial)
                    self._spare.remove(trial)
            free = packable_params(self._sweep_space)
            fixed = {k: v for k, v in self._params[leader.number].items() if k not in free}
            while len(members) < self._pack and self._asked < self._planned:
                self._ot_study.enqueue_trial(fixed, skip_if_exists=False)
                trial = self._ask()
                fits = self._keys[trial.number] == self._keys[leader.number]
                (members if fits else self._spare).append(trial)
        for index, trial in enumerate(members):
            trial.set_user_attr("nalu_sweep.pack_group", trial_id)
            trial.set_user_attr("nalu_sweep.pack_index", index)
            self._rekey(trial.number, member_key(trial_id, index))
        self._groups[trial_id] = members
        kill_points.reached("trial_started")
        return {PACK_MEMBERS: [self._member(t) for t in members]}

    def _is_finished(self, trial: Any) -> bool:
        return trial.storage.get_trial(trial._trial_id).state.is_finished()

    def _tell(self, trial: Any, value: float | None, state: Any) -> None:
        try:
            self._ot_study.tell(trial, value, state=state)
        except Exception as e:  # noqa: BLE001 - e.g. finished by an earlier driver
            logger.warning("could not tell Optuna trial %s: %s", trial.number, e)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        group = self._groups.get(trial_id)
        if group is None:
            return super().on_trial_result(trial_id, result)
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        members = member_results(result)
        for index, trial in enumerate(group):
            shown = members.get(index)
            frozen = trial.storage.get_trial(trial._trial_id)
            if not shown or frozen.state.is_finished():
                continue
            step = int(result["training_iteration"])
            if RACE_BLOCK in shown:  # a race: an intermediate value per block, at the block's number; inside a
                step = int(shown[RACE_BLOCK])  # first block none, but a member stopped there gets its value at 0
                if step == 0 and shown.get(STATE) != PRUNED:
                    continue
            try:
                if step not in frozen.intermediate_values:  # else reported by a killed driver's attempt
                    trial.report(float(shown[self.metric]), step)
            except UpdateFinishedTrialError:
                continue
            if shown.get(STATE) == PRUNED:
                self._tell(trial, None, TrialState.PRUNED)
            elif shown.get(STATE) == DONE and RACE_BLOCK in shown:  # it left the race: its value on all its seeds
                self._tell(trial, float(shown[self.metric]), TrialState.COMPLETE)
        self._tag_standings(result)
        return None

    def _tag_standings(self, result: dict) -> None:
        """Tag the racing members' runs with the standings the race board set (`RACE_TAGS`)."""
        if RACE_TAGS not in result:
            return
        from service.sweep.race_scheduler import ExitTags

        if getattr(self, "_exit_tags", None) is None:
            self._exit_tags = ExitTags(getattr(self, "_records", None))
        for key, standing, blocks in json.loads(str(result[RACE_TAGS])):
            self._exit_tags.write(str(key), str(standing), int(blocks))
        kill_points.reached("race_told")

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        group = self._groups.get(trial_id)
        if group is None:
            return super().on_trial_complete(trial_id, result, error)
        from optuna.trial import TrialState

        members = member_results(result or {})
        if result:
            self._tag_standings(result)
        for index, trial in enumerate(group):
            if self._is_finished(trial):
                continue
            shown = members.get(index, {})
            if shown.get(STATE) == DONE:
                self._tell(trial, float(shown[self.metric]), TrialState.COMPLETE)
            elif shown.get(STATE) == PRUNED or not error:
                self._tell(trial, None, TrialState.PRUNED)
            else:
                self._tell(trial, None, TrialState.FAIL)
        self._completed_trials.add(trial_id)
        kill_points.reached("trial_finished")
        return None

    def _rekey(self, number: int, key: str) -> None:
        """Give the run of a member run again (`resume_study`) its key in its new pack, where
        the pack's worker opens it (`execute_pack`): the same run continues, under the key
        the sweep's end settles it by."""
        run_id = getattr(self, "_reopened_runs", {}).pop(number, None)
        records = getattr(self, "_records", None)
        if run_id is None or records is None:
            return
        from service.tracking import store

        client = store.client(records.tracking_uri)
        store.retry(lambda: client.set_tag(run_id, store.TAG_TRIAL_KEY, key))

    def resume_study(self) -> None:
        """As for lone trials; the members the interrupted driver asked after Tune's last
        snapshot, unfinished, are packed again (those that share a structure together), each
        with its setting, Optuna trial and run; its members that finished are not run again.
        Members of a pack Tune restores that finished after the snapshot are replayed by
        their pack (`execute_pack`)."""
        super().resume_study()
        reopened, self._reopened = self._reopened, []
        for trial, _ in reopened:
            self._spare.append(self._adopt(trial))
        self._asked = max(self._asked, len(self._ot_study.get_trials(deepcopy=False)))

    def live_numbers(self) -> list[int]:
        packed = [t.number for members in self._groups.values() for t in members]
        return super().live_numbers() + packed + [t.number for t in self._spare]

    def restore(self, checkpoint_path: str) -> None:
        super().restore(checkpoint_path)
        if getattr(self, "_race", None) is not None:
            race_board(self._race)  # the restored packs' board: it reads the race file back
        if self._rungs is None:
            return
        import ray

        ray.get(board(self._rungs).restore.remote(self.board_records()))

    def board_records(self) -> list[tuple[int, int, float, bool]]:
        """What a restore replays into the rung board: ``(member, iteration, value, kept)``
        for the members of known packs, those whose result was read back from MLflow, and
        those the study finished whose runs the restore closed."""
        from optuna.trial import TrialState

        packed = ({t.number for members in self._groups.values() for t in members}
                  | set(self._synced) | set(self._settled))
        records = []
        for trial in self._ot_study.get_trials(deepcopy=False):
            values = trial.intermediate_values
            if trial.number not in packed or not values:
                continue
            stopped_at = max(values) if trial.state == TrialState.PRUNED else None
            records += [(trial.number, it, v, it != stopped_at) for it, v in sorted(values.items())]
        return records
