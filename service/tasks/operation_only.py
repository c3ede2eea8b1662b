"""Operation only (Madsen & Johansen 2020 ablation): learn ``a ∘ b`` from ``(a, b)``."""

from __future__ import annotations

from typing import Literal

from service.tasks.binary import BinaryOperationTask


class OperationOnlyTask(BinaryOperationTask):
    """The arithmetic task's second layer alone: inputs ``(a, b)``, target ``a ∘ b``.

    The same data as `SingleUnitTask` without redundant inputs; kept as its own kind so
    ablation results are labelled as the papers label them.
    """

    kind: Literal["operation_only"] = "operation_only"
