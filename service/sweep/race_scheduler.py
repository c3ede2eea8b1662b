"""The race as a Tune scheduler (``scheduler: race``): after each block of seeds a trial
reports its per-seed outcomes (`service.sweep.race_trial`), and `RaceScheduler`'s
``on_trial_result`` answers CONTINUE (train the next block) or STOP, by `race.decide`
against the incumbent on the seeds both have.

**The incumbent trains to the maximum.** The first setting to report is the incumbent;
while it is the incumbent it gets every block up to ``max_seeds`` (Tune: CONTINUE), and a
challenger is compared with it on the seeds both have, at each of the challenger's
budgets. Why not extend the incumbent only when a challenger ties it, as the sequential
race (`race.replay`) does: a Tune function trial that has ended cannot get more seeds, and
keeping it paused between blocks (Tune's PAUSE) costs a stop and a restore of its actor
per block and leaves the choice of when it runs to Tune. Trained ahead, the incumbent's
first n seeds are exactly the seeds the replay would have given it by then, so every
comparison — and so every elimination and the pick — is the replay's, for trials that
arrive one after the other (``concurrency: 1``); the price is the seeds of an incumbent
that no challenger would have pushed to the maximum (and of one later replaced).

With ``concurrency > 1`` a challenger may report before the incumbent has as many seeds:
it is compared on the seeds both have (the same decisions at the same budgets), and one
that reaches the maximum first waits, undecided, until the incumbent gets there. A
challenger shown better replaces the incumbent at once; the old incumbent's trial stops at
its next report. When both reach the maximum undecided, the better `race.evidence` (of the
worst task) stays the incumbent, the incumbent on a tie.

**Resume.** Tune does not save a scheduler's state with its snapshots (a restored sweep
gets the scheduler as pickled when the sweep began), so the race writes itself through to
``NAME.race_state.json`` beside the Tune experiment directory after every decision
(`RaceFile`, `race_file`), by trial key, and a resumed sweep reads it before its first
decision: the incumbent and the
trials that left stay so, including trials Tune's last snapshot did not hold or that do
not run again. A trial's block whose report the kill cut off is trained again from the
trial's last checkpoint (its records are not doubled: a run skips steps logged already).

**First blocks by steps.** With ``scheduler.grace_period`` a first block reports after
each evaluation (`race_trial.RACE_REPORT`), and ASHA's rule (`service.sweep.rungs.Rungs`,
Tune's asynchronous successive halving) over the settings' first blocks stops one whose
objective at a rung is below the top 1/``reduction_factor`` recorded there: it leaves the
race "stopped by steps", before it has any outcome to compare. Blocks after the first, and
a first block past its last rung, train all their steps; the race's decisions are by seeds.

Where each setting left is tagged on its MLflow run (``nalu_sweep.race.exit``: incumbent,
eliminated, replaced, lost at max, stopped by steps; ``nalu_sweep.race.exit_block``) as it
is decided.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from service.scoring.objective import OBJECTIVE
from service.scoring.race import BETTER, WORSE, Outcome, RaceSpec, decide, evidence
from service.sweep import kill_points
from service.sweep.race_trial import (
    RACE_BLOCK,
    RACE_OUTCOMES,
    RACE_REPORT,
    RACE_SEEDS,
    decode_outcomes,
)
from service.sweep.results import trial_key
from service.sweep.rungs import Rungs, RungSpec
from service.sweep.study_sync import TrialRecords

logger = logging.getLogger(__name__)
INCUMBENT, ELIMINATED, REPLACED, LOST_AT_MAX = "incumbent", "eliminated", "replaced", "lost at max"
STOPPED_BY_STEPS = "stopped by steps"  # a first block ASHA's rule stopped (``scheduler.grace_period``)


def race_file(storage_path: str, name: str) -> str:
    """Where sweep ``name`` keeps its race (`RaceFile`): ``NAME.race_state.json`` in the
    storage path, beside its Tune experiment directory, not inside it. Tune stages that
    directory on the driver, restores it there on a resume, and uploads it whole at each
    snapshot, so a file written into it between snapshots is overwritten by the copy a
    resumed driver restored."""
    return f"{storage_path.rstrip('/')}/{name}.race_state.json"


class ExitTags:
    """Writes a racing trial's standing to its MLflow run, from the driver (plain data when
    pickled with Tune's experiment: the client is made again where it is used)."""

    def __init__(self, records: TrialRecords | None) -> None:
        self.records = records
        self._client: Any = None
        self._runs: dict[str, str] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"records": self.records, "_client": None, "_runs": {}}

    def write(self, key: str, reason: str, blocks: int) -> None:
        if self.records is None:
            return
        from service.tracking import runs, store

        try:
            if self._client is None:
                self._client = store.client(self.records.tracking_uri)
            if key not in self._runs:
                found = runs.all_runs(self._client, [self.records.experiment_id],
                                      f"tags.`{store.TAG_TRIAL_KEY}` = {runs.quote(key)} AND "
                                      f"tags.`{store.TAG_PARENT}` = {runs.quote(self.records.parent_run_id)}")
                if not found:
                    logger.warning("race: no MLflow run for trial %s; its standing (%s) is not recorded", key, reason)
                    return
                self._runs[key] = found[0].info.run_id
            tags = {store.TAG_RACE_EXIT: reason, store.TAG_RACE_EXIT_BLOCK: str(blocks)}
            for name, value in tags.items():
                store.retry(lambda n=name, v=value: self._client.set_tag(self._runs[key], n, v))
        except Exception as e:  # noqa: BLE001 - a record, never a reason to stop the sweep
            logger.warning("race: could not tag trial %s's run (%s): %s", key, reason, e)


