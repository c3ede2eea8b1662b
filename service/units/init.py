"""Weight initialisations a search space can name (docs/domain/units.md).

``default`` means the unit's own reference initialisation; the rest are the usual torch
schemes applied to one seed's ``[out, in]`` slice with that seed's generator.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Literal

from pydantic import model_validator

from service.frozen import Frozen

if TYPE_CHECKING:
    import torch

    from service.seeding.init_stream import InitStream

InitName = Literal[
    "default", "kaiming_uniform", "kaiming_normal", "xavier_uniform", "xavier_normal",
    "zeros", "ones", "uniform",
]
INIT_NAMES: tuple[str, ...] = InitName.__args__  # type: ignore[attr-defined]
_UNIFORM = re.compile(r"^uniform\(\s*([-+0-9.eE]+)\s*,\s*([-+0-9.eE]+)\s*\)$")


class InitSpec(Frozen):
    """A parsed initialisation; ``uniform`` carries its bounds ``a < b``."""

    kind: InitName = "default"
    a: float | None = None
    b: float | None = None

    @model_validator(mode="after")
    def _bounds(self) -> "InitSpec":
        if self.kind == "uniform":
            if self.a is None or self.b is None or not self.a < self.b:
                raise ValueError("uniform(a, b) needs two numbers with a < b")
        return self

    def __str__(self) -> str:
        return f"uniform({self.a}, {self.b})" if self.kind == "uniform" else self.kind

    def fill_(self, w: torch.Tensor, generator: InitStream) -> torch.Tensor:
        """Fill a 2-d ``[out, in]`` tensor in place (``default`` is the caller's job)."""
        fan_out, fan_in = w.shape[0], w.shape[-1]
        if self.kind == "default":
            raise ValueError("'default' initialisation is defined by each unit")
        if self.kind == "zeros":
            return w.zero_()
        if self.kind == "ones":
            return w.fill_(1.0)
        if self.kind == "uniform":
            return generator.uniform_(w, self.a, self.b)
        if self.kind == "kaiming_uniform":
            bound = math.sqrt(6.0 / fan_in)
            return generator.uniform_(w, -bound, bound)
        if self.kind == "kaiming_normal":
            return generator.normal_(w, 0.0, math.sqrt(2.0 / fan_in))
        if self.kind == "xavier_uniform":
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            return generator.uniform_(w, -bound, bound)
        if self.kind == "xavier_normal":
            return generator.normal_(w, 0.0, math.sqrt(2.0 / (fan_in + fan_out)))
        raise AssertionError(self.kind)


def parse_init(spec: str | InitSpec) -> InitSpec:
    """``"xavier_uniform"`` or ``"uniform(-0.5, 0.5)"`` -> `InitSpec`; clear error otherwise."""
    if isinstance(spec, InitSpec):
        return spec
    text = str(spec).strip()
    m = _UNIFORM.match(text)
    if m:
        return InitSpec(kind="uniform", a=float(m.group(1)), b=float(m.group(2)))
    if text not in INIT_NAMES or text == "uniform":
        valid = ", ".join(n for n in INIT_NAMES if n != "uniform") + ", uniform(a, b)"
        raise ValueError(f"unknown initialisation {text!r}; valid: {valid}")
    return InitSpec(kind=text)  # type: ignore[arg-type]
