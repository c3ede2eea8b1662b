"""The sweep's own figures as Ray metrics (`ray.util.metrics`), exported with Ray's to
Prometheus by every node's metrics agent (Ray's ``ray[default]`` install) and drawn by the
Grafana dashboards in ``dashboards/``.

`SweepMetrics` is a driver-side Tune callback: it sees every trial event and result, so the
figures come from one process. Ray prefixes each name with ``ray_`` and a counter's with a
``_total`` suffix; it adds ``SessionName``, ``NodeAddress`` (the driver's node) and
``WorkerId`` labels. The node a trial trains on is the ``node`` label (Tune's ``node_ip``).

=============================================  ==================  ==============================
metric (as Prometheus sees it)                 labels              what
=============================================  ==================  ==============================
``ray_nalu_sweep_trials``                      sweep, state        trials running / done /
                                                                   pruned / failed (a pack's
                                                                   members count one each)
``ray_nalu_sweep_seed_steps_per_second``       sweep, trial, node  seeds × training steps per
                                                                   second of a running trial
                                                                   (0 once it has ended)
``ray_nalu_sweep_seed_steps_total``            sweep, node         seeds × training steps done
                                                                   (``rate()``: per node)
``ray_nalu_sweep_seeds_solved``                sweep               seeds solved so far, summed
                                                                   over the trials' latest
                                                                   reports
=============================================  ==================  ==============================

A sweep without Ray's metrics agent (a minimal ``ray`` install) still runs: the metrics are
then recorded and dropped by Ray. Nor does an error of the export stop a sweep: it is
reported once and the export turned off.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ray.tune import Callback

from service.sweep.results import DONE, PACK_MEMBERS, PRUNED, STATE, STEP, member_key, member_results

TRIALS = "nalu_sweep_trials"
SEED_STEPS_PER_SECOND = "nalu_sweep_seed_steps_per_second"
SEED_STEPS = "nalu_sweep_seed_steps"
SEEDS_SOLVED = "nalu_sweep_seeds_solved"
STATES = ("running", "done", "pruned", "failed")
log = logging.getLogger(__name__)


def trial_steps(trial_id: str, config: dict[str, Any], result: dict[str, Any]) -> dict[str, tuple[int, int | None]]:
    """``{trial key: (steps done, seeds solved or None)}`` from one Tune result: the trial's
    own, or each pack member's (`service.sweep.pack`)."""
    if PACK_MEMBERS not in config:
        solved = result.get("successes")
        return {trial_id: (int(result.get(STEP) or 0), int(solved) if solved is not None else None)}
    out = {}
    for index, member in member_results(result).items():
        solved = member.get("successes")
        out[member_key(trial_id, index)] = (int(member.get(STEP) or 0), int(solved) if solved is not None else None)
    return out


@dataclass
class _Trial:
    node: str
    steps: int = 0
    at: float = field(default_factory=time.monotonic)
    solved: int = 0
    state: str = "running"


@dataclass
class SweepFigures:
    """The figures of one sweep, kept from Tune's events (no Ray needed: tested alone);
    `SweepMetrics` exports them."""

    seeds: int
    trials: dict[str, _Trial] = field(default_factory=dict)

    def started(self, keys: list[str], node: str) -> None:
        for key in keys:
            self.trials.setdefault(key, _Trial(node)).state = "running"

    def result(self, steps: dict[str, tuple[int, int | None]], node: str,
               now: float | None = None) -> list[tuple[str, str, float, int]]:
        """Record a result; ``[(trial key, node, seed·steps per second, new seed·steps)]``."""
        now = time.monotonic() if now is None else now
        out = []
        for key, (done, solved) in steps.items():
            trial = self.trials.setdefault(key, _Trial(node, at=now))
            trial.node = node or trial.node
            new = max(0, done - trial.steps) * self.seeds
            elapsed = now - trial.at
            rate = new / elapsed if elapsed > 0 else 0.0
            trial.steps, trial.at = max(trial.steps, done), now
            if solved is not None:
                trial.solved = solved
            out.append((key, trial.node, rate, new))
        return out

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATES, 0)
        for trial in self.trials.values():
            out[trial.state] += 1
        return out

    def solved(self) -> int:
        return sum(t.solved for t in self.trials.values())