class RaceFile:
    """The race written through to a JSON file (``state_path``, beside Tune's experiment
    state; any ``pyarrow`` file system URI, as Tune's storage): every trial's outcomes,
    seeds and blocks, the incumbent, who left and who waits, by trial key. Written after
    each decision, so a driver killed at any moment leaves at most the one decision it was
    making unwritten, and the trial's report that led to it is made again after the resume
    (from the trial's last checkpoint), decided the same way on the same outcomes. Without a
    path (a race outside a sweep) nothing is written."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.encoded: dict[str, str] = {}  # trial key -> its RACE_OUTCOMES as reported
        self._loaded = False

    def __getstate__(self) -> dict[str, Any]:  # pickled with Tune's experiment at its start
        return {"path": self.path, "encoded": {}, "_loaded": False}

    def _fs(self) -> tuple[Any, str]:
        from pyarrow import fs

        return fs.FileSystem.from_uri(self.path if "://" in self.path else str(Path(self.path).resolve()))

    def load_into(self, race: Race) -> None:
        """Read the file into ``race`` (once; nothing when there is no file yet)."""
        if self._loaded or self.path is None:
            return
        self._loaded = True
        try:
            filesystem, path = self._fs()
            with filesystem.open_input_stream(path) as f:
                data = json.loads(f.read().decode())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            logger.warning("race: could not read the race's state from %s (%s); it starts afresh", self.path, e)
            return
        for key, trial in data["trials"].items():
            self.encoded[key] = trial["outcomes"]
            race.outcomes[key] = decode_outcomes(trial["outcomes"])
            race.seeds[key], race.blocks[key] = int(trial["seeds"]), int(trial["blocks"])
        race.incumbent = data["incumbent"]
        race.exits = {k: (reason, int(seeds)) for k, (reason, seeds) in data["exits"].items()}
        race.waiting = list(data["waiting"])
        for key, iteration, value, kept in data.get("rungs", []) if race.rungs is not None else []:
            race.record_rung(key, int(iteration), float(value), bool(kept))

    def save(self, race: Race) -> None:
        if self.path is None:
            return
        data = {"trials": {k: {"outcomes": self.encoded[k], "seeds": race.seeds[k], "blocks": race.blocks[k]}
                           for k in race.outcomes},
                "incumbent": race.incumbent, "exits": race.exits, "waiting": race.waiting,
                "rungs": race.rung_records}
        try:
            filesystem, path = self._fs()
            filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
            with filesystem.open_output_stream(path + ".tmp") as f:
                f.write(json.dumps(data).encode())
            filesystem.move(path + ".tmp", path)
        except OSError as e:
            logger.warning("race: could not write the race's state to %s (%s); a resume would start it afresh",
                           self.path, e)


class Race:
    """The race itself, by trial key (module docstring): the outcomes, seeds and blocks each
    trial reported, the incumbent, who left and who waits, and the first blocks' rungs;
    written through to ``state_path`` after every decision (`RaceFile`) and read back from it
    before the first. `RaceScheduler` runs it as Tune's scheduler (one setting per Tune
    trial); `service.sweep.race_board` runs it in an actor for the members of packs.

    Exit tags go to the trials' MLflow runs as they are decided: written by ``records``'s
    client, or (no records) kept in ``tag_events`` for the caller to write."""

    def __init__(self, spec: RaceSpec, records: TrialRecords | None = None, state_path: str | None = None,
                 rungs: RungSpec | None = None) -> None:
        self.spec = spec
        # None: first blocks train all their steps
        self.rungs = Rungs(rungs.grace, rungs.max_t, rungs.reduction_factor) if rungs is not None else None
        self.rung_records: list[tuple[str, int, float, bool]] = []  # (trial key, report, objective, kept)
        self.tags = ExitTags(records)
        self.state = RaceFile(state_path)
        self.outcomes: dict[str, dict[Any, Outcome]] = {}  # trial key -> instance -> outcome
        self.seeds: dict[str, int] = {}
        self.blocks: dict[str, int] = {}
        self.incumbent: str | None = None
        self.exits: dict[str, tuple[str, int]] = {}  # trial key -> (reason, seeds when it left)
        self.waiting: list[str] = []  # at the maximum, undecided: the incumbent has fewer seeds
        self.tag_events: list[tuple[str, str, int]] = []  # (trial key, standing, blocks): no records

    def block_report(self, t: str, encoded: str, seeds: int, blocks: int) -> bool:
        """Trial ``t`` trained ``blocks`` blocks, ``seeds`` seeds, with outcomes ``encoded``
        (`race_trial.RACE_OUTCOMES`): decide, write the race through; True when it stops."""
        self.state.load_into(self)
        self.outcomes[t] = decode_outcomes(encoded)
        self.seeds[t], self.blocks[t] = seeds, blocks
        self.state.encoded[t] = encoded
        stop = self._decide(t)
        self.state.save(self)
        kill_points.reached("race_decided")
        return stop

    def first_block_report(self, t: str, iteration: int, value: float) -> bool:
        """ASHA's rule at a first block's evaluation (report number ``iteration``, objective
        ``value``): True (stop) when it is below the top 1/``reduction_factor`` of the first
        blocks recorded at the rung it reached."""
        self.state.load_into(self)
        if t in self.exits:
            return True
        kept = self.record_rung(t, iteration, value)
        if not kept:
            self.exits[t] = (STOPPED_BY_STEPS, 0)
            self._tag(t, STOPPED_BY_STEPS, 0)
        self.state.save(self)
        kill_points.reached("race_decided")
        return not kept

    def standing(self, t: str) -> tuple[str, int] | None:
        """``t``'s standing as its run's exit tags have it: (reason, blocks), or None while
        it races as a challenger."""
        if t in self.exits:
            return self.exits[t][0], self.blocks.get(t, 0)
        return (INCUMBENT, self.blocks[t]) if t == self.incumbent else None

    def record_rung(self, t: str, iteration: int, value: float, kept: bool | None = None) -> bool:
        """`Rungs.judge` for trial ``t`` (``kept`` given: replay that decision), keeping each
        new record for the race file."""
        assert self.rungs is not None
        before = sum(len(r) for r in self.rungs.records.values())
        decision = self.rungs.judge(t, iteration, value, kept)
        if sum(len(r) for r in self.rungs.records.values()) > before:
            self.rung_records.append((t, iteration, value, decision))
        return decision

    def _tag(self, t: str, reason: str, blocks: int) -> None:
        if self.tags.records is None:
            self.tag_events.append((t, reason, blocks))
        else:
            self.tags.write(t, reason, blocks)

    # -- the rule ---------------------------------------------------------------------------
    def _decide(self, t: str) -> bool:
        """Record what ``t``'s report decides; True when its trial stops here."""
        at_max = self.seeds[t] >= self.spec.max_seeds
        if t in self.exits:  # replaced while it trained
            return True
        if self.incumbent is None:
            self._crown(t)
        if t == self.incumbent:
            for c in list(self.waiting):
                self._judge(c)
            return at_max
        left = self._judge(t)
        if not left and at_max and t != self.incumbent:
            self.waiting.append(t)
        return left or at_max

    def _judge(self, c: str) -> bool:
        """Challenger ``c`` against the incumbent on the seeds both have; True when ``c`` left."""
        i = self.incumbent
        assert i is not None
        n = min(self.seeds[c], self.seeds[i])
        mine, theirs = self._first(c, n), self._first(i, n)
        verdict = decide(mine, theirs, self.spec)
        if verdict == WORSE:
            return self._leave(c, ELIMINATED)
        if verdict == BETTER:
            self._leave(i, REPLACED)
            self._crown(c)
            return False
        if n >= self.spec.max_seeds:
            if _worst_evidence(mine) > _worst_evidence(theirs):
                self._leave(i, LOST_AT_MAX)
                self._crown(c)
                return False
            return self._leave(c, LOST_AT_MAX)
        return False

    def _first(self, t: str, n: int) -> dict[Any, Outcome]:
        return {k: o for k, o in self.outcomes[t].items() if (k[1] if isinstance(k, tuple) else k) < n}

    def _crown(self, t: str) -> None:
        self.incumbent = t
        if t in self.waiting:
            self.waiting.remove(t)
        self._tag(t, INCUMBENT, self.blocks[t])

    def _leave(self, t: str, reason: str) -> bool:
        self.exits[t] = (reason, self.seeds[t])
        if t in self.waiting:
            self.waiting.remove(t)
        self._tag(t, reason, self.blocks[t])
        return True



