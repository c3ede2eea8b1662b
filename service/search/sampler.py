"""Optuna define-by-run over a `SearchSpace`.

Parameters are suggested in dependency order; a conditional parameter is only suggested
(and so only exists in the trial) when its ``when`` holds for the values already drawn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.search.space import (
    CategoricalParam,
    IntParam,
    LogUniformParam,
    SearchSpace,
    UniformParam,
)

if TYPE_CHECKING:  # Optuna loads with the searcher, not before a sweep's Ray starts
    import optuna


def suggest_value(trial: optuna.Trial, name: str, param: Any) -> Any:
    """One parameter's value from Optuna, by distribution."""
    if isinstance(param, LogUniformParam):
        return trial.suggest_float(name, param.low, param.high, log=True)
    if isinstance(param, UniformParam):
        return trial.suggest_float(name, param.low, param.high, step=param.step)
    if isinstance(param, IntParam):
        return trial.suggest_int(name, param.low, param.high, step=param.step, log=param.log)
    if isinstance(param, CategoricalParam):
        return trial.suggest_categorical(name, param.labels)
    raise TypeError(f"unknown parameter type {type(param).__name__}")


def suggest_params(trial: optuna.Trial, space: SearchSpace) -> dict[str, Any]:
    """Define-by-run: the trial's active parameters ``{name: value}``, in dependency order."""
    values: dict[str, Any] = {}
    for name in space.order():
        param = space.params[name]
        if param.active(values):
            values[name] = suggest_value(trial, name, param)
    return values


class DefineByRun:
    """A picklable define-by-run function for `ray.tune.search.optuna.OptunaSearch`: the
    values suggested through ``trial`` become the Tune trial's config."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    def __call__(self, trial: optuna.Trial) -> None:
        suggest_params(trial, self.space)

