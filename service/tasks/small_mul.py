"""The small multiplication problem (Madsen & Johansen 2020): ``t = (x1+x2+x3+x4)(x1+x2)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from service.tasks.base import Task

if TYPE_CHECKING:
    import torch


class SmallMulTask(Task):
    """``x ∈ R^4``, ``a = x1+x2+x3+x4``, ``b = x1+x2``, ``t = a·b`` (docs/domain/tasks.md)."""

    kind: Literal["small_mul"] = "small_mul"

    @property
    def input_size(self) -> int:
        return 4

    @property
    def output_size(self) -> int:
        return 1

    def selection(self) -> torch.Tensor:
        import torch

        return torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)

    def apply_operation(self, operands: torch.Tensor) -> torch.Tensor:
        return (operands[..., 0] * operands[..., 1]).unsqueeze(-1)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        b = x[..., 0] + x[..., 1]
        a = b + x[..., 2] + x[..., 3]
        return (a * b).unsqueeze(-1)

    def default_model(self) -> list[dict[str, Any]]:
        """NAU (4 → 2) → NMU (2 → 1)."""
        return [{"unit": "nau"}, {"unit": "nmu"}]
