"""Two subsets of consecutive input positions: the selection half of the arithmetic task."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from service import limits
from service.tasks.base import Task

if TYPE_CHECKING:
    import torch


def _floor(value: float) -> int:
    """``floor`` that forgives float noise (0.29 · 100 = 28.999… is 29 positions)."""
    return math.floor(value + 1e-9)


def _mix64(value: int) -> int:
    """SplitMix64's finaliser: a well-spread 64-bit integer from a small seed."""
    mask = (1 << 64) - 1
    z = (value + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


class SubsetTask(Task):
    """``a = Σ x[A]``, ``b = Σ x[B]`` over two runs of consecutive positions (docs/domain/tasks.md).

    Each subset has ``floor(subset_ratio · input_size)`` positions; B starts
    ``floor(overlap_ratio · subset_size)`` positions before A ends; the pair sits at an
    offset drawn from ``dataset_seed`` (fixed for the dataset, not per training seed).
    """

    input_size: int = Field(100, ge=1, le=limits.MAX_WIDTH, description="number of inputs x")
    subset_ratio: float = Field(0.25, gt=0, le=1, description="subset size as a share of input_size")
    overlap_ratio: float = Field(0.5, ge=0, le=1, description="overlap as a share of the subset size")

    @model_validator(mode="after")
    def _subsets_fit(self) -> "SubsetTask":
        size = self.subset_size
        if size < 1:
            raise ValueError(
                f"subset_ratio={self.subset_ratio} of input_size={self.input_size} gives empty "
                "subsets; raise subset_ratio or input_size"
            )
        if self.subsets_span > self.input_size:
            raise ValueError(
                f"the subsets do not fit: subset_ratio={self.subset_ratio} and "
                f"overlap_ratio={self.overlap_ratio} give two subsets of {size} positions "
                f"spanning {self.subsets_span}, more than input_size={self.input_size}"
            )
        return self

    @property
    def subset_size(self) -> int:
        return _floor(self.subset_ratio * self.input_size)

    @property
    def overlap(self) -> int:
        return _floor(self.overlap_ratio * self.subset_size)

    @property
    def subsets_span(self) -> int:
        return 2 * self.subset_size - self.overlap

    def subset_bounds(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """``((a_start, a_end), (b_start, b_end))``, end exclusive.

        Plain integer arithmetic on the fields (no hashing library, no cache), so a compiled
        training step traces it into constants.
        """
        size, overlap = self.subset_size, self.overlap
        offset = _mix64(self.dataset_seed) % (self.input_size - self.subsets_span + 1)
        b_start = offset + size - overlap
        return (offset, offset + size), (b_start, b_start + size)

    def subset_selection(self) -> torch.Tensor:
        """``[2, I]`` float64: row 0 selects A, row 1 selects B."""
        import torch

        (a0, a1), (b0, b1) = self.subset_bounds()
        sel = torch.zeros(2, self.input_size, dtype=torch.float64)
        sel[0, a0:a1] = 1.0
        sel[1, b0:b1] = 1.0
        return sel

    def operand_runs(self) -> tuple[tuple[int, int], ...]:
        return self.subset_bounds()

    def subset_sums(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a, b)``, each ``[...]``, as slice sums of ``x [..., I]``."""
        (a0, a1), (b0, b1) = self.subset_bounds()
        return x[..., a0:a1].sum(-1), x[..., b0:b1].sum(-1)
