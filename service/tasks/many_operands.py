"""Sum or product of many operands (Trask et al. 2018) with NAC / NALU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from service.tasks.base import THRESHOLD_EPSILON, Task
from service.tasks.operations import single_unit_error

if TYPE_CHECKING:
    import torch


class ManyOperandsTask(Task):
    """``t = Σ_i x_i`` or ``Π_i x_i`` over ``n_operands`` inputs (2 to 10)."""

    kind: Literal["many_operands"] = "many_operands"
    operation: Literal["sum", "product"] = Field("sum", description="sum or product of the inputs")
    n_operands: int = Field(2, ge=2, le=10, description="number of operands (2 to 10)")

    @property
    def input_size(self) -> int:
        return self.n_operands

    @property
    def output_size(self) -> int:
        return 1

    def selection(self) -> torch.Tensor:
        import torch

        return torch.eye(self.n_operands, dtype=torch.float64)

    def apply_operation(self, operands: torch.Tensor) -> torch.Tensor:
        if self.operation == "sum":
            return operands.sum(-1, keepdim=True)
        return operands.prod(-1, keepdim=True)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_operation(x)

    def nearly_perfect_error(self, x: torch.Tensor, epsilon: float = THRESHOLD_EPSILON) -> torch.Tensor:
        """One unit with all-ones weights (coefficients for a sum, exponents for a product),
        each moved to 1 − ε; see `single_unit_error`."""
        import torch

        weights = torch.ones(self.n_operands, dtype=torch.float64)
        return single_unit_error(x, weights, self.operation == "sum", self.target(x), epsilon)

    def default_model(self) -> list[dict[str, Any]]:
        """One NAC: NAC+ for a sum, NAC• for a product (a NALU is chosen via the model)."""
        return [{"unit": "nac_add" if self.operation == "sum" else "nac_mul"}]
