"""Single-unit arithmetic (Madsen & Johansen 2020): two operand inputs plus distractors."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from service.tasks.binary import BinaryOperationTask


class SingleUnitTask(BinaryOperationTask):
    """``t = x1 ∘ x2`` from ``2 + redundant_inputs`` inputs (the papers use 0, 10, 100);
    the redundant inputs are drawn from the same range and do not affect the target."""

    kind: Literal["single_unit"] = "single_unit"
    redundant_inputs: int = Field(0, ge=0, le=100_000, description="inputs that do not take part")

    @property
    def input_size(self) -> int:
        return 2 + self.redundant_inputs
