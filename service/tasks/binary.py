"""Tasks whose inputs are the operands themselves: ``a = x1``, ``b = x2`` (no selection)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from service.tasks.base import THRESHOLD_EPSILON, Task
from service.tasks.operations import (
    Operation,
    apply_binary,
    check_operation_ranges,
    single_unit_error,
    single_unit_weights,
    unit_for_operation,
)

if TYPE_CHECKING:
    import torch


class BinaryOperationTask(Task):
    """``t = x1 ∘ x2``; subclasses may add inputs that do not take part."""

    operation: Operation = Field("mul", description="add, sub, mul, div, squared (a·a) or root (√a)")

    @model_validator(mode="after")
    def _operation_fits_ranges(self) -> "BinaryOperationTask":
        check_operation_ranges(self.operation, self.ranges())
        return self

    @property
    def input_size(self) -> int:
        return 2

    @property
    def output_size(self) -> int:
        return 1

    def selection(self) -> torch.Tensor:
        import torch

        sel = torch.zeros(2, self.input_size, dtype=torch.float64)
        sel[0, 0] = 1.0
        sel[1, 1] = 1.0
        return sel

    def apply_operation(self, operands: torch.Tensor) -> torch.Tensor:
        return apply_binary(self.operation, operands[..., 0], operands[..., 1]).unsqueeze(-1)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        return apply_binary(self.operation, x[..., 0], x[..., 1]).unsqueeze(-1)

    def nearly_perfect_error(self, x: torch.Tensor, epsilon: float = THRESHOLD_EPSILON) -> torch.Tensor:
        """No selection layer here: one unit computes ``x1 ∘ x2``, so its own exact weights
        (`single_unit_weights`: coefficients or exponents) are moved by ε. Perturbing an
        identity selection instead would make the add threshold exactly 0 (the leaks cancel)."""
        weights = single_unit_weights(self.operation, self.input_size)
        additive = self.operation in ("add", "sub")
        return single_unit_error(x, weights, additive, self.target(x), epsilon)

    def default_model(self) -> list[dict[str, Any]]:
        """One layer that can express the operation (see `unit_for_operation`)."""
        return [{"unit": unit_for_operation(self.operation)}]
