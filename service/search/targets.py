"""Where a trial's values go: each searched parameter's value written at its target paths
in the run configuration (plain data), on top of the space's fixed part and the task."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from service.search.space import is_preset

if TYPE_CHECKING:
    from service.search.space import SearchSpace


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``value`` at dotted ``path`` in nested dicts/lists; ``*`` means every list item,
    a number a list index; missing dicts are created. Raises ``KeyError`` with the reason."""
    parts = path.split(".")
    _set(data, parts, value, [])


def _set(node: Any, parts: list[str], value: Any, seen: list[str]) -> None:
    head, rest = parts[0], parts[1:]
    where = ".".join(seen + [head])
    if isinstance(node, list):
        if head == "*":
            indices = range(len(node))
        elif head.isdigit():
            if int(head) >= len(node):
                raise KeyError(f"{where}: index {head} is out of range (the list has {len(node)} items)")
            indices = [int(head)]
        else:
            raise KeyError(f"{where}: {'.'.join(seen)} is a list; use an index or '*'")
        for i in indices:
            if rest:
                _set(node[i], rest, value, seen + [str(i)])
            else:
                node[i] = copy.deepcopy(value)
        return
    if not isinstance(node, dict):
        raise KeyError(f"{where}: {'.'.join(seen)} is a value, not a mapping")
    if not rest:
        node[head] = copy.deepcopy(value)
        return
    child = node.get(head)
    if child is None:
        child = node[head] = {}
    _set(child, rest, value, seen + [head])


def _touches_layers(space: SearchSpace, params: dict[str, Any]) -> bool:
    for name, value in params.items():
        for path, _ in space.params[name].assignments(name, value):
            if path.startswith("model.layers."):
                return True
    return False


class TargetError(KeyError):
    """A parameter's target path does not fit the run config (e.g. a missing layer)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


def run_config_data(space: SearchSpace, params: dict[str, Any], task_name: str) -> dict[str, Any]:
    """The run config (plain data) of one trial on one task: fixed fields, the task, seeds,
    steps and eval_every, then each parameter's value at its target path(s) (presets first,
    then in dependency order). A model without fixed layers gets the task's reference
    layers when a parameter targets ``model.layers.N``."""
    from service.config import RunConfig

    data = copy.deepcopy(space.fixed)
    data["task"] = copy.deepcopy(space.task_configs()[task_name])
    data["seeds"] = space.trial_seeds()  # a race: every seed its blocks can reach
    train = data.setdefault("train", {})
    train["steps"] = space.steps
    train["eval_every"] = space.eval_every
    model = data.setdefault("model", {})
    order = [n for n in space.order() if n in params]
    presets = [n for n in order if is_preset(space.params[n])]

    def apply(name: str) -> None:
        for path, value in space.params[name].assignments(name, params[name]):
            try:
                set_path(data, path, value)
            except KeyError as e:
                raise TargetError(name, str(e.args[0])) from None

    if model.get("layers") is None and _touches_layers(space, params):
        for name in presets:  # presets may set the whole layer list
            apply(name)
        if data["model"].get("layers") is None:
            base = RunConfig.model_validate({"task": data["task"]})
            data["model"]["layers"] = [layer.model_dump(mode="json") for layer in base.layers()]
    for name in order:
        apply(name)
    return data


def searched_values(space: SearchSpace, choose: dict[str, Any] | None = None) -> dict[str, Any]:
    """Values of the active parameters: ``choose`` where given, else each one's first sample
    (first choice, or ``low``) — for checks and examples, not for searching."""
    choose = choose or {}
    values: dict[str, Any] = {}
    for name in space.order():
        p = space.params[name]
        if p.active(values):
            values[name] = choose.get(name, p.samples()[0])
    return values

