"""Seed-batched neural arithmetic units, registered under the papers' names (SPEC.md §1).

Importing this package registers every unit; use `build_unit` / `get_unit` by name.
"""

from service.units import inalu, linear, lstm, mlp, nac, nalu, nau, nmu, npu  # noqa: F401  (registers)
from service.units.base import ExactMode, ForwardContext, Unit, UnitOptions
from service.units.init import InitSpec, parse_init
from service.units.registry import (
    UnknownUnitError,
    build_unit,
    get_unit,
    register,
    unit_names,
)

__all__ = [
    "ExactMode", "ForwardContext", "InitSpec", "Unit", "UnitOptions", "UnknownUnitError",
    "build_unit", "get_unit", "parse_init", "register", "unit_names",
]