class RaceScheduler(FIFOScheduler, Race):
    """Tune's FIFO scheduler that races its trials by seed blocks (module docstring): after
    a block a trial goes on or stops as `Race` decides.

    The race is kept by trial key (a trial's MLflow run's ``nalu_sweep.trial_key``, which a
    trial run again after a resume keeps) and written through to ``state_path`` after every
    decision (`RaceFile`): a resumed sweep's scheduler, unpickled by Tune as it was when the
    sweep began, reads it back before its first decision."""

    def __init__(self, spec: RaceSpec, records: TrialRecords | None = None, state_path: str | None = None,
                 rungs: RungSpec | None = None) -> None:
        FIFOScheduler.__init__(self)
        Race.__init__(self, spec, records, state_path, rungs)

    def __setstate__(self, state: dict[str, Any]) -> None:  # a scheduler pickled before rungs existed
        state.setdefault("rungs", None)
        state.setdefault("rung_records", [])
        state.setdefault("tag_events", [])
        self.__dict__.update(state)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        t = trial_key(trial.trial_id, trial.config)
        if RACE_OUTCOMES in result:
            stop = self.block_report(t, str(result[RACE_OUTCOMES]), int(result[RACE_SEEDS]), int(result[RACE_BLOCK]))
        elif RACE_REPORT in result and self.rungs is not None:
            value = result.get(OBJECTIVE)
            stop = self.first_block_report(t, int(result[RACE_REPORT]), float(value if value is not None else math.nan))
        else:
            return TrialScheduler.CONTINUE
        return TrialScheduler.STOP if stop else TrialScheduler.CONTINUE

    def debug_string(self) -> str:
        return f"RaceScheduler: incumbent {self.incumbent}, {len(self.exits)} out, {len(self.waiting)} waiting"


def _worst_evidence(outcomes: dict[Any, Outcome]) -> tuple[float, int, float]:
    """`race.evidence` of the worst task (a setting is as good as its worst task)."""
    tasks: dict[Any, list[Outcome]] = {}
    for k, o in sorted(outcomes.items(), key=lambda item: repr(item[0])):
        tasks.setdefault(k[0] if isinstance(k, tuple) else None, []).append(o)
    return min(evidence(os) for os in tasks.values())
