"""The checkpoint of a trial: which task it is on, that task's trainer, finished tasks.

A trial trains its setting on each task in turn. Its checkpoint (one file in a directory
that Ray Tune copies to the sweep's storage) holds the results of the finished tasks and
the `TrainerCheckpoint` of the task in progress (none at a task boundary), so a retried or
resumed trial continues where the checkpoint was taken. Same rules as the trainer's:
`torch.save` / ``torch.load(weights_only=True)``, plain data only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.config import RunConfig
from service.training.checkpoint import (
    FORMAT,
    CheckpointError,
    TrainerCheckpoint,
    config_fingerprint,
    load_payload,
    result_from_payload,
    result_payload,
    save_payload,
)
from service.training.result import RunResult

FILE = "trial_state.pt"


@dataclass(frozen=True)
class TrialState:
    """A trial after ``step`` training steps (summed over its tasks)."""

    task_index: int  # the task in progress (= the number of finished tasks)
    step: int
    finished: dict[str, RunResult] = field(default_factory=dict)  # in task order
    trainer: TrainerCheckpoint | None = None  # the task in progress, mid-run; None: not started

    def save(self, directory: str | Path) -> Path:
        payload = {
            "format": FORMAT,
            "task_index": self.task_index,
            "step": self.step,
            "finished": {name: result_payload(r) for name, r in self.finished.items()},
            "trainer": None if self.trainer is None else self.trainer.to_payload(),
        }
        return save_payload(payload, Path(directory) / FILE)

    @classmethod
    def load(cls, directory: str | Path, configs: dict[str, RunConfig]) -> "TrialState":
        """Read the state in ``directory`` for a trial whose tasks are ``configs`` (in order);
        a state of another trial is refused (`CheckpointError`)."""
        payload = load_payload(Path(directory) / FILE)
        if payload.get("format") != FORMAT:
            raise CheckpointError(f"not a trial checkpoint of format {FORMAT} (got {payload.get('format')!r})")
        try:
            index, step = int(payload["task_index"]), int(payload["step"])
            finished: dict[str, Any] = payload["finished"]
            trainer = payload["trainer"]
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"not a valid trial checkpoint ({type(e).__name__}: {e})") from None
        names = list(configs)
        if not 0 <= index < len(names) or list(finished) != names[:index]:
            raise CheckpointError(f"the trial checkpoint (task {index}, finished {list(finished)}) does not "
                                  f"fit this trial's tasks {names}")
        if isinstance(trainer, dict) and trainer.get("config_fingerprint") != config_fingerprint(configs[names[index]]):
            raise CheckpointError(f"the trial checkpoint does not fit this trial: task {names[index]!r} "
                                  "was checkpointed with another run configuration")
        return cls(
            task_index=index, step=step,
            finished={name: result_from_payload(p, configs[name]) for name, p in finished.items()},
            trainer=None if trainer is None else TrainerCheckpoint.from_payload(trainer),
        )