def _keys(trial_id: str, config: dict[str, Any]) -> list[str]:
    members = config.get(PACK_MEMBERS)
    return [trial_id] if members is None else [member_key(trial_id, i) for i in range(len(members))]


class SweepMetrics(Callback):
    """Tune callback (driver side) exporting `SweepFigures` through `ray.util.metrics`. It
    pickles (into Tune's experiment state) as its settings only."""

    def __init__(self, sweep: str, seeds: int, total_steps: int) -> None:
        self.sweep, self.seeds, self.total_steps = sweep, seeds, total_steps
        self._setup()

    def _setup(self) -> None:
        self.figures = SweepFigures(self.seeds)
        self._metrics: dict[str, Any] | None = None
        self._broken = False

    def __getstate__(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "seeds": self.seeds, "total_steps": self.total_steps}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def metrics(self) -> dict[str, Any]:
        if self._metrics is None:
            from ray.util.metrics import Counter, Gauge

            self._metrics = {
                TRIALS: Gauge(TRIALS, "trials of the sweep by state (pack members one each)", ("sweep", "state")),
                SEED_STEPS_PER_SECOND: Gauge(SEED_STEPS_PER_SECOND, "seeds x training steps per second of a "
                                             "running trial (0 once ended)", ("sweep", "trial", "node")),
                SEED_STEPS: Counter(SEED_STEPS, "seeds x training steps done", ("sweep", "node")),
                SEEDS_SOLVED: Gauge(SEEDS_SOLVED, "seeds solved so far (the trials' latest reports)", ("sweep",)),
            }
        return self._metrics

    def _export_counts(self) -> None:
        m = self.metrics()
        for state, n in self.figures.counts().items():
            m[TRIALS].set(n, tags={"sweep": self.sweep, "state": state})
        m[SEEDS_SOLVED].set(self.figures.solved(), tags={"sweep": self.sweep})

    def _guarded(self, event: Any, *args: Any) -> None:
        """Run an event's handler; an error turns the export off (reported once), never the sweep."""
        if self._broken:
            return
        try:
            event(*args)
        except Exception as e:  # noqa: BLE001 - the figures are a view; the sweep goes on without them
            self._broken = True
            log.warning("nalu-sweep: exporting the sweep's metrics to Ray failed (%s: %s); no more are exported",
                        type(e).__name__, e)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._guarded(self._started, trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self._guarded(self._result, trial, result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._guarded(self._ended, trial, None)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._guarded(self._ended, trial, "failed")

    def _started(self, trial: Any) -> None:
        self.figures.started(_keys(trial.trial_id, trial.config), "")
        self._export_counts()

    def _result(self, trial: Any, result: dict[str, Any]) -> None:
        m = self.metrics()
        node = str(result.get("node_ip") or "")
        for key, where, rate, new in self.figures.result(trial_steps(trial.trial_id, trial.config, result), node):
            m[SEED_STEPS_PER_SECOND].set(rate, tags={"sweep": self.sweep, "trial": key, "node": where})
            if new:
                m[SEED_STEPS].inc(new, tags={"sweep": self.sweep, "node": where})
        if PACK_MEMBERS in trial.config:  # members ASHA stopped inside the pack
            for index, member in member_results(result).items():
                if member.get(STATE) in (DONE, PRUNED):
                    self._end([member_key(trial.trial_id, index)], member[STATE])
        self._export_counts()

    def _end(self, keys: list[str], state: str | None = None) -> None:
        """End the running trials among ``keys``: as ``state``, or (None) done when they
        trained every step, else pruned."""
        for key in keys:
            trial = self.figures.trials.get(key)
            if trial is None or trial.state != "running":
                continue
            trial.state = state or ("done" if trial.steps >= self.total_steps else "pruned")
            self.metrics()[SEED_STEPS_PER_SECOND].set(0.0, tags={"sweep": self.sweep, "trial": key, "node": trial.node})

    def _ended(self, trial: Any, state: str | None) -> None:
        self._end(_keys(trial.trial_id, trial.config), state)
        self._export_counts()
