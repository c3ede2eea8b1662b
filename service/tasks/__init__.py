"""Tasks of docs/domain/tasks.md, keyed by ``kind``; `parse_task` turns a mapping into a task config."""

from __future__ import annotations

from typing import Any, Mapping

from service.tasks.arithmetic import ArithmeticTask
from service.tasks.base import EVAL_MASTER_SEED, THRESHOLD_EPSILON, Task
from service.tasks.identity import IdentityTask
from service.tasks.many_operands import ManyOperandsTask
from service.tasks.operation_only import OperationOnlyTask
from service.tasks.ranges import Range
from service.tasks.sequence import SequenceSet, SequenceTask
from service.tasks.sequence_arithmetic import SequenceArithmeticTask
from service.tasks.sequential_digits import SequentialDigitsTask
from service.tasks.single_unit import SingleUnitTask
from service.tasks.small_mul import SmallMulTask
from service.tasks.subset_only import SubsetOnlyTask

TASKS: dict[str, type[Task]] = {
    cls.model_fields["kind"].default: cls
    for cls in (
        ArithmeticTask, SmallMulTask, SingleUnitTask, SubsetOnlyTask,
        OperationOnlyTask, IdentityTask, ManyOperandsTask,
        SequenceArithmeticTask, SequentialDigitsTask,
    )
}


def task_kinds() -> list[str]:
    return list(TASKS)


def parse_task(data: Mapping[str, Any] | Task) -> Task:
    """A validated task from ``{"kind": ..., **fields}`` (or the task itself).

    An unknown or missing kind is a ValueError listing the valid kinds; field errors are
    pydantic's ValidationError, which names the field.
    """
    if isinstance(data, Task):
        return data
    if not isinstance(data, Mapping):
        raise ValueError(f"a task is a mapping with a 'kind' ({', '.join(TASKS)}), got {data!r}")
    kind = data.get("kind")
    if kind is None:
        raise ValueError(f"the task needs a 'kind'; valid kinds: {', '.join(TASKS)}")
    cls = TASKS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown task kind {kind!r}; valid kinds: {', '.join(TASKS)}")
    return cls.model_validate(dict(data))


__all__ = [
    "EVAL_MASTER_SEED", "THRESHOLD_EPSILON", "TASKS", "Range", "Task", "parse_task", "task_kinds",
    "ArithmeticTask", "SmallMulTask", "SingleUnitTask", "SubsetOnlyTask", "OperationOnlyTask",
    "IdentityTask", "ManyOperandsTask", "SequenceTask", "SequenceSet", "SequenceArithmeticTask",
    "SequentialDigitsTask",
]
