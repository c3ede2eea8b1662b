"""Sampling ranges: U[lo, hi] or a union of intervals such as U[-6,-2] ∪ U[2,6]."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, model_validator

if TYPE_CHECKING:
    import torch


def _number(value: Any) -> bool:
    """A real number that fits a float (``True`` is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


_INTERVAL = re.compile(r"U?\[\s*([-+0-9.eE]+)\s*,\s*([-+0-9.eE]+)\s*\]")


class Range(BaseModel):
    """A union of disjoint intervals ``[(lo, hi), ...]``, sampled uniformly by length.

    Accepts ``"U[1,2]"``, ``"U[-6,-2] ∪ U[2,6]"`` (also ``u`` or ``|`` between), ``[1, 2]``
    or ``[[-6, -2], [2, 6]]``.
    """

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)
    intervals: tuple[tuple[float, float], ...]

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, Range):
            return {"intervals": value.intervals}
        if isinstance(value, dict):
            return value
        if isinstance(value, str):
            found = _INTERVAL.findall(value)
            rest = _INTERVAL.sub("", value).replace("∪", "").replace("|", "").replace("u", "")
            if not found or rest.strip():
                raise ValueError(f"cannot read range {value!r}; write e.g. 'U[1,2]' or 'U[-6,-2] ∪ U[2,6]'")
            return {"intervals": tuple((float(a), float(b)) for a, b in found)}
        if isinstance(value, (list, tuple)):
            if len(value) == 2 and all(_number(v) for v in value):
                return {"intervals": ((float(value[0]), float(value[1])),)}
            if value and all(isinstance(iv, (list, tuple)) and len(iv) == 2 and all(map(_number, iv))
                             for iv in value):
                return {"intervals": tuple((float(lo), float(hi)) for lo, hi in value)}
        raise ValueError(f"cannot read range {value!r}; write e.g. 'U[1,2]', [1, 2] or [[-6, -2], [2, 6]]")

    @model_validator(mode="after")
    def _check(self) -> "Range":
        if not self.intervals:
            raise ValueError("a range needs at least one interval")
        for lo, hi in self.intervals:
            if not lo < hi:
                raise ValueError(f"empty interval [{lo}, {hi}]: the lower end must be below the upper")
        ordered = sorted(self.intervals)
        for (_, h1), (l2, _) in zip(ordered, ordered[1:]):
            if l2 < h1:
                raise ValueError(f"intervals of {self} overlap")
        return self

    def __str__(self) -> str:
        return " ∪ ".join(f"U[{lo:g},{hi:g}]" for lo, hi in self.intervals)

    @property
    def low(self) -> float:
        return min(lo for lo, _ in self.intervals)

    @property
    def high(self) -> float:
        return max(hi for _, hi in self.intervals)

    def contains_zero(self) -> bool:
        """True if 0 lies in (the closure of) any interval."""
        return any(lo <= 0.0 <= hi for lo, hi in self.intervals)

    def has_negative(self) -> bool:
        return self.low < 0.0

    def from_uniform(self, u: torch.Tensor) -> torch.Tensor:
        """Map U[0,1) numbers onto the range, keeping each interval's share of the length
        (`service.seeding.generator.map_to_intervals`; its `sample` draws and maps in one
        pass)."""
        from service.seeding import generator as rng

        return rng.map_to_intervals(u, self.intervals)

    def sample(self, shape: tuple[int, ...], generator: torch.Generator,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        """Draw i.i.d. samples (float32 unless ``dtype``) with a torch generator (evaluation
        sets, simulations)."""
        import torch

        return self.from_uniform(torch.rand(shape, generator=generator, dtype=dtype or torch.float32))
