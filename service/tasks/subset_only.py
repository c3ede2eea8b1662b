"""Subset selection only (Madsen & Johansen 2020 ablation): learn ``(a, b)`` from ``x``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from service.tasks.subsets import SubsetTask

if TYPE_CHECKING:
    import torch


class SubsetOnlyTask(SubsetTask):
    """The arithmetic task's first layer alone: two outputs, ``a = Σ x[A]``, ``b = Σ x[B]``."""

    kind: Literal["subset_only"] = "subset_only"

    @property
    def output_size(self) -> int:
        return 2

    def selection(self) -> torch.Tensor:
        return self.subset_selection()

    def apply_operation(self, operands: torch.Tensor) -> torch.Tensor:
        return operands

    def target(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        a, b = self.subset_sums(x)
        return torch.stack((a, b), dim=-1)

    def default_model(self) -> list[dict[str, Any]]:
        """One NAU layer ``I → 2``."""
        return [{"unit": "nau"}]
