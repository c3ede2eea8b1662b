"""The `Task` interface: generated data, fixed evaluation sets and the success threshold.

Every task is "select, then operate": an exact first layer ``selection [K, I]`` picks K
operands as weighted sums of the inputs, and ``apply_operation`` combines them. That one
description gives the training target, the exact model for the contract tests, and the
ε-perturbed model whose extrapolation error is the success threshold (docs/domain/metrics.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, field_validator

from service import limits
from service.frozen import Frozen
from service.seeding import generator_for
from service.tasks.ranges import Range

if TYPE_CHECKING:
    import torch

EVAL_MASTER_SEED = 20_191_017
"""Evaluation sets are drawn from this fixed seed: identical for every trial and seed."""

THRESHOLD_EPSILON = 1e-5
"""How far the nearly perfect model's selection weights are moved (docs/domain/metrics.md)."""

_THRESHOLD_CHUNK = 65_536
_THRESHOLD_CACHE_VERSION = 1  # bump when the simulation changes: old disk entries are ignored


class Task(Frozen):
    """Base of every task config; subclasses add their own fields and a ``kind`` literal."""

    kind: ClassVar[str]
    PACKABLE: ClassVar[frozenset[str]] = frozenset()
    """Fields that may differ between the members of one pack: fields that change only the
    target (and so the evaluation targets and thresholds), never the inputs or the model
    (`service.pack_structure.structure_key`; the trainer holds them per seed)."""

    interpolation: Range = Field(
        default_factory=lambda: Range.model_validate("U[1,2]"),
        description="range of the training inputs and of the interpolation evaluation set",
    )
    extrapolation: dict[str, Range] = Field(
        default_factory=lambda: {"extrapolation": Range.model_validate("U[2,6]")},
        description="named extrapolation ranges, each with its own evaluation set and threshold",
    )
    dataset_seed: int = Field(
        0, ge=0, le=limits.MAX_SEED, description="fixes the dataset: subset positions (where a task has them) and "
        "the evaluation sets; never the training seeds",
    )
    eval_samples: int = Field(10_000, ge=10, le=limits.MAX_SAMPLES, description="samples per evaluation set")
    threshold_samples: int = Field(
        1_000_000, ge=1000, le=limits.MAX_SAMPLES, description="samples of the success-threshold simulation"
    )

    @field_validator("extrapolation")
    @classmethod
    def _some_extrapolation(cls, value: dict[str, Range]) -> dict[str, Range]:
        if not value:
            raise ValueError("at least one extrapolation range is needed")
        for name in value:
            if name == "interpolation":
                raise ValueError(
                    "a range may not be named 'interpolation' "
                    "(that name is the interpolation set)"
                )
            if not name or not name.strip():
                raise ValueError("range names must be non-empty")
        return value

    # -- what each task defines -----------------------------------------------------------
    # ``input_size`` and ``output_size`` (ints) are defined by each subclass, as a property
    # or, where the user chooses it (arithmetic: ``input_size``), as a field; a property
    # here would hide such a field.
    input_size: ClassVar[int]
    output_size: ClassVar[int]

    def selection(self) -> torch.Tensor:
        """Exact first-layer weights ``[K, I]`` (float64) that pick the operands."""
        raise NotImplementedError

    def apply_operation(self, operands: torch.Tensor) -> torch.Tensor:
        """``[..., K] -> [..., output_size]``: the operation applied exactly."""
        raise NotImplementedError

    def default_model(self) -> list[dict[str, Any]]:
        """The papers' model for this task: a list of layer dicts (``unit``, ``options``)."""
        raise NotImplementedError

    # -- shared behaviour -------------------------------------------------------------------
    def target(self, x: torch.Tensor) -> torch.Tensor:
        """Exact target for inputs ``x [..., I]`` -> ``[..., output_size]``.

        Called every training step on ``[S, B, I]``; subclasses override it with a cheaper
        formula where one exists (slice sums instead of a matmul).
        """
        sel = self.selection().to(dtype=x.dtype, device=x.device)
        return self.apply_operation(x @ sel.T)

    def operand_runs(self) -> tuple[tuple[int, int], ...] | None:
        """``((start, end), ...)`` when each operand is the plain sum ``x[..., start:end]``
        (so ``target(x) == apply_operation(those sums)``), else None. The trainer then
        draws each batch together with these sums (`service.seeding.generator.sample`) instead of
        re-reading the batch for the target."""
        return None

    def ranges(self) -> dict[str, Range]:
        """Every named range: ``interpolation`` first, then the extrapolation ranges."""
        return {"interpolation": self.interpolation, **self.extrapolation}

    def range_prerequisites(self) -> dict[str, tuple[str, ...]]:
        """``{range: ranges it needs}``: a range counts as solved only where these are too
        (`service.scoring.metrics.per_seed_metrics`); none for a static task's ranges."""
        return {}

    def perturbed_selection(self, epsilon: float = THRESHOLD_EPSILON) -> torch.Tensor:
        """The nearly perfect first layer: every weight moved ε towards the wrong side.

        ``w → w − ε·sign(w)`` for ``w ≠ 0`` (1 → 1 − ε, −1 → −1 + ε: the magnitude shrinks)
        and ``0 → ε`` (an unused input leaks in), as in docs/domain/metrics.md.
        """
        import torch

        sel = self.selection().to(torch.float64)
        return torch.where(sel == 0, torch.full_like(sel, epsilon), sel - epsilon * torch.sign(sel))

    def config_key(self, exclude: set[str] | None = None) -> str:
        """A text key of this configuration (kind + fields, in field order: the order of the
        extrapolation ranges matters) for caches."""
        data = self.model_dump(mode="json", exclude=exclude)
        return json.dumps({"kind": self.kind, **data})

    def evaluation_sets(
        self, device: torch.device | str | None = None
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Fixed held-out sets ``{name: (x [N, I], t [N, O])}`` (float32), ``interpolation``
        first, then each extrapolation range in order.

        Drawn from `EVAL_MASTER_SEED`, the set's name and ``dataset_seed`` (never from a run's
        master seed), so every trial and every training seed is scored on the same data;
        targets are computed in float64 from the float32 inputs the model sees. Cached per
        configuration: treat the returned tensors as read-only.
        """
        sets = _evaluation_sets_cached(type(self), self.config_key())
        if device is None:
            return dict(sets)
        return {name: (x.to(device), t.to(device)) for name, (x, t) in sets.items()}

    def success_thresholds(self) -> dict[str, float]:
        """``{extrapolation range name: threshold}``: the MSE of the nearly perfect model.

        The selection weights are ε-perturbed (`perturbed_selection`; tasks without a
        selection layer perturb their single unit's weights, see `nearly_perfect_error`), the
        operation is applied exactly, and the MSE against the exact model is simulated in float64 on
        ``threshold_samples`` draws from the range with a fixed seed (docs/domain/metrics.md). Computed
        once per configuration: cached in memory and in a small JSON file under
        ``$NALU_SWEEP_CACHE_DIR`` (default ``~/.cache/nalu-sweep``).
        """
        return dict(_thresholds_cached(type(self), self.config_key(exclude={"eval_samples"})))

    def nearly_perfect_error(self, x: torch.Tensor, epsilon: float = THRESHOLD_EPSILON) -> torch.Tensor:
        """Output of the nearly perfect model minus the exact target, ``[N, I] → [N, O]``.

        Here: the ε-perturbed selection followed by the exact operation (docs/domain/metrics.md). Tasks
        with no selection layer (a single unit learns everything) override this.
        """
        exact = self.selection().to(dtype=x.dtype, device=x.device)
        perturbed = self.perturbed_selection(epsilon).to(dtype=x.dtype, device=x.device)
        return self.apply_operation(x @ perturbed.T) - self.apply_operation(x @ exact.T)

    def simulate_threshold(self, rng: Range, samples: int, generator: torch.Generator,
                           epsilon: float = THRESHOLD_EPSILON) -> float:
        """Monte-Carlo MSE (over samples and outputs) of the nearly perfect model against the
        exact one on ``rng``, in float64 and in chunks to bound memory."""
        import torch

        total = 0.0
        done = 0
        while done < samples:
            n = min(_THRESHOLD_CHUNK, samples - done)
            x = rng.sample((n, self.input_size), generator, dtype=torch.float64)
            total += float(self.nearly_perfect_error(x, epsilon).square().sum())
            done += n
        return total / (samples * self.output_size)


def _draw_evaluation_set(task: Task, name: str, rng: Range) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    gen = generator_for(EVAL_MASTER_SEED, "evaluation", name, task.dataset_seed)
    x = rng.sample((task.eval_samples, task.input_size), gen, dtype=torch.float64).to(torch.float32)
    t = task.target(x.to(torch.float64)).to(torch.float32)
    return x, t


@functools.lru_cache(maxsize=32)
def _evaluation_sets_cached(cls: type[Task], key: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    task = cls.model_validate(fields_of(key))
    return {name: _draw_evaluation_set(task, name, rng) for name, rng in task.ranges().items()}


@functools.lru_cache(maxsize=128)
def _thresholds_cached(cls: type[Task], key: str) -> dict[str, float]:
    path = _cache_path(key)
    cached = read_cache(path)
    if cached is not None:
        return cached
    task = cls.model_validate(fields_of(key))
    thresholds = {
        name: task.simulate_threshold(
            rng, task.threshold_samples,
            generator_for(EVAL_MASTER_SEED, "threshold", name, task.dataset_seed),
        )
        for name, rng in task.extrapolation.items()
    }
    write_cache(path, key, thresholds)
    return thresholds


def fields_of(key: str) -> dict[str, Any]:
    """A task's fields back from its threshold-cache key (the kind left out)."""
    data = json.loads(key)
    data.pop("kind", None)
    return data


def cache_dir() -> Path:
    """Where small derived values (success thresholds) are cached between processes."""
    return Path(os.environ.get("NALU_SWEEP_CACHE_DIR") or Path.home() / ".cache" / "nalu-sweep")


def _cache_path(key: str) -> Path:
    digest = hashlib.sha256(f"v{_THRESHOLD_CACHE_VERSION}|{key}".encode()).hexdigest()[:32]
    return cache_dir() / "thresholds" / f"{digest}.json"


def read_cache(path: Path) -> dict[str, float] | None:
    try:
        data = json.loads(path.read_text())
        values = {str(k): float(v) for k, v in data["thresholds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return values if all(math.isfinite(v) for v in values.values()) else None


def write_cache(path: Path, key: str, thresholds: dict[str, float]) -> None:
    """Best effort: a read-only home or a race between workers only costs a recomputation."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"config": json.loads(key), "thresholds": thresholds}))
        os.replace(tmp, path)
    except OSError:
        pass
