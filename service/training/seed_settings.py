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

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from service.config import RunConfig
from service.units.init import parse_init
from service.units.registry import get_unit, unit_names
from service.units.schedule import EXP_RATE, RegularizerSchedule

OPTIMIZER_FIELDS = frozenset({"lr", "lr_min", "betas", "eps", "momentum", "alpha"})
"""`OptimizerConfig` fields that may differ per seed."""
REGULARIZER_FIELDS = frozenset({"lambda_max", "t_start", "t_end", "oob"})
"""`RegularizerSchedule` fields that may differ per seed (whether ``oob`` is 0 may not)."""
_RUN_FIELDS = ("seeds", "seed_offset", "master_seed", "device", "compile", "cuda_graphs")
"""Run-config fields that are per member (seed ids and streams) or do not change numbers."""


def packable_options() -> frozenset[str]:
    """Unit option names that may differ per seed (each unit's ``PACKABLE_OPTIONS``)."""
    return frozenset().union(*(get_unit(name).PACKABLE_OPTIONS for name in unit_names()))


_LAYER_OPTION = re.compile(r"^model\.layers\.(\d+|\*)\.options\.([A-Za-z_]\w*)$")


def packable_path(path: str) -> bool:
    """Whether a run-config path (a search parameter's ``target``) names a continuous
    setting that members of one pack may differ in."""
    parts = path.split(".")
    if parts[:2] == ["train", "optimizer"] and len(parts) in (3, 4):
        return parts[2] in OPTIMIZER_FIELDS and (len(parts) == 3 or (parts[2] == "betas" and parts[3] in "01"))
    if parts[:2] == ["train", "regularizer"] and len(parts) == 3:
        return parts[2] in REGULARIZER_FIELDS
    m = _LAYER_OPTION.match(path)
    return bool(m) and m.group(2) in packable_options()


def packable(config: RunConfig) -> bool:
    """Recurrent tasks train with their own trainer, which does not pack."""
    return not getattr(config.task, "recurrent", False)


def structure_key(config: RunConfig) -> str:
    """Configurations with equal keys can train as one packed computation: SHA-256 of the
    configuration with the per-seed settings and the per-member fields left out (the
    layers resolved, the regulariser schedule the effective one). A recurrent task's key
    is its whole configuration, so it packs with nothing but itself."""
    data = config.model_dump(mode="json")
    if packable(config):
        for key in _RUN_FIELDS:
            data.pop(key, None)
        train = data["train"]
        train["optimizer"] = {k: v for k, v in train["optimizer"].items() if k not in OPTIMIZER_FIELDS}
        schedule = config.regularizer()
        train["regularizer"] = {"shape": schedule.shape, "oob": schedule.oob > 0}
        layers = []
        for layer in config.layers():
            unit = get_unit(layer.unit)
            options = unit.Options(**layer.options).model_dump(mode="json")
            layers.append({"unit": layer.unit, "init": parse_init(layer.init).kind,
                           "options": {k: v for k, v in options.items() if k not in unit.PACKABLE_OPTIONS}})
        data["model"] = {"layers": layers, "hidden_size": config.model.hidden_size}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def check_pack(configs: Sequence[RunConfig]) -> None:
    """A clear error unless ``configs`` can train as one pack."""
    if not configs:
        raise ValueError("a pack needs at least one configuration")
    if len(configs) > 1 and not all(packable(c) for c in configs):
        raise ValueError("recurrent tasks do not pack: train each configuration on its own")
    keys = {structure_key(c) for c in configs}
    if len(keys) > 1:
        raise ValueError("these configurations differ in more than their continuous settings "
                         "(units, options, task, steps, …) and cannot train as one pack")


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
    """λ(t) of SPEC.md §1 per seed ``[S]``, for per-seed ``lambda_max``, ``t_start`` and
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
