"""Live progress of a sweep in the terminal: a rich table fed by a Tune callback.

Ray 2.60 ignores custom progress reporters, so the driver-side `LiveProgress` callback
receives Tune's trial events and redraws a `SweepBoard`. The callback is pickled into Tune's
experiment state; it pickles as a name only and finds the board of the running process
again (`register_board`), so a restored sweep shows its progress on the new terminal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ray.tune import Callback
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from service.formatting import fmt_interval, fmt_param
from service.scoring.objective import OBJECTIVE
from service.sweep.results import (
    DONE,
    PACK_MEMBERS,
    PRUNED,
    STATE,
    STEP,
    member_key,
    member_results,
)

_BOARDS: dict[str, "SweepBoard"] = {}
MAX_ROWS = 16


@dataclass
class TrialLine:
    name: str
    params: dict[str, Any]
    state: str = "pending"
    step: int = 0
    objective: float | None = None
    successes: int | None = None
    n_seeds: int | None = None
    ci: tuple[float, float] | None = None
    last_result: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None


class SweepBoard:
    """The state of a running sweep and its rich rendering."""

    def __init__(self, sweep: str, total_trials: int, total_steps: int, console: Console | None = None,
                 live: bool = True, concurrency: int = 1) -> None:
        self.sweep = sweep
        self.concurrency = max(1, concurrency)
        self.total_trials = total_trials
        self.total_steps = total_steps
        self.console = console or Console()
        self.trials: dict[str, TrialLine] = {}
        self.started = time.monotonic()
        self._live: Live | None = None
        self._use_live = live and self.console.is_terminal

    # -- events ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._use_live and self._live is None:
            self._live = Live(self, console=self.console, refresh_per_second=2, transient=False)
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    @staticmethod
    def _shown(params: dict[str, Any]) -> dict[str, Any]:
        """The searched values of a Tune config (not the run configs the driver adds)."""
        return {k: v for k, v in params.items() if not (k.startswith("__") and k.endswith("__"))}

    def _lines(self, trial_id: str, config: dict[str, Any]) -> list[TrialLine]:
        """The lines of a Tune trial: one, or one per member of a pack (`service.sweep.pack`)."""
        members = config.get(PACK_MEMBERS)
        if members is None:
            return [self.trials.setdefault(trial_id, TrialLine(trial_id, self._shown(config)))]
        return [self.trials.setdefault(key, TrialLine(key, dict(m["params"])))
                for key, m in ((member_key(trial_id, i), m) for i, m in enumerate(members))]

    def trial_started(self, trial_id: str, params: dict[str, Any]) -> None:
        for line in self._lines(trial_id, params):
            line.state = "running"
        self._refresh()

    def trial_result(self, trial_id: str, params: dict[str, Any], result: dict[str, Any]) -> None:
        lines = self._lines(trial_id, params)
        if PACK_MEMBERS not in params:
            self._update(lines[0], result)
        for index, shown in member_results(result).items():
            line = self.trials.setdefault(member_key(trial_id, index), TrialLine(member_key(trial_id, index), {}))
            if line.ended is None:
                self._update(line, shown)
                if shown.get(STATE) in (DONE, PRUNED):
                    line.state, line.ended = "done" if shown[STATE] == DONE else "pruned", time.monotonic()
        self._refresh()

    @staticmethod
    def _update(line: TrialLine, result: dict[str, Any]) -> None:
        line.state = "running"
        line.last_result = dict(result)
        line.step = int(result.get(STEP, line.step) or 0)
        line.objective = result.get(OBJECTIVE, line.objective)
        if "successes" in result and "n_seeds" in result:
            line.successes, line.n_seeds = int(result["successes"]), int(result["n_seeds"])
        if "success_ci_low" in result and "success_ci_high" in result:
            line.ci = (float(result["success_ci_low"]), float(result["success_ci_high"]))

    def trial_finished(self, trial_id: str, params: dict[str, Any], error: bool = False) -> None:
        for line in self._lines(trial_id, params):
            if line.ended is not None and PACK_MEMBERS in params:
                continue  # a member that finished before its pack
            if error:
                line.state = "failed"
            else:
                line.state = "done" if line.step >= self.total_steps else "pruned"
            line.ended = time.monotonic()
            if self._live is None and self.console is not None and not self._use_live:
                self.console.print(self._line_text(line), highlight=False)
        self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.refresh()

    def __rich__(self) -> Group:
        """Rendered afresh at every refresh of the live display (the clock keeps going)."""
        return self.render()

    # -- rendering --------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        out = {"running": 0, "done": 0, "pruned": 0, "failed": 0}
        for line in self.trials.values():
            out[line.state] = out.get(line.state, 0) + 1
        return out

    def best(self) -> TrialLine | None:
        done = [t for t in self.trials.values() if t.state == "done" and t.objective is not None]
        return max(done, key=lambda t: t.objective) if done else None

    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds until every trial has finished, from the mean time of the finished ones:
        what the running trials still need plus the pending ones, ``concurrency`` at a
        time (``None`` until a trial has finished)."""
        now = time.monotonic() if now is None else now
        finished = [t for t in self.trials.values() if t.ended is not None]
        if not finished:
            return None
        mean = sum(t.ended - t.started for t in finished) / len(finished)
        running = [t for t in self.trials.values() if t.ended is None]
        pending = max(0, self.total_trials - len(finished) - len(running))
        work = sum(max(0.0, mean - (now - t.started)) for t in running) + pending * mean
        return work / self.concurrency

    def _line_text(self, line: TrialLine) -> str:
        rate = f"{line.successes}/{line.n_seeds}" if line.successes is not None else "—"
        obj = f"{line.objective:.3f}" if line.objective is not None else "—"
        params = ", ".join(f"{k}={fmt_param(v)}" for k, v in line.params.items())
        return f"{self.sweep} {line.name}: {line.state} at step {line.step}, objective {obj}, success {rate}  {params}"

    def render(self) -> Group:
        c = self.counts()
        elapsed = time.monotonic() - self.started
        best = self.best()
        eta = self.eta_s()
        if not self.trials:
            when = " · waiting for Ray to start the first trials…"
        else:
            when = f" · about {_duration(eta)} left" if eta is not None else " · ETA after the first trial"
        head = Text.assemble(
            (f"sweep {self.sweep}", "bold"),
            f"  {c['done'] + c['pruned'] + c['failed']}/{self.total_trials} finished"
            f" · {c['running']} running · {c['pruned']} pruned · {c['failed']} failed"
            f" · {elapsed:.0f} s{when}",
            (f"  best {best.objective:.3f} ({best.name})" if best else "", "green"),
        )
        table = Table(show_edge=False, pad_edge=False, box=None)
        for col in ("trial", "state", "progress", "objective", "success [95% CI]", "parameters"):
            table.add_column(col, overflow="fold")
        lines = sorted(self.trials.values(), key=lambda t: t.started)[-MAX_ROWS:]
        for t in lines:
            progress = f"{100 * min(1.0, t.step / max(1, self.total_steps)):.0f}%"
            success = "—"
            if t.successes is not None:
                success = f"{t.successes}/{t.n_seeds}"
                if t.ci:
                    success += f" [{fmt_interval(t.ci[0], t.ci[1])}]"
            style = {"done": "green", "pruned": "yellow", "failed": "red"}.get(t.state, "")
            table.add_row(t.name, Text(t.state, style=style), progress,
                          f"{t.objective:.3f}" if t.objective is not None else "—", success,
                          ", ".join(f"{k}={fmt_param(v)}" for k, v in t.params.items()))
        return Group(head, table)


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2 h 05 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def register_board(board: SweepBoard) -> None:
    _BOARDS[board.sweep] = board


def unregister_board(board: SweepBoard) -> None:
    if _BOARDS.get(board.sweep) is board:
        del _BOARDS[board.sweep]


class LiveProgress(Callback):
    """Tune callback (driver side) that forwards trial events to the registered board."""

    def __init__(self, sweep: str) -> None:
        self.sweep = sweep

    def __getstate__(self) -> dict[str, Any]:
        return {"sweep": self.sweep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.sweep = state["sweep"]

    @property
    def board(self) -> SweepBoard | None:
        return _BOARDS.get(self.sweep)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.board:
            self.board.trial_started(trial.trial_id, trial.config)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if self.board:
            self.board.trial_result(trial.trial_id, trial.config, result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.board:
            self.board.trial_finished(trial.trial_id, trial.config)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.board:
            self.board.trial_finished(trial.trial_id, trial.config, error=True)
