"""Sequences of numbers (NALU paper §4.2 style): at every step ``x_t ∈ R^I`` is drawn
i.i.d. from the number range, the step operand is the sum of a run of its positions
``a_t = Σ x_t[start:start+size]``, and the target is the running sum ``Σ_{s≤t} a_s`` or
product ``Π_{s≤t} a_s``. Trained on ``train_length``, tested on each of ``test_lengths``.

Solved reference read-out: the exact selection moved by ε = 1e-5 towards the wrong side
(as docs/domain/metrics.md for the static tasks), in float64 (`service.tasks.sequence` for what is
scored and the thresholds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from service import limits
from service.seeding import generator_for
from service.tasks.base import EVAL_MASTER_SEED, THRESHOLD_EPSILON
from service.tasks.sequence import SequenceSet, SequenceTask, length_name

if TYPE_CHECKING:
    from torch import Tensor


LENGTHS = {"sum": (10, (1, 10, 100, 1000)), "prod": (2, (1, 2, 5, 10, 20))}
"""``operation: (train_length, test_lengths)`` when the config names none."""


class SequenceArithmeticTask(SequenceTask):
    """``kind: sequence_arithmetic``: a running sum/product of a subset of each step's inputs."""

    kind: Literal["sequence_arithmetic"] = "sequence_arithmetic"
    default_lengths: ClassVar[dict[str, tuple[int, tuple[int, ...]]]] = LENGTHS
    input_size: int = Field(4, ge=1, le=limits.MAX_WIDTH, description="numbers per step")
    subset_start: int = Field(0, ge=0, description="first input position of the step operand")
    subset_size: int = Field(2, ge=1, description="how many consecutive inputs the step operand sums")

    @model_validator(mode="after")
    def _subset_fits(self) -> "SequenceArithmeticTask":
        if self.subset_start + self.subset_size > self.input_size:
            raise ValueError(f"the step operand x[{self.subset_start}:{self.subset_start + self.subset_size}] "
                             f"does not fit input_size={self.input_size}")
        return self

    def largest_operand(self) -> float:
        return self.subset_size * max(abs(self.interpolation.low), abs(self.interpolation.high))

    def selection(self) -> Tensor:
        """The read-out's exact weights ``[1, I]`` (float64)."""
        import torch

        w = torch.zeros(1, self.input_size, dtype=torch.float64)
        w[0, self.subset_start:self.subset_start + self.subset_size] = 1.0
        return w

    def default_model(self) -> list[dict[str, Any]]:
        """An NAU read-out (selects the operand) and an NAU (sum) or NMU (product) cell."""
        return [{"unit": "nau"}, {"unit": "nau" if self.operation == "sum" else "nmu"}]

    def train_batch(self, keys: Tensor, step: Tensor, batch_size: int, data: Any = None) -> tuple[Tensor, Tensor]:
        from service.seeding import generator as rng

        run = ((self.subset_start, self.subset_start + self.subset_size),)
        x, sums = rng.sample(keys, step, (batch_size, self.train_length, self.input_size),
                             self.interpolation.intervals, run)
        return x, self.accumulate(sums, 2)

    def _draw(self, name: str, length: int, lengths: dict[str, int]) -> SequenceSet:
        import torch

        gen = generator_for(EVAL_MASTER_SEED, "evaluation", name, self.dataset_seed)
        x = self.interpolation.sample((self.eval_samples, length, self.input_size), gen,
                                      dtype=torch.float64).to(torch.float32)
        operands = (x.double() @ self.selection().T).squeeze(-1)
        return SequenceSet(x, operands, self.accumulate(operands, 1), lengths)

    def draw_sets(self) -> dict[str, SequenceSet]:
        return {
            "interpolation": self._draw("interpolation", self.train_length, {"interpolation": self.train_length}),
            "test": self._draw("test", max(self.test_lengths), {length_name(n): n for n in self.test_lengths}),
        }

    def reference_values(self, data: SequenceSet) -> Tensor:
        """The ε-perturbed selection of each step's inputs (float64)."""
        return (data.inputs.double() @ self.perturbed_selection(THRESHOLD_EPSILON).T).squeeze(-1)
