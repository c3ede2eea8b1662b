"""What may differ between the seeds of one batched run: the continuous settings.

A run trains S seeds of one configuration; a *packed* run trains the seeds of K
configurations (K trials of a sweep) as one computation. The configurations must share
their structure — task, units, categorical options, steps, batch, loss, clipping — and
may differ in the continuous settings listed here (learning rate, betas, λ_max and the
schedule's times, uniform-init bounds, gate temperatures and gate-bias inits), which the
trainer holds as per-seed tensors. A lone run takes the same path (its S rows are equal),
so a configuration's seeds compute the same operations on the same values whether they
train alone or packed with others: packing is batch-exactness across configurations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from service.config import RunConfig
from service.units.init import parse_init
from service.units.registry import get_unit
from service.units.schedule import EXP_RATE, RegularizerSchedule


@dataclass(frozen=True)
class SeedSettings:
    """The members of a (packed) run and how many seeds each has, in batch order."""

    members: tuple[RunConfig, ...]

    @property
    def counts(self) -> list[int]:
        return [m.seeds for m in self.members]

    @property
    def slices(self) -> list[slice]:
        out, start = [], 0
        for n in self.counts:
            out.append(slice(start, start + n))
            start += n
        return out

    def per_seed(self, value: Callable[[RunConfig], Any]) -> list[Any]:
        """``value(member)`` repeated for each of the member's seeds."""
        return [v for m in self.members for v in [value(m)] * m.seeds]

    def tensor(self, value: Callable[[RunConfig], float], dtype: torch.dtype, device: torch.device) -> Tensor:
        """``[S]`` tensor of ``value(member)`` per seed: each Python number rounded once to
        ``dtype``, as a scalar operand of that dtype would be."""
        return torch.tensor(self.per_seed(value), dtype=torch.float64).to(device, dtype)

    def layer_variants(self, index: int) -> tuple[list[Any], list[Any]]:
        """Per seed, layer ``index``'s parsed options and initialisation."""
        options, inits = [], []
        for m in self.members:
            layer = m.layers()[index]
            options += [get_unit(layer.unit).Options(**layer.options)] * m.seeds
            inits += [parse_init(layer.init)] * m.seeds
        return options, inits


class SeedSchedule:
    """λ(t) of docs/domain/units.md per seed ``[S]``, for per-seed ``lambda_max``, ``t_start`` and
    ``t_end`` (the shape, and whether ``oob`` is on, are shared). The same operations as
    `RegularizerSchedule.value` with each scalar as a ``dtype`` row."""

    def __init__(self, schedules: Sequence[RegularizerSchedule], dtype: torch.dtype, device: torch.device) -> None:
        def rows(values: list[float]) -> Tensor:
            return torch.tensor(values, dtype=torch.float64).to(device, dtype)

        self.shape = schedules[0].shape
        self.lambda_max = rows([s.lambda_max for s in schedules])
        self.t_start = rows([float(s.t_start) for s in schedules])
        self.span = rows([float(s.t_end - s.t_start) for s in schedules])
        self.oob = rows([s.oob for s in schedules])
        self.oob_on = schedules[0].oob > 0

    def value(self, step: Tensor, dtype: torch.dtype) -> Tensor:
        t = step.to(dtype)
        if self.shape == "constant":
            return torch.where(t >= self.t_start, self.lambda_max, 0.0)
        p = ((t - self.t_start) / self.span).clamp(0.0, 1.0)
        if self.shape == "linear":
            return self.lambda_max * p
        return self.lambda_max * torch.expm1(EXP_RATE * p) / math.expm1(EXP_RATE)
