"""Each trial's ``result.json`` written straight into the sweep's storage, line by line.

Tune's `JsonLoggerCallback` writes a trial's results into a staging folder of the driver,
which Tune copies to the storage in the background when it snapshots the experiment. A
driver killed during that copy leaves a snapshot that names trials with results but no
``result.json`` for them, and ``--resume`` then prints Tune's warning that it failed to
fetch their metrics. For a storage on this machine's file system this logger appends each
result, as one complete line, to the file Tune reads back (``<trial's path>/result.json``,
`tune.ExperimentAnalysis`), before Tune can snapshot that result; a storage behind a URI
keeps Tune's own logger.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray.tune.logger import JsonLoggerCallback, LoggerCallback

RESULT_FILE = "result.json"  # the name `tune.ExperimentAnalysis` reads a trial's results from


class ResultLog(LoggerCallback):
    """`LoggerCallback` appending each result to ``result.json`` in the trial's storage folder.

    The file is created empty as soon as the trial is seen (each step of Tune's loop, before
    and after it snapshots): Tune reads a trial's results back on restore whether or not it
    reported yet, and warns for a trial without the file (an empty one reads as no results).
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        self._create(trials)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self._create(trials)

    def _create(self, trials: list) -> None:
        for trial in trials:
            if trial.trial_id not in self._seen:
                try:
                    folder = Path(trial.path)
                except Exception:  # noqa: BLE001 - its folder is not named yet: at the next step
                    continue
                folder.mkdir(parents=True, exist_ok=True)
                (folder / RESULT_FILE).touch()
                self._seen.add(trial.trial_id)

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        folder = Path(trial.path)
        folder.mkdir(parents=True, exist_ok=True)
        line = json.dumps(result, default=_plain) + "\n"
        with open(folder / RESULT_FILE, "a", encoding="utf-8", buffering=1 << 20) as f:
            f.write(line)  # one write(2) of a whole line at close: a kill leaves whole lines only


def _plain(value: Any) -> Any:
    """What `json` cannot write as it is (numpy numbers, paths): its float, else its text."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def result_logger(storage_path: str) -> LoggerCallback:
    """`ResultLog` for a storage path on this machine, Tune's JSON logger for a URI."""
    return JsonLoggerCallback() if "://" in storage_path else ResultLog()
