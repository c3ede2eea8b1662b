"""Recurrent tasks (docs/domain/tasks.md "Recurrent tasks"): a unit accumulates over a sequence.

A sequence task gives, per time step, an input ``x_t ∈ R^I`` (numbers, or a digit image);
a read-out (the model's first layers) maps it to ``z_t``, and the recurrent cell (the last
layer) accumulates ``h_t = cell(cat(z_t, h_{t−1}))`` from ``h_0 = 0`` (sum) or ``1``
(product). The target at every step is the running sum or product of the step operands.

The model extrapolates in *length*: it trains on ``train_length`` and is tested on each of
``test_lengths``. Each test length is one "extrapolation range" of the metrics pipeline
(named ``length_<L>``), so per-seed success, the Wilson interval and the objective work
unchanged; the validation ("interpolation") set has the training length.

What is scored (docs/metrics-sequence.md): the read-out and the arithmetic apart.

* ``readout``: the read-out's per-step MSE against the true step operands, over every
  position of the test sequences; threshold: the task's solved reference read-out's.
* ``length_<L>``: the cell judged on the model's *own* read-out: the squared difference
  at position L between the cell's output and the exact running sum (product), in float64,
  of the values the model's read-out produced; threshold: a nearly exact cell that takes
  each step's value with weight 1 − ε (ε = 1e-5, docs/domain/metrics.md's) and accumulates exactly,
  run on the reference read-out's values, plus what float32 rounding costs an exact cell. A noisy read-out therefore cannot pass a long length by being less biased
  than the reference: the read-out's error does not enter a length's figure at all.
* a length counts as solved only with the read-out and every shorter test length
  (`range_prerequisites`): a sequence of length L holds the outputs at every shorter
  length, and the model is asked for all of them.

Each threshold is the reference's mean squared error plus a one-sided 99% upper bound on
that mean (normal approximation: ``mean + 2.326·sd/√N``).
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from service.tasks.base import Task, cache_dir, fields_of, read_cache, write_cache

if TYPE_CHECKING:
    import torch
    from torch import Tensor

SequenceOperation = Literal["sum", "prod"]
REFERENCE_CONFIDENCE = 0.99
"""One-sided confidence of the upper bound on the solved reference's MSE."""

_MAX_TEST_LENGTH = 100_000
READOUT = "readout"
"""The range name of the read-out's per-step accuracy."""
CELL_EPSILON = 1e-5
"""How far from exact the step weight of the threshold's nearly solved cell is (docs/domain/metrics.md's ε)."""


def length_name(length: int) -> str:
    return f"length_{length}"


@dataclass(frozen=True)
class SequenceSet:
    """A fixed evaluation set: ``N`` sequences of ``L`` steps.

    ``inputs`` is ``[N, L, I]`` float32 (numbers), or ``[N, L]`` int64 indices into
    ``table [n, I]`` (images: the read-out then runs once per image, not per position).
    ``operands [N, L]`` float64 are the true step operands, ``targets [N, L]`` float64 the
    running results at every position; ``lengths`` names the positions that are scored
    (``{name: L}``, read at index ``L − 1``).
    """

    inputs: Tensor
    operands: Tensor
    targets: Tensor
    lengths: dict[str, int]
    table: Tensor | None = None

    def to(self, device: torch.device | str) -> "SequenceSet":
        return SequenceSet(self.inputs.to(device), self.operands.to(device), self.targets.to(device),
                           dict(self.lengths), None if self.table is None else self.table.to(device))

    def features(self, start: int, end: int) -> Tensor:
        """Inputs of positions ``start:end`` as ``[N, end − start, I]`` float32."""
        part = self.inputs[:, start:end]
        return part if self.table is None else self.table[part]


