"""Frozen, validated configuration of one training run (one setting × S seeds).

Configs flow one way: search space → `RunConfig` → batched trainer → per-seed metrics.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, SerializeAsAny, field_validator, model_validator

from service import limits
from service.frozen import Frozen
from service.tasks import Task, parse_task
from service.units.init import parse_init
from service.units.options import unit_options
from service.units.schedule import RegularizerSchedule

if TYPE_CHECKING:
    import torch

REFERENCE_STEPS = 5_000_000
"""Length of the reference code's runs, for which its regulariser schedules were chosen."""

REFERENCE_SCHEDULES = {"nmu": (10.0, 1_000_000, 2_000_000), "other": (0.01, 5_000, 50_000)}
"""(λ_max, t_start, t_end) of the reference schedules for `REFERENCE_STEPS`-step runs: models
with an NMU (mul), and the rest (NAU for add/sub)."""


def reference_regularizer(layers: "tuple[LayerConfig, ...]", steps: int) -> RegularizerSchedule:
    """The reference schedule of docs/domain/units.md scaled to a ``steps``-step run: the same fractions
    of the run as the reference's of its 5e6 steps (NMU: λ_max 10 from 20% to 40%; otherwise
    0.01 from 0.1% to 1%); t_end is at least t_start + 1 for very short runs."""
    nmu = any(layer.unit == "nmu" or layer.options.get("mul_unit") == "nmu" for layer in layers)
    lambda_max, t_start, t_end = REFERENCE_SCHEDULES["nmu" if nmu else "other"]
    start = t_start * steps // REFERENCE_STEPS
    end = max(t_end * steps // REFERENCE_STEPS, start + 1)
    return RegularizerSchedule(lambda_max=lambda_max, t_start=start, t_end=end)


class LayerConfig(Frozen):
    """One layer: a registered unit name, its options and its weight initialisation."""

    unit: str
    options: dict[str, Any] = Field(default_factory=dict)
    init: str = "default"

    @model_validator(mode="after")
    def _check(self) -> "LayerConfig":
        unit_options(self.unit)(**self.options)  # an unknown name: the error lists the valid ones
        parse_init(self.init)
        return self


class ModelConfig(Frozen):
    """Layers in order; ``None`` uses the task's reference model (e.g. NAU → NMU for mul)."""

    layers: tuple[LayerConfig, ...] | None = None
    hidden_size: int = Field(2, ge=1, le=limits.MAX_WIDTH, description="width between consecutive layers")


class OptimizerConfig(Frozen):
    """Adam (default), RMSprop (the NALU paper used lr 1e-2) or SGD with momentum."""

    name: Literal["adam", "rmsprop", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = Field(0.9, ge=0, lt=1)
    alpha: float = Field(0.99, gt=0, lt=1, description="RMSprop smoothing constant")
    eps: float = Field(1e-8, gt=0)
    lr_schedule: Literal["constant", "cosine", "exponential"] = Field(
        "constant", description="decay from lr to lr_min over the run: precision at the end "
        "(zero weights otherwise keep oscillating by about lr/10 under the sparsity regulariser)"
    )
    lr_min: float = Field(1e-6, gt=0)

    def lr_at(self, step, total_steps: int):
        """Learning rate at ``step`` (a tensor, so a compiled step is not re-traced)."""
        if self.lr_schedule == "constant":
            return self.lr
        import torch  # not at the top: configs are checked where torch is not loaded

        p = (step / max(1, total_steps)).clamp(0.0, 1.0)
        if self.lr_schedule == "cosine":
            return self.lr_min + 0.5 * (self.lr - self.lr_min) * (1 + torch.cos(math.pi * p))
        return self.lr * (self.lr_min / self.lr) ** p


class ClipConfig(Frozen):
    """Gradient clipping, per seed: by value (elementwise) or by each seed's global norm."""

    mode: Literal["none", "value", "norm"] = "none"
    max: float = Field(1.0, gt=0)


class ReinitConfig(Frozen):
    """Re-draw a seed's parameters when it is stuck (iNALU): checked every ``every`` steps,
    a seed whose loss has not improved for ``patience`` steps and is above ``threshold``."""

    enabled: bool = False
    every: int = Field(10_000, ge=1, le=limits.MAX_STEPS)
    patience: int = Field(10_000, ge=1, le=limits.MAX_STEPS)
    threshold: float = Field(1.0, ge=0)


class TrainConfig(Frozen):
    steps: int = Field(50_000, ge=1, le=limits.MAX_STEPS)
    batch_size: int = Field(128, ge=1, le=limits.MAX_BATCH_SIZE)
    optimizer: OptimizerConfig = OptimizerConfig()
    loss: Literal["mse", "smooth_l1"] = "mse"
    clip: ClipConfig = ClipConfig()
    reinit: ReinitConfig = ReinitConfig()
    eval_every: int = Field(1000, ge=1, le=limits.MAX_STEPS)
    regularizer: RegularizerSchedule | None = Field(
        None, description="None: the reference schedule for the model scaled to `steps` (NMU: λ_max 10 "
        "from 20% to 40% of the run; else 0.01 from 0.1% to 1%; the reference's 1e6→2e6 and 5e3→5e4 of 5e6 steps)"
    )
    regularizer_z: RegularizerSchedule | None = Field(
        None, description="R_z on a recurrent NAU/NMU cell's inputs (NAU paper); None: λ_z = 1 "
        "on the sparsity schedule's warm-up (service.training.recurrent)"
    )
    shared_batch: bool = Field(
        False, description="draw ONE input batch per step for all seeds (faster, but seeds "
        "are then no longer independent, so success-rate intervals are too narrow)"
    )


class RunConfig(Frozen):
    """Everything that defines one run; seeds are ``seed_offset .. seed_offset + seeds - 1``."""

    task: SerializeAsAny[Task]  # dumps keep the task kind's own fields (kind, operation, …)
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    seeds: int = Field(16, ge=1, le=limits.MAX_SEEDS)
    seed_offset: int = Field(0, ge=0, le=limits.MAX_SEED - limits.MAX_SEEDS)
    master_seed: int = Field(0, ge=-limits.MAX_SEED, le=limits.MAX_SEED)
    device: Literal["cpu", "cuda", "auto"] = "auto"
    dtype: Literal["float32", "float64"] = Field(
        "float32", description="float64: parameters, optimiser state, batches and λ(t) in double "
        "precision (slower; for differential tests against a reference implementation)"
    )
    compile: Literal["auto", "on", "off"] = "auto"
    # GPU only, with a compiled step: replay runs of steps as one captured CUDA graph
    # (the same trajectory, without a kernel launch per operation per step)
    cuda_graphs: bool = True

    @field_validator("task", mode="before")
    @classmethod
    def _task(cls, value: Any) -> Task:
        return value if isinstance(value, Task) else parse_task(value)

    @property
    def seed_ids(self) -> list[int]:
        return list(range(self.seed_offset, self.seed_offset + self.seeds))

    def layers(self) -> tuple[LayerConfig, ...]:
        """The model's layers, the task's reference model when none were given."""
        if self.model.layers is not None:
            return self.model.layers
        return tuple(LayerConfig(**layer) for layer in self.task.default_model())

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return torch.float64 if self.dtype == "float64" else torch.float32

    def regularizer(self) -> RegularizerSchedule:
        """The effective schedule: the configured one, else the reference default of
        docs/domain/units.md scaled to the run's length (`reference_regularizer`)."""
        if self.train.regularizer is not None:
            return self.train.regularizer
        return reference_regularizer(self.layers(), self.train.steps)
