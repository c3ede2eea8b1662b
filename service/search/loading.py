"""One YAML file → one validated `SearchSpace`, or one error that lists every mistake as
``file: key: what is wrong (what is allowed)``.

Field-by-field checks are pydantic's (described here in the space's own words), cross-field
checks are the space's (`SearchSpace.problems`), and last the space is tried for real:
run configs of representative trials are built and validated, and a failure is blamed on
the parameter that causes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from service.errors import (
    did_you_mean,
    error_message,
    is_internal_loc,
    unknown_key_message,
)
from service.search.packing import pack_problems
from service.search.scheduler import SchedulerSpec
from service.search.space import (
    DISTRIBUTIONS,
    CategoricalParam,
    IntParam,
    LogUniformParam,
    Resources,
    SamplerSpec,
    SearchSpace,
    SearchSpaceError,
    UniformParam,
)
from service.search.targets import TargetError, run_config_data, searched_values
from service.yamlio import empty_file, load_yaml


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
    loc = [x for x in e["loc"] if not is_internal_loc(x, DISTRIBUTIONS)]
    where = ".".join(str(x) for x in loc)
    if e["type"] != "extra_forbidden":
        return where, error_message(e)
    allowed, unit = _allowed_keys_at(loc[:-1], data)
    if unit is not None:
        return where, unknown_key_message(loc[-1], allowed or [], f"unit {unit!r} has no option {loc[-1]!r}",
                                          "its options")
    return where, unknown_key_message(loc[-1], allowed)


def describe_run_config_error(err: ValidationError, data: dict[str, Any], source: str | None = None) -> str:
    """``source: where: problem`` lines for a run config, an unknown key with the allowed
    ones and the closest of them (``did you mean …``)."""
    prefix = f"{source}: " if source else ""
    lines = []
    for e in err.errors(include_url=False):
        loc = [x for x in e["loc"] if not is_internal_loc(x, DISTRIBUTIONS)]
        where = ".".join(str(x) for x in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed, unit = _allowed_keys_at(loc[:-1], data)
            what = f"unit {unit!r} has no option {loc[-1]!r}" if unit else "unknown key"
            msg = unknown_key_message(loc[-1], allowed, what, "its options" if unit else "allowed")
        else:
            msg = error_message(e)
        lines.append(f"{prefix}{where}: {msg}")
    return "\n".join(lines)


def _allowed_keys_at(loc: list[Any], data: dict[str, Any]) -> tuple[list[str] | None, str | None]:
    """Field names of the run-config model at ``loc``; for a layer, its unit's options and
    the unit's name (a layer's options are checked by the unit, keyed without 'options')."""
    import typing

    from pydantic import BaseModel as _Model

    from service.config import LayerConfig, RunConfig
    from service.units.options import unit_options

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
            return sorted(unit_options(str(node["unit"])).model_fields), str(node["unit"])
        except Exception:  # noqa: BLE001 - an unknown unit is reported on its own
            return None, None
    return list(model.model_fields), None


_ALLOWED_KEYS: dict[str, tuple[str, ...]] = {
    "": tuple(SearchSpace.model_fields),
    "scheduler": tuple(SchedulerSpec.model_fields),
    "resources": tuple(Resources.model_fields),
    "sampler": tuple(SamplerSpec.model_fields),
    **{t: tuple(m.model_fields) for t, m in (
        ("loguniform", LogUniformParam), ("uniform", UniformParam), ("int", IntParam),
        ("categorical", CategoricalParam))},
}


def _misspelt_missing(errors: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """Locations of required keys reported missing beside an unknown key that is close to
    them (``choises`` for ``choices``): the unknown key says it better, so they are dropped."""
    unknown: dict[tuple[Any, ...], list[str]] = {}
    for e in errors:
        if e["type"] == "extra_forbidden":
            unknown.setdefault(tuple(e["loc"][:-1]), []).append(str(e["loc"][-1]))
    return {tuple(e["loc"]) for e in errors if e["type"] == "missing" and len(e["loc"]) > 0
            and did_you_mean(e["loc"][-1], unknown.get(tuple(e["loc"][:-1]), []))}


def _describe(err: ValidationError, data: dict[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    errors = err.errors(include_url=False)
    misspelt = _misspelt_missing(errors)
    for e in errors:
        loc = list(e["loc"])
        if tuple(loc) in misspelt:
            continue
        if e["type"] == "extra_forbidden":
            parent, key = loc[:-1], loc[-1]
            kind = ""
            if len(parent) >= 2 and parent[0] == "params":
                kind = parent[2] if len(parent) > 2 else str((data.get("params") or {}).get(parent[1], {}).get("type", ""))
                parent = parent[:2]
            else:
                kind = ".".join(map(str, parent))
            allowed = _ALLOWED_KEYS.get(kind)
            where = ".".join(str(x) for x in parent + [key])
            out.append((where, unknown_key_message(key, allowed)))
            continue
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            where = ".".join(str(x) for x in loc)
            got = e.get("ctx", {}).get("tag")
            what = f"unknown distribution {got!r}" if got is not None else "missing 'type'"
            out.append((f"{where}.type", f"{what}; allowed: {', '.join(DISTRIBUTIONS)}"))
            continue
        where = ".".join(str(x) for x in loc if not is_internal_loc(x, DISTRIBUTIONS))
        msg = error_message(e)
        if len(loc) > 2 and loc[0] == "params" and "choices" in loc:
            where = ".".join(str(x) for x in loc[:loc.index("choices") + 1] if not is_internal_loc(x, DISTRIBUTIONS))
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
    problems = space.problems() or _config_problems(space) or pack_problems(space)
    if problems:
        raise SearchSpaceError("\n".join(f"{source}: {where}: {msg}" for where, msg in problems))
    return space


def with_overrides(space: SearchSpace, source: str = "command line", **overrides: Any) -> SearchSpace:
    """A copy of ``space`` with the CLI's overrides (``trials``, ``seeds``, ``steps``, ``cpus``,
    ...) applied and validated again (`parse_space`); ``None`` values are ignored."""
    data = space.model_dump(mode="json")
    changes = {k: v for k, v in overrides.items() if v is not None}
    if not changes:
        return space
    if "cpus" in changes or "gpus" in changes:
        data["resources"] = {**data.get("resources", {}), **{
            k: changes.pop(k) for k in ("cpus", "gpus") if k in changes}}
    if changes.get("scheduler") == data["scheduler"]["type"]:
        del changes["scheduler"]  # the file's scheduler, with its settings
    data.update(changes)
    return parse_space(data, source=source)


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search space YAML file (`service.yamlio`: safe and bounded)."""
    path = Path(path)
    data = load_yaml(path, SearchSpaceError)
    if data is None:
        raise empty_file(path, SearchSpaceError)
    return parse_space(data, source=str(path))

