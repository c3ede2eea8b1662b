"""Seed-batched neural arithmetic units, registered under the papers' names (docs/domain/units.md).

The names, options and initialisations (`options`, `init`) import without torch, so a run
config can be checked where torch is not loaded; the implementations (`base`, `registry`
and one module per unit) load on first use: `build_unit` / `get_unit` by name.
"""

from __future__ import annotations

import importlib
from typing import Any

from service.units.init import InitSpec, parse_init
from service.units.options import UnitOptions, UnknownUnitError, unit_names

_IMPLEMENTATIONS = {
    "ExactMode": "service.units.base", "ForwardContext": "service.units.base",
    "Unit": "service.units.base", "build_unit": "service.units.registry",
    "get_unit": "service.units.registry", "register": "service.units.registry",
}

__all__ = [
    "ExactMode", "ForwardContext", "InitSpec", "Unit", "UnitOptions", "UnknownUnitError",
    "build_unit", "get_unit", "parse_init", "register", "unit_names",
]


def __getattr__(name: str) -> Any:
    """The torch-backed names, imported when first asked for."""
    if name in _IMPLEMENTATIONS:
        return getattr(importlib.import_module(_IMPLEMENTATIONS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