class SequenceTask(Task):
    """Base of the recurrent tasks; subclasses define the step inputs and the reference."""

    recurrent: ClassVar[bool] = True  # the trainer runs an unrolled recurrent model for these tasks

    operation: SequenceOperation = Field("sum", description="sum or prod, accumulated over the sequence")
    train_length: int = Field(10, ge=1, le=10_000, description="length of the training sequences")
    test_lengths: tuple[int, ...] = Field(
        (1, 10, 100, 1000), description="lengths the model is tested on (each one scored separately)"
    )
    eval_samples: int = Field(1000, ge=10, le=100_000, description="sequences per evaluation set")
    extrapolation: dict[str, Any] = Field(
        default_factory=dict, description="unused: sequence tasks extrapolate in length (test_lengths)"
    )

    default_lengths: ClassVar[dict[str, tuple[int, tuple[int, ...]]]] = {}
    """``{operation: (train_length, test_lengths)}`` used when the config names none."""

    @model_validator(mode="before")
    @classmethod
    def _lengths_by_operation(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.default_lengths:
            op = data.get("operation", "sum")
            train, test = cls.default_lengths.get(op, next(iter(cls.default_lengths.values())))
            data = {"train_length": train, "test_lengths": test, **data}
        return data

    @field_validator("extrapolation")
    @classmethod
    def _some_extrapolation(cls, value: dict[str, Any]) -> dict[str, Any]:  # overrides Task's
        if value:
            raise ValueError("sequence tasks extrapolate in length: set test_lengths, not extrapolation")
        return value

    @field_validator("test_lengths")
    @classmethod
    def _lengths(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("at least one test length is needed")
        if any(v < 1 or v > _MAX_TEST_LENGTH for v in value):
            raise ValueError(f"test lengths must lie in [1, {_MAX_TEST_LENGTH}]")
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _products_stay_finite(self) -> "SequenceTask":
        if self.operation == "prod":
            top = self.largest_operand()
            if top > 1 and max(self.test_lengths) * math.log10(top) > 30:
                raise ValueError(
                    f"products of up to {max(self.test_lengths)} operands up to {top:g} exceed "
                    "1e30 (float32 squared errors overflow); use shorter test_lengths")
        return self

    # -- what each task defines -------------------------------------------------------------
    @property
    def output_size(self) -> int:
        return 1

    step_width: ClassVar[int] = 1
    """Width of the read-out's output ``z_t`` (what the cell adds or multiplies)."""

    def largest_operand(self) -> float:
        raise NotImplementedError

    def train_data(self, device: Any = None) -> Any:
        """What `train_batch` draws from, placed on ``device`` once by the trainer (so a
        step, compiled or captured in a CUDA graph, never copies between host and device);
        None when the batch is generated, not drawn from data."""
        return None

    def train_batch(self, keys: Tensor, step: Tensor, batch_size: int, data: Any = None) -> tuple[Tensor, Tensor]:
        """Each seed's batch ``x [S, B, L, I]`` and running targets ``[S, B, L, 1]``
        (``data``: `train_data` on the keys' device, made here when not given)."""
        raise NotImplementedError

    def draw_sets(self) -> dict[str, SequenceSet]:
        """The fixed evaluation sets: ``interpolation`` (validation, training length) and
        ``test`` (one set of the longest test length, read at every test length)."""
        raise NotImplementedError

    def reference_values(self, data: SequenceSet) -> Tensor:
        """The solved reference read-out's value at every position ``[N, L]`` (float64)."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------
    @property
    def start_state(self) -> float:
        return 0.0 if self.operation == "sum" else 1.0

    def extrapolation_names(self) -> list[str]:
        """Every test length's range (the cell on the model's own read-out), then `READOUT`."""
        return [length_name(n) for n in self.test_lengths] + [READOUT]

    def range_prerequisites(self) -> dict[str, tuple[str, ...]]:
        """Length L is solved only with the read-out and every shorter test length."""
        names = [length_name(n) for n in self.test_lengths]  # ascending
        return {name: (READOUT, *names[:i]) for i, name in enumerate(names)}

    def cell_reference_errors(self, data: SequenceSet) -> Tensor:
        """Squared errors ``[N, len(lengths)]`` (float64) of the threshold's nearly solved
        cell at the scored positions, against the exact running result of the values it is
        fed (the reference read-out's): the step's weight ε from exact, the accumulation
        exact (``h ← h + (1 − ε)v``; products ``h ← h·((1 − ε)v + ε)``, the NMU's form), as
        the static tasks' nearly perfect model (docs/domain/metrics.md); plus an exact cell that rounds
        to float32 at every step, as the model's does. (ε on the recurrence weight would
        compound over the sequence: 1% at length 1000, 63% at 100,000.)"""
        import torch

        v32 = self.reference_values(data).to(torch.float32)  # what a float32 read-out gives
        v = v32.double()
        exact = self.accumulate(v, 1)
        e, keep = CELL_EPSILON, 1.0 - CELL_EPSILON
        near = torch.full_like(v[:, 0], self.start_state)
        rounded = near.to(torch.float32)
        errors = torch.empty(v.shape[0], len(data.lengths), dtype=torch.float64)
        columns = {n - 1: j for j, n in enumerate(data.lengths.values())}
        for t in range(max(columns) + 1):
            if self.operation == "sum":
                near, rounded = near + keep * v[:, t], rounded + v32[:, t]
            else:
                near, rounded = near * (keep * v[:, t] + e), rounded * v32[:, t]
            if t in columns:
                errors[:, columns[t]] = ((near - exact[:, t]).square()
                                         + (rounded.double() - exact[:, t]).square())
        return errors

    def readout_reference_errors(self, data: SequenceSet) -> Tensor:
        """The reference read-out's squared error at every position, ``[N·L, 1]`` (float64)."""
        return (self.reference_values(data) - data.operands).square().reshape(-1, 1)

    def accumulate(self, operands: Tensor, dim: int) -> Tensor:
        return operands.cumsum(dim) if self.operation == "sum" else operands.cumprod(dim)

    def evaluation_sets(self, device=None) -> dict:
        """Static-task interface: sequence tasks have none (see `sequence_sets`)."""
        return {}

    def sequence_sets(self, device: torch.device | str | None = None) -> dict[str, SequenceSet]:
        """`draw_sets`, cached per configuration (treat as read-only)."""
        sets = _sets_cached(type(self), self.config_key())
        return dict(sets) if device is None else {k: v.to(device) for k, v in sets.items()}

    def success_thresholds(self) -> dict[str, float]:
        """``{length_<L>: threshold, readout: threshold}``: the nearly solved cell's test MSE
        at each length (`cell_reference_errors`) and the reference read-out's per-step MSE,
        each plus its one-sided 99% upper bound (cached per configuration)."""
        return dict(_thresholds_cached(type(self), self.config_key()))


def upper_bound(errors: Tensor, confidence: float = REFERENCE_CONFIDENCE) -> Tensor:
    """``mean + z·sd/√N`` per column of ``errors [N, K]`` (one-sided, normal quantile)."""
    import torch

    n = errors.shape[0]
    z = NormalDist().inv_cdf(confidence)
    sd = errors.std(0, unbiased=True) if n > 1 else torch.zeros_like(errors[0])
    return errors.mean(0) + z * sd / math.sqrt(n)


@functools.lru_cache(maxsize=16)
def _sets_cached(cls: type[SequenceTask], key: str) -> dict[str, SequenceSet]:
    return cls.model_validate(fields_of(key)).draw_sets()


_CACHE_VERSION = 3  # bump when a reference changes: old disk entries are then ignored


@functools.lru_cache(maxsize=64)
def _thresholds_cached(cls: type[SequenceTask], key: str) -> dict[str, float]:
    """Computed once per configuration; kept in memory and in a small JSON file under
    `cache_dir` (fitting the digit read-out takes seconds, and every trial needs it)."""
    path = cache_dir() / "sequence_thresholds" / (
        hashlib.sha256(f"v{_CACHE_VERSION}|{key}".encode()).hexdigest()[:32] + ".json")
    cached = read_cache(path)
    if cached:
        return cached
    task = cls.model_validate(fields_of(key))
    test = task.sequence_sets()["test"]
    bounds = upper_bound(task.cell_reference_errors(test))
    thresholds = {name: float(b) for name, b in zip(test.lengths, bounds.tolist())}
    thresholds[READOUT] = float(upper_bound(task.readout_reference_errors(test))[0])
    write_cache(path, key, thresholds)
    return thresholds

