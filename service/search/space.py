"""A search space: one YAML file → one validated, frozen `SearchSpace`.

The file names the task(s), the fixed part of the run configuration, and the searched
parameters with their distributions. Every searched parameter writes its value to one or
more *target paths* in the run configuration (``train.optimizer.lr``,
``model.layers.0.options.gate``, ``model.layers.*.init``; default: the parameter's name),
and may be *conditional* (``when: {gate: temperature}``): it exists in a trial only when
the parameters it depends on took one of the listed values. Optuna's define-by-run API
(`service.search.sampler`) then suggests parameters in dependency order.

Mistakes are reported as ``file: key: what is wrong (what is allowed)`` lines.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from typing import Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from service import limits
from service.errors import UserError
from service.frozen import Frozen
from service.names import sweep_name_problem
from service.search.scheduler import RACE_KEYS, SchedulerSpec

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


class _Param(Frozen):
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


class SamplerSpec(Frozen):
    """How Optuna proposes trials: ``tpe`` (default; learns from finished trials),
    ``random``, or ``grid`` (every combination of categorical parameters once)."""

    type: Literal["tpe", "random", "grid"] = "tpe"
    seed: int = Field(0, ge=0, lt=2**32, description="numpy, which Optuna seeds, takes 32 bits")


class Resources(Frozen):
    """What Ray reserves per trial; fractional ``gpus`` let several trials share one GPU."""

    cpus: float = Field(1.0, gt=0, le=limits.MAX_CPUS)
    gpus: float = Field(0.0, ge=0, le=limits.MAX_GPUS)


class SearchSpace(Frozen):
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
    pack: int = Field(
        1, ge=1, le=limits.MAX_PACK, description="train up to this many trials as one seed-batched computation "
        "(pack × seeds seeds): they share every setting but the continuous ones (service.search.packing); 1: alone"
    )

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
        remaining.sort(key=lambda n: 0 if is_preset(self.params[n]) else 1)
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

    def spec_json(self) -> str:
        """The resolved spec as canonical JSON (what the sweep actually runs)."""
        data = self.model_dump(mode="json")
        if data.get("pack") == 1:  # the default: a space from before packing keeps its hash
            del data["pack"]
        for key in RACE_KEYS:  # unset race keys: a space from before racing keeps its hash
            if data["scheduler"].get(key) is None:
                del data["scheduler"][key]
        return json.dumps(data, sort_keys=True, indent=1)

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
        out.extend(self.scheduler.problems())
        if self.scheduler.type == "race":
            out.extend(self._race_problems())
        # a race's block is at most its max_seeds (asked only of a race that is valid so far)
        seeds = self.trial_seeds() if self.scheduler.type == "race" and not out else self.seeds
        if self.pack > 1 and self.pack * seeds > limits.MAX_SEEDS:
            out.append(("pack", (f"pack × seeds ({self.pack} × {seeds}) must be ≤ {limits.MAX_SEEDS}, "
                                 "the seeds one computation may train")))
        if not out:
            out.extend(self._cycle_problems())
        return out

    def _race_problems(self) -> list[tuple[str, str]]:
        """A race pairs settings seed by seed: every setting trains the same seed ids."""
        out = []
        for name, p in self.params.items():
            paired = sorted({t.split(".")[0] for t in p.targets(name)} & {"seeds", "seed_offset", "master_seed"})
            if paired:
                out.append((f"params.{name}", f"targets {paired[0]}: a race compares settings on the same seeds, "
                                              "so the seeds cannot be searched"))
        return out

    def trial_seeds(self) -> int:
        """The seeds a trial's run config spans: ``seeds``, or a race's ``max_seeds`` (its
        blocks are slices of them: `service.sweep.race_trial`)."""
        return self.scheduler.race().max_seeds if self.scheduler.type == "race" else self.seeds

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


def is_preset(p: Any) -> bool:
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
    for path in ([] if is_preset(p) else p.targets(name)):
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






