"""Arithmetic with subset selection, the standard benchmark (Trask et al. 2018; Madsen &
Johansen 2020): ``t = a ∘ b`` with ``a``, ``b`` sums of two overlapping input subsets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from service.tasks.operations import Operation, apply_binary, check_operation_ranges
from service.tasks.subsets import SubsetTask

if TYPE_CHECKING:
    import torch


class ArithmeticTask(SubsetTask):
    """``x ∈ R^100`` i.i.d. from the interpolation range, ``t = a ∘ b`` (docs/domain/tasks.md)."""

    kind: Literal["arithmetic"] = "arithmetic"
    PACKABLE: ClassVar[frozenset[str]] = frozenset({"operation"})  # the target alone
    operation: Operation = Field("mul", description="add, sub, mul, div, squared (a·a) or root (√a)")

    @model_validator(mode="after")
    def _operation_fits_ranges(self) -> "ArithmeticTask":
        check_operation_ranges(self.operation, self.ranges())
        return self

    @property
    def output_size(self) -> int:
        return 1

    def selection(self) -> torch.Tensor:
        return self.subset_selection()

    def apply_operation(self, operands: torch.Tensor) -> torch.Tensor:
        return apply_binary(self.operation, operands[..., 0], operands[..., 1]).unsqueeze(-1)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.subset_sums(x)
        return apply_binary(self.operation, a, b).unsqueeze(-1)

    def default_model(self) -> list[dict[str, Any]]:
        """The papers' two layers (hidden size 2): NAU → NAU for add/sub, NAU → NMU for
        mul and squared (the hidden layer holds a twice), NAC+ → NAC• for div and root,
        whose exponents −1 and ½ an NMU cannot express."""
        second = {"add": "nau", "sub": "nau", "mul": "nmu", "squared": "nmu"}.get(self.operation)
        if second is None:
            return [{"unit": "nac_add"}, {"unit": "nac_mul"}]
        return [{"unit": "nau"}, {"unit": second}]
