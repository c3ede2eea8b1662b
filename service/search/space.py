"""A search space: one YAML file → one validated, frozen `SearchSpace`.

The file names the task(s), the fixed part of the run configuration, and the searched
parameters with their distributions. Every searched parameter writes its value to one or
more *target paths* in the run configuration (``train.optimizer.lr``,
``model.layers.0.options.gate``, ``model.layers.*.init``; default: the parameter's name),
and may be *conditional* (``when: {gate: temperature}``): it exists in a trial only when
the parameters it depends on took one of the listed values. Optuna's define-by-run API
(`service.search.suggest`) then suggests parameters in dependency order.

Mistakes are reported as ``file: key: what is wrong (what is allowed)`` lines.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service import limits
from service.errors import UserError
from service.names import sweep_name_problem
from service.yamlio import load_yaml

Primitive = Union[bool, int, float, str]
DISTRIBUTIONS = ("loguniform", "uniform", "int", "categorical")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_RESERVED = {
    "task": "set the task under 'task:' (or 'tasks:'), not under 'fixed:'",
    "seeds": "set 'seeds' at the top level of the search space",
}
_RESERVED_TRAIN = {"steps", "eval_every"}


class SearchSpaceError(UserError):
    """An invalid search space file; the message lists every problem found."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class _Param(_Frozen):
    target: str | list[str] | None = Field(
        None, description="dotted path(s) in the run config; default: the parameter's name"
    )
    when: dict[str, Primitive | list[Primitive]] = Field(
        default_factory=dict,
        description="condition: every named parameter took (one of) these value(s)",
    )
    description: str = ""

    def targets(self, name: str) -> list[str]:
        if self.target is None:
            return [name]
        return [self.target] if isinstance(self.target, str) else list(self.target)

    def condition(self) -> dict[str, list[Primitive]]:
        return {k: (list(v) if isinstance(v, list) else [v]) for k, v in self.when.items()}

    def active(self, values: dict[str, Any]) -> bool:
        """True when every parameter in ``when`` exists in ``values`` with an allowed value."""
        return all(k in values and _in(values[k], allowed) for k, allowed in self.condition().items())

    def assignments(self, name: str, value: Any) -> list[tuple[str, Any]]:
        """``(path, value)`` pairs this parameter writes into the run config."""
        return [(path, value) for path in self.targets(name)]

    def samples(self) -> list[Any]:
        """Values that exercise the parameter's range when the space is checked."""
        raise NotImplementedError


class UniformParam(_Param):
    """``low ≤ x ≤ high``, uniform (optionally on a grid of ``step``)."""

    type: Literal["uniform"]
    low: float = Field(ge=-limits.MAX_PARAM_VALUE, le=limits.MAX_PARAM_VALUE)
    high: float = Field(ge=-limits.MAX_PARAM_VALUE, le=limits.MAX_PARAM_VALUE)
    step: float | None = Field(None, gt=0, le=limits.MAX_PARAM_VALUE)

    def samples(self) -> list[Any]:
        return [self.low, self.high]


class LogUniformParam(_Param):
    """``log x`` uniform on ``[log low, log high]``; for learning rates, ε, λ_max."""

    type: Literal["loguniform"]
    low: float = Field(gt=0, le=limits.MAX_PARAM_VALUE)
    high: float = Field(gt=0, le=limits.MAX_PARAM_VALUE)

    def samples(self) -> list[Any]:
        return [self.low, self.high]


class IntParam(_Param):
    """An integer ``low ≤ n ≤ high`` (every ``step``; ``log: true`` for scale parameters)."""

    type: Literal["int"]
    low: int = Field(ge=-limits.MAX_PARAM_VALUE, le=limits.MAX_PARAM_VALUE)
    high: int = Field(ge=-limits.MAX_PARAM_VALUE, le=limits.MAX_PARAM_VALUE)
    step: int = Field(1, ge=1, le=limits.MAX_PARAM_VALUE)
    log: bool = False

    def samples(self) -> list[Any]:
        return [self.low, self.high]


