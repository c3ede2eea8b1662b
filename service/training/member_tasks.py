"""Each member's task in a packed run: members may differ in the task fields that set the
target alone (a task's ``PACKABLE``: the arithmetic task's operation), so the four
operations of a model can train as one seed batch.

Such members share their inputs (the training draws are per seed anyway, and every
evaluation set's inputs depend on the range and the dataset seed only); what differs is
the target, computed per run of seeds by that run's own task with the same elementwise
operations as alone, and the success thresholds. A seed therefore trains and scores
bit-identically in a pack of mixed operations and alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from service.config import RunConfig
from service.tasks.base import Task


@dataclass(frozen=True)
class MemberTasks:
    """The distinct tasks of a pack's members, and which seed rows each one targets."""

    tasks: tuple[Task, ...]  # distinct, in order of first appearance
    member_task: tuple[int, ...]  # per member, its index in ``tasks``
    runs: tuple[tuple[int, slice], ...]  # (task index, seed rows): maximal runs of one task

    @classmethod
    def of(cls, members: Sequence[RunConfig]) -> "MemberTasks":
        keys: list[str] = []
        tasks: list[Task] = []
        member_task: list[int] = []
        for m in members:
            key = m.task.config_key()
            if key not in keys:
                keys.append(key)
                tasks.append(m.task)
            member_task.append(keys.index(key))
        runs: list[tuple[int, slice]] = []
        start = 0
        for m, index in zip(members, member_task):
            if runs and runs[-1][0] == index:
                runs[-1] = (index, slice(runs[-1][1].start, start + m.seeds))
            else:
                runs.append((index, slice(start, start + m.seeds)))
            start += m.seeds
        return cls(tuple(tasks), tuple(member_task), tuple(runs))

    @property
    def mixed(self) -> bool:
        """Whether the members' targets differ (more than one distinct task)."""
        return len(self.tasks) > 1

    def seed_task(self) -> list[int]:
        """Per seed row, the index of its task."""
        return [index for index, rows in self.runs for _ in range(rows.start, rows.stop)]

    def targets(self, target: Callable[[Task, Tensor], Tensor], inputs: Tensor) -> Tensor:
        """``target(task, rows)`` for each run of seeds' rows of ``inputs [S, ...]``, joined
        along the seed dimension (one call on all rows when the tasks are one)."""
        if not self.mixed:
            return target(self.tasks[0], inputs)
        return torch.cat([target(self.tasks[index], inputs[rows]) for index, rows in self.runs])

    def thresholds(self) -> list[dict[str, float]]:
        """Per member, its task's success thresholds."""
        per_task = [task.success_thresholds() for task in self.tasks]
        return [per_task[index] for index in self.member_task]

    def evaluation_sets(self, device: torch.device, dtype: torch.dtype) -> dict[str, tuple[Tensor, Tensor]]:
        """``{name: (x [N, I], y)}`` on ``device`` in ``dtype``: ``y [N, O]`` when the tasks
        are one, else ``[T, N, O]``, task by task (a seed reads row `seed_task`). Targets in
        float64 are recomputed from the float32 inputs in float64."""
        first = self.tasks[0].evaluation_sets()
        out = {}
        for name, (x, _) in first.items():
            ys = []
            for task in self.tasks:
                tx, y = task.evaluation_sets()[name]
                if tx is not x and not torch.equal(tx, x):
                    raise ValueError("the members of a pack must share their evaluation inputs")
                ys.append(y if dtype == y.dtype else task.target(x.to(dtype)))
            y = ys[0] if len(ys) == 1 else torch.stack(ys)
            out[name] = (x.to(device, dtype), y.to(device, dtype))
        return out
