"""Units keyed by the papers' names, so a search space can name a unit.

The names and options live in `service.units.options` (no torch); a unit registers its
implementation here under one of those names, with that name's ``Options`` class.
"""

from __future__ import annotations

from typing import Any, TypeVar

from service.units.base import Unit
from service.units.options import UNIT_OPTIONS, UnknownUnitError, unit_options

__all__ = ["UnknownUnitError", "build_unit", "get_unit", "register", "unit_names"]

_REGISTRY: dict[str, type[Unit]] = {}
U = TypeVar("U", bound=type[Unit])


def register(cls: U) -> U:
    """Class decorator: register ``cls`` under ``cls.name``."""
    if cls.name in _REGISTRY:
        raise ValueError(f"unit {cls.name!r} registered twice")
    if UNIT_OPTIONS.get(cls.name) is not cls.Options:
        raise ValueError(f"unit {cls.name!r} is not in service.units.options.UNIT_OPTIONS "
                         "with its Options class")
    _REGISTRY[cls.name] = cls
    return cls


def unit_names() -> list[str]:
    """The registered units' names (the same as `service.units.options.unit_names`)."""
    _load_builtin_units()
    return sorted(_REGISTRY)


def get_unit(name: str) -> type[Unit]:
    """The unit class for ``name``; an unknown name lists the valid ones."""
    unit_options(name)  # an unknown name: the error lists the valid ones
    _load_builtin_units()
    return _REGISTRY[name]


def build_unit(name: str, in_features: int, out_features: int, num_seeds: int,
               options: dict[str, Any] | None = None, init: str = "default") -> Unit:
    """Construct a unit from plain values (options validated by the unit's ``Options``)."""
    cls = get_unit(name)
    opts = cls.Options(**(options or {}))
    return cls(in_features, out_features, num_seeds, options=opts, init=init)


_BUILTIN_UNITS = ("inalu", "linear", "lstm", "mlp", "nac", "nalu", "nau", "nmu", "npu")


def _load_builtin_units() -> None:
    """Import every unit module (each registers its units; a second import is a no-op)."""
    import importlib

    for module in _BUILTIN_UNITS:
        importlib.import_module(f"service.units.{module}")