class CategoricalParam(_Param):
    """One of ``choices``: a list of plain values, or a mapping ``label: {path: value}``
    whose chosen entry sets several fields at once (then ``target`` is not used)."""

    type: Literal["categorical"]
    choices: list[Primitive] | dict[str, dict[str, Any]] = Field(min_length=1)

    @property
    def labels(self) -> list[Primitive]:
        return list(self.choices) if isinstance(self.choices, dict) else list(self.choices)

    @property
    def is_preset(self) -> bool:
        return isinstance(self.choices, dict)

    def assignments(self, name: str, value: Any) -> list[tuple[str, Any]]:
        if isinstance(self.choices, dict):
            return [(path, copy.deepcopy(v)) for path, v in self.choices[value].items()]
        return super().assignments(name, value)

    def samples(self) -> list[Any]:
        return self.labels


Param = Annotated[
    Union[LogUniformParam, UniformParam, IntParam, CategoricalParam], Field(discriminator="type")
]


class SchedulerSpec(_Frozen):
    """ASHA stops hopeless trials early: at each rung only the top 1/``reduction_factor``
    by the intermediate objective continue. ``grace_period`` is in training steps."""

    type: Literal["asha", "none"] = "asha"
    grace_period: int | None = Field(
        None, ge=1, le=limits.MAX_STEPS, description="training steps before a trial can be stopped (default: steps / 8)"
    )
    reduction_factor: float = Field(3.0, gt=1, le=1000)
    brackets: int = Field(1, ge=1, le=100)


class SamplerSpec(_Frozen):
    """How Optuna proposes trials: ``tpe`` (default; learns from finished trials),
    ``random``, or ``grid`` (every combination of categorical parameters once)."""

    type: Literal["tpe", "random", "grid"] = "tpe"
    seed: int = Field(0, ge=0, lt=2**32, description="numpy, which Optuna seeds, takes 32 bits")


class Resources(_Frozen):
    """What Ray reserves per trial; fractional ``gpus`` let several trials share one GPU."""

    cpus: float = Field(1.0, gt=0, le=limits.MAX_CPUS)
    gpus: float = Field(0.0, ge=0, le=limits.MAX_GPUS)


