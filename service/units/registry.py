"""Units keyed by the papers' names, so a search space can name a unit."""

from __future__ import annotations

from typing import Any, TypeVar

from service.units.base import Unit

_REGISTRY: dict[str, type[Unit]] = {}
U = TypeVar("U", bound=type[Unit])


class UnknownUnitError(ValueError):
    """Raised for a unit name that is not registered; the message lists the valid names."""


def register(cls: U) -> U:
    """Class decorator: register ``cls`` under ``cls.name``."""
    if cls.name in _REGISTRY:
        raise ValueError(f"unit {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def unit_names() -> list[str]:
    _load_builtin_units()
    return sorted(_REGISTRY)


def get_unit(name: str) -> type[Unit]:
    """The unit class for ``name``; an unknown name lists the valid ones."""
    _load_builtin_units()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownUnitError(
            f"unknown unit {name!r}; valid units: {', '.join(sorted(_REGISTRY))}"
        ) from None


def build_unit(name: str, in_features: int, out_features: int, num_seeds: int,
               options: dict[str, Any] | None = None, init: str = "default") -> Unit:
    """Construct a unit from plain values (options validated by the unit's ``Options``)."""
    cls = get_unit(name)
    opts = cls.Options(**(options or {}))
    return cls(in_features, out_features, num_seeds, options=opts, init=init)


def _load_builtin_units() -> None:
    import service.units  # noqa: F401  (importing the package registers every unit)

