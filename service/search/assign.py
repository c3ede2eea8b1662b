"""The mapping of a trial's searched values onto run configs.

The flat ``{name: value}`` of a trial becomes one `RunConfig` per task through each
parameter's target paths (`service.search.space.run_config_data`); values read back from
MLflow (strings) are typed again first.
"""

from __future__ import annotations

from typing import Any

from service.config import RunConfig
from service.errors import UserError
from service.search.space import CategoricalParam, IntParam, SearchSpace
from service.search.targets import run_config_data


def active_params(space: SearchSpace, values: dict[str, Any]) -> dict[str, Any]:
    """Drop values whose condition does not hold (e.g. a config edited by hand)."""
    out: dict[str, Any] = {}
    for name in space.order():
        if name in values and space.params[name].active(out):
            out[name] = values[name]
    return out


def run_configs(space: SearchSpace, params: dict[str, Any]) -> dict[str, RunConfig]:
    """``{task name: RunConfig}`` of a trial whose searched values are ``params``."""
    params = active_params(space, params)
    return {
        name: RunConfig.model_validate(run_config_data(space, params, name))
        for name in space.task_configs()
    }


def typed_params(space: SearchSpace, params: dict[str, str]) -> dict[str, Any]:
    """A trial's searched values from their MLflow string form back to Python values."""
    out: dict[str, Any] = {}
    for name, param in space.params.items():
        if name not in params:
            continue
        text = params[name]
        if isinstance(param, CategoricalParam):
            matches = [label for label in param.labels if str(label) == text]
            if not matches:
                raise UserError(f"parameter {name}: logged value {text!r} is not one of {param.labels}")
            out[name] = matches[0]
        elif isinstance(param, IntParam):
            out[name] = int(float(text))
        else:
            out[name] = float(text)
    return out