class SearchSpace(_Frozen):
    """A validated search space (see the module docstring for the file format)."""

    name: str = Field(description="default sweep name (MLflow experiment, Ray experiment dir)")
    description: str = ""
    task: dict[str, Any] | None = Field(None, description="the task: kind and its fixed parameters")
    tasks: dict[str, dict[str, Any]] | None = Field(
        None, description="several named tasks; each trial trains on every one and is scored "
        "by the worst (a robust setting must hold on all of them)"
    )
    fixed: dict[str, Any] = Field(
        default_factory=dict, description="fixed run-config fields: model, train, device, ..."
    )
    params: dict[str, Param] = Field(default_factory=dict)
    seeds: int = Field(16, ge=1, le=limits.MAX_SEEDS, description="training seeds per trial (per task)")
    steps: int = Field(ge=1, le=limits.MAX_STEPS, description="training steps per seed")
    eval_every: int = Field(1000, ge=1, le=limits.MAX_STEPS, description="evaluate (and report to Tune) every k steps")
    objective: Literal["success_ci_low"] = Field(
        "success_ci_low", description="lower end of the 95% Wilson interval of the success rate"
    )
    trials: int = Field(20, ge=1, le=limits.MAX_TRIALS)
    concurrency: int = Field(2, ge=1, le=limits.MAX_CONCURRENCY, description="trials running at once")
    scheduler: SchedulerSpec = SchedulerSpec()
    resources: Resources = Resources()
    retries: int = Field(1, ge=0, le=limits.MAX_RETRIES, description="times a crashed trial is retried")
    checkpoint_every: int = Field(
        10, ge=0, le=limits.MAX_STEPS, description="checkpoint a trial every k evaluations (and after each task) to the "
        "Tune storage, so a retried or resumed trial continues from there; 0: never"
    )
    sampler: SamplerSpec = SamplerSpec()

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("scheduler", "sampler"):
                if isinstance(data.get(key), str):
                    data = {**data, key: {"type": data[key]}}
        return data

    # -- derived views ------------------------------------------------------------------------
    def task_configs(self) -> dict[str, dict[str, Any]]:
        """``{task name: task config}``; a single ``task`` is named after its kind."""
        if self.tasks is not None:
            return dict(self.tasks)
        assert self.task is not None
        return {str(self.task.get("kind", "task")): dict(self.task)}

    def order(self) -> list[str]:
        """Parameter names in dependency order (a parameter after those in its ``when``);
        presets first, otherwise in file order."""
        remaining = list(self.params)
        remaining.sort(key=lambda n: 0 if _is_preset(self.params[n]) else 1)
        done: list[str] = []
        while remaining:
            for name in remaining:
                if all(dep in done for dep in self.params[name].when):
                    done.append(name)
                    remaining.remove(name)
                    break
            else:  # a cycle; `problems` reports it
                done.extend(remaining)
                break
        return done

    def grid(self) -> dict[str, list[Primitive]]:
        """The grid of a ``grid`` sampler: every parameter's choices."""
        return {name: p.labels for name, p in self.params.items() if isinstance(p, CategoricalParam)}

    def reports_per_task(self) -> int:
        """Tune reports per task: one per evaluation after step 0."""
        return math.ceil(self.steps / self.eval_every)

    def total_reports(self) -> int:
        return self.reports_per_task() * len(self.task_configs())

    def grace_reports(self) -> int:
        grace = self.scheduler.grace_period or max(self.eval_every, self.steps // 8)
        return max(1, min(self.total_reports(), math.ceil(grace / self.eval_every)))

    def with_overrides(self, source: str = "command line", **overrides: Any) -> "SearchSpace":
        """A copy with the CLI's overrides (``trials``, ``seeds``, ``steps``, ``cpus``, ...)
        applied and validated again; ``None`` values are ignored."""
        data = self.model_dump(mode="json")
        changes = {k: v for k, v in overrides.items() if v is not None}
        if not changes:
            return self
        if "cpus" in changes or "gpus" in changes:
            data["resources"] = {**data.get("resources", {}), **{
                k: changes.pop(k) for k in ("cpus", "gpus") if k in changes}}
        data.update(changes)
        return parse_space(data, source=source)

    def spec_json(self) -> str:
        """The resolved spec as canonical JSON (what the sweep actually runs)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1)

    def spec_hash(self) -> str:
        return hashlib.sha256(self.spec_json().encode()).hexdigest()[:16]

    # -- cross-field checks ---------------------------------------------------------------------
    def problems(self) -> list[tuple[str, str]]:
        """``(key, message)`` for each mistake that a field-by-field check cannot see."""
        out: list[tuple[str, str]] = []
        if (self.task is None) == (self.tasks is None):
            out.append(("task", "give exactly one of 'task' (one task) or 'tasks' (named tasks)"))
            return out
        if self.tasks is not None and not self.tasks:
            out.append(("tasks", "needs at least one task"))
        for key, why in _RESERVED.items():
            if key in self.fixed:
                out.append((f"fixed.{key}", why))
        for key in ("model", "train"):
            if key in self.fixed and not isinstance(self.fixed[key], dict):
                out.append((f"fixed.{key}", f"must be a mapping of {key} settings (key: value), "
                            f"not {type(self.fixed[key]).__name__}"))
        train = self.fixed.get("train")
        if isinstance(train, dict):
            for key in sorted(_RESERVED_TRAIN & set(train)):
                out.append((f"fixed.train.{key}", f"set '{key}' at the top level of the search space"))
        if self.eval_every > self.steps:
            out.append(("eval_every", f"must be ≤ steps ({self.steps}), got {self.eval_every}"))
        name_problem = sweep_name_problem(self.name)
        if name_problem is not None:
            out.append(("name", name_problem))
        for name, p in self.params.items():
            out.extend(_param_problems(self, name, p))
        if self.sampler.type == "grid":
            out.extend(self._grid_problems())
        if not out:
            out.extend(self._cycle_problems())
        if not out:
            out.extend(_config_problems(self))
        return out

    def _grid_problems(self) -> list[tuple[str, str]]:
        out = []
        for name, p in self.params.items():
            if not isinstance(p, CategoricalParam) or p.when:
                out.append((f"params.{name}", "the grid sampler needs categorical parameters without 'when' "
                            "(use sampler: tpe or random for this space)"))
        size = math.prod(len(p.labels) for p in self.params.values() if isinstance(p, CategoricalParam))
        if not out and self.trials > size:
            out.append(("trials", f"the grid has {size} combinations; trials must be ≤ {size}, got {self.trials}"))
        return out

    def _cycle_problems(self) -> list[tuple[str, str]]:
        state: dict[str, int] = {}

        def visit(name: str, path: list[str]) -> list[str] | None:
            if state.get(name) == 2:
                return None
            if state.get(name) == 1:
                return path[path.index(name):] + [name]
            state[name] = 1
            for dep in self.params[name].when:
                cycle = visit(dep, path + [name])
                if cycle:
                    return cycle
            state[name] = 2
            return None

        for name in self.params:
            cycle = visit(name, [])
            if cycle:
                return [(f"params.{cycle[0]}.when", "conditions form a cycle: " + " → ".join(cycle))]
        return []


def _is_preset(p: Any) -> bool:
    return isinstance(p, CategoricalParam) and p.is_preset


def _in(value: Any, allowed: list[Primitive]) -> bool:
    """``value in allowed``, but ``True`` is not ``1``."""
    return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed)


def _param_problems(space: SearchSpace, name: str, p: Any) -> list[tuple[str, str]]:
    key = f"params.{name}"
    out: list[tuple[str, str]] = []
    if not _NAME.match(name):
        out.append((key, "parameter names are letters, digits, '_', '-' and '.', starting with a letter"))
    if isinstance(p, (UniformParam, LogUniformParam, IntParam)):
        if not p.low < p.high:
            out.append((key, f"low ({p.low}) must be < high ({p.high})"))
        if not all(math.isfinite(v) for v in (p.low, p.high)):
            out.append((key, "low and high must be finite numbers"))
        if isinstance(p, IntParam) and p.log and p.low < 1:
            out.append((f"{key}.low", "must be ≥ 1 when log: true"))
        if isinstance(p, IntParam) and p.log and p.step != 1:
            out.append((f"{key}.step", "must be 1 when log: true (Optuna's rule)"))
    if isinstance(p, CategoricalParam):
        labels = p.labels
        if len({json.dumps(v) for v in labels}) != len(labels):
            out.append((f"{key}.choices", "choices must be distinct"))
        if p.is_preset and p.target is not None:
            out.append((f"{key}.target", "not used when choices is a mapping label: {path: value}"))
    for path in ([] if _is_preset(p) else p.targets(name)):
        problem = _path_problem(path)
        if problem:
            out.append((f"{key}.target", f"{path!r}: {problem}"))
    for dep, allowed in p.condition().items():
        if dep == name:
            out.append((f"{key}.when", "a parameter cannot depend on itself"))
        elif dep not in space.params:
            valid = ", ".join(n for n in space.params if n != name) or "(none)"
            out.append((f"{key}.when", f"refers to {dep!r}, which is not a parameter; parameters: {valid}"))
        else:
            ref = space.params[dep]
            if isinstance(ref, CategoricalParam):
                bad = [a for a in allowed if not _in(a, ref.labels)]
                if bad:
                    out.append((f"{key}.when.{dep}", f"{bad[0]!r} is not a choice of {dep!r}; "
                                f"choices: {', '.join(map(str, ref.labels))}"))
    return out


def _path_problem(path: str) -> str | None:
    parts = path.split(".")
    if not parts or any(not part for part in parts):
        return "a dotted path such as 'train.optimizer.lr' or 'model.layers.0.options.gate'"
    top = parts[0]
    allowed_top = ("model", "train", "device", "compile", "master_seed", "seed_offset")
    if top == "task":
        return "searching the task is not supported; list several under 'tasks:' instead"
    if top not in allowed_top:
        return f"unknown top-level field {top!r}; allowed: {', '.join(allowed_top)}"
    return None


# -- mapping values onto the run configuration ------------------------------------------------------
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
    data["seeds"] = space.seeds
    train = data.setdefault("train", {})
    train["steps"] = space.steps
    train["eval_every"] = space.eval_every
    model = data.setdefault("model", {})
    order = [n for n in space.order() if n in params]
    presets = [n for n in order if _is_preset(space.params[n])]

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


def _config_problems(space: SearchSpace) -> list[tuple[str, str]]:
    """Build real run configs: first the fixed part alone, then representative trials
    (every choice of every categorical parameter, both ends of every numeric range).
    A failing trial is blamed on the first parameter whose value makes it fail."""
    from service.config import RunConfig

    for task_name in space.task_configs():
        try:
            data = run_config_data(space, {}, task_name)
            RunConfig.model_validate(data)
        except ValidationError as e:
            return [_locate_fixed(space, e, task_name, data)]
    problems: dict[str, tuple[str, str]] = {}
    base = searched_values(space)
    cases: list[dict[str, Any]] = [base]
    for name, p in space.params.items():
        for sample in p.samples():
            values = searched_values(space, {**base, name: sample})
            if name in values:
                cases.append(values)
    for values in cases:
        for task_name in space.task_configs():
            culprit = _first_failure(space, values, task_name)
            if culprit and culprit[0] not in problems:
                problems[culprit[0]] = culprit[1]
    return list(problems.values())


def _first_failure(space: SearchSpace, values: dict[str, Any], task_name: str
                   ) -> tuple[str, tuple[str, str]] | None:
    from service.config import RunConfig

    def check(subset: dict[str, Any]) -> Exception | None:
        try:
            data = run_config_data(space, subset, task_name)
            RunConfig.model_validate(data)
        except (ValidationError, TargetError) as e:
            return e
        return None

    if check(values) is None:
        return None
    applied: dict[str, Any] = {}
    for name in space.order():
        if name not in values:
            continue
        applied[name] = values[name]
        err = check(applied)
        if err is None:
            continue
        if isinstance(err, TargetError):
            return err.param, (f"params.{err.param}.target", err.message)
        data = run_config_data(space, applied, task_name)
        where, msg = _run_config_error(err, data)
        return name, (f"params.{name}", f"{values[name]!r} gives an invalid run config: {where}: {msg}")
    return None


def _locate_fixed(space: SearchSpace, err: ValidationError, task_name: str,
                  data: dict[str, Any]) -> tuple[str, str]:
    """A failure of the fixed part: point at ``task``/``tasks.<name>`` or ``fixed.<key>``."""
    where, msg = _run_config_error(err, data)
    if where == "task" or where.startswith("task."):
        key = f"tasks.{task_name}" if space.tasks is not None else "task"
        return (key + where[len("task"):], msg)
    return (f"fixed.{where}" if where else "fixed", msg)


def _run_config_error(err: ValidationError, data: dict[str, Any]) -> tuple[str, str]:
    """(dotted location, message) of the first problem, with allowed keys for unknown ones."""
    e = err.errors(include_url=False)[0]
    loc = [x for x in e["loc"] if not _internal(x)]
    where = ".".join(str(x) for x in loc)
    if e["type"] != "extra_forbidden":
        return where, _message(e)
    allowed, unit = _allowed_keys_at(loc[:-1], data)
    if unit is not None:
        return where, (f"unit {unit!r} has no option {loc[-1]!r}; its options: "
                       f"{', '.join(allowed or []) or '(none)'}")
    if allowed is None:
        return where, "unknown key"
    return where, f"unknown key; allowed: {', '.join(allowed) or '(none)'}"


def _allowed_keys_at(loc: list[Any], data: dict[str, Any]) -> tuple[list[str] | None, str | None]:
    """Field names of the run-config model at ``loc``; for a layer, its unit's options and
    the unit's name (a layer's options are checked by the unit, keyed without 'options')."""
    import typing

    from pydantic import BaseModel as _Model

    from service.config import LayerConfig, RunConfig
    from service.units.registry import get_unit

    model: Any = RunConfig
    node: Any = data
    for item in loc:
        if isinstance(node, list) and isinstance(item, int) and item < len(node):
            node = node[item]
        elif isinstance(node, dict):
            node = node.get(item)
        if isinstance(item, int):
            continue
        field = model.model_fields.get(item)
        if field is None:
            return None, None
        found, candidates = None, [field.annotation]
        while candidates:
            ann = candidates.pop()
            if isinstance(ann, type) and issubclass(ann, _Model):
                found = ann
                break
            candidates.extend(typing.get_args(ann))
        if found is None:
            return None, None
        model = found
    if model is LayerConfig and isinstance(node, dict) and "unit" in node:
        try:
            return sorted(get_unit(str(node["unit"])).Options.model_fields), str(node["unit"])
        except Exception:  # noqa: BLE001 - an unknown unit is reported on its own
            return None, None
    return list(model.model_fields), None


def _internal(item: Any) -> bool:
    text = str(item)
    return "[" in text or text.startswith("function-") or text in DISTRIBUTIONS


def _message(e: dict[str, Any]) -> str:
    msg = str(e["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if e["type"] == "extra_forbidden":
        return "unknown key"
    if e["type"] not in ("missing",) and "input" in e and not isinstance(e["input"], dict):
        msg += f" (got {repr(e['input'])[:80]})"
    return msg


# -- loading and error messages -----------------------------------------------------------------------
_ALLOWED_KEYS: dict[str, tuple[str, ...]] = {
    "": tuple(SearchSpace.model_fields),
    "scheduler": tuple(SchedulerSpec.model_fields),
    "resources": tuple(Resources.model_fields),
    "sampler": tuple(SamplerSpec.model_fields),
    **{t: tuple(m.model_fields) for t, m in (
        ("loguniform", LogUniformParam), ("uniform", UniformParam), ("int", IntParam),
        ("categorical", CategoricalParam))},
}


def _describe(err: ValidationError, data: dict[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for e in err.errors(include_url=False):
        loc = list(e["loc"])
        if e["type"] == "extra_forbidden":
            parent, key = loc[:-1], loc[-1]
            kind = ""
            if len(parent) >= 2 and parent[0] == "params":
                kind = parent[2] if len(parent) > 2 else str((data.get("params") or {}).get(parent[1], {}).get("type", ""))
                parent = parent[:2]
            else:
                kind = ".".join(map(str, parent))
            allowed = ", ".join(_ALLOWED_KEYS.get(kind, ()))
            where = ".".join(str(x) for x in parent + [key])
            out.append((where, f"unknown key{'; allowed: ' + allowed if allowed else ''}"))
            continue
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            where = ".".join(str(x) for x in loc)
            got = e.get("ctx", {}).get("tag")
            what = f"unknown distribution {got!r}" if got is not None else "missing 'type'"
            out.append((f"{where}.type", f"{what}; allowed: {', '.join(DISTRIBUTIONS)}"))
            continue
        where = ".".join(str(x) for x in loc if not _internal(x))
        msg = _message(e)
        if len(loc) > 2 and loc[0] == "params" and "choices" in loc:
            where = ".".join(str(x) for x in loc[:loc.index("choices") + 1] if not _internal(x))
            msg = ("choices must be a list of plain values (text, numbers, true/false), or a "
                   "mapping label: {path: value, ...}")
            if e["type"] == "too_short":
                msg = "needs at least one choice"
        if e["type"] == "greater_than" and where.endswith(".low") and "loguniform" in map(str, loc):
            msg = "must be > 0 for a loguniform distribution" + msg[msg.find(" (got"):] if "(got" in msg else msg
        out.append((where or "(top level)", msg))
    # one message per key: the first one is the most specific
    seen: dict[str, str] = {}
    for where, msg in out:
        seen.setdefault(where, msg)
    return list(seen.items())


def parse_space(data: Any, source: str = "search space") -> SearchSpace:
    """Validate plain data; raises `SearchSpaceError` listing every ``source: key: problem``."""
    if not isinstance(data, dict):
        raise SearchSpaceError(f"{source}: the top level must be a mapping (key: value), "
                               f"not {type(data).__name__}")
    try:
        space = SearchSpace.model_validate(data)
    except ValidationError as e:
        lines = [f"{source}: {where}: {msg}" for where, msg in _describe(e, data)]
        raise SearchSpaceError("\n".join(lines)) from None
    problems = space.problems()
    if problems:
        raise SearchSpaceError("\n".join(f"{source}: {where}: {msg}" for where, msg in problems))
    return space


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search space YAML file (`service.yamlio`: safe and bounded)."""
    path = Path(path)
    data = load_yaml(path, SearchSpaceError)
    if data is None:
        raise SearchSpaceError(f"{path}: the file is empty")
    return parse_space(data, source=str(path))
