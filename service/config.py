"""Frozen, validated configuration of one training run (one setting × S seeds).

Configs flow one way: search space → `RunConfig` → batched trainer → per-seed metrics.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service import limits
from service.tasks import Task, parse_task
from service.units.init import parse_init
from service.units.registry import get_unit
from service.units.schedule import RegularizerSchedule


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class LayerConfig(Frozen):
    """One layer: a registered unit name, its options and its weight initialisation."""

    unit: str
    options: dict[str, Any] = Field(default_factory=dict)
    init: str = "default"

    @model_validator(mode="after")
    def _check(self) -> "LayerConfig":
        cls = get_unit(self.unit)  # unknown name -> error listing the valid ones
        cls.Options(**self.options)
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
        None, description="None: the reference default for the model (NMU: 10, 1e6→2e6; else 0.01, 5e3→5e4)"
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

    task: Task
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    seeds: int = Field(16, ge=1, le=limits.MAX_SEEDS)
    seed_offset: int = Field(0, ge=0, le=limits.MAX_SEED - limits.MAX_SEEDS)
    master_seed: int = Field(0, ge=-limits.MAX_SEED, le=limits.MAX_SEED)
    device: Literal["cpu", "cuda", "auto"] = "auto"
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

    def regularizer(self) -> RegularizerSchedule:
        """The configured schedule or the reference default of SPEC.md §1."""
        if self.train.regularizer is not None:
            return self.train.regularizer
        if any(layer.unit == "nmu" or layer.options.get("mul_unit") == "nmu" for layer in self.layers()):
            return RegularizerSchedule(lambda_max=10.0, t_start=1_000_000, t_end=2_000_000)
        return RegularizerSchedule(lambda_max=0.01, t_start=5_000, t_end=50_000)
