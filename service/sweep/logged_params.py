"""The parameters logged with every trial besides its searched ones: the task's
(``task.*``), the regulariser schedule it trains with (``regularizer.*``) and the mode its
steps run in (``compile_mode``: compiled or eager)."""

from __future__ import annotations

from typing import Any

from service.config import RunConfig
from service.search.space import SearchSpace


def task_params(space: SearchSpace) -> dict[str, Any]:
    """The task parameters logged with each trial (``task.*``; ``task.<name>.*`` for
    several tasks), plus seeds/steps/eval_every, which a success rate needs to be read."""
    from service.tasks import parse_task

    out: dict[str, Any] = {}
    tasks = space.task_configs()
    for name, data in tasks.items():
        prefix = "task." if len(tasks) == 1 else f"task.{name}."
        task = parse_task(data)
        for key, value in task:
            if isinstance(value, dict):
                for sub, v in value.items():
                    out[f"{prefix}{key}.{sub}"] = str(v)
            else:
                out[f"{prefix}{key}"] = str(value) if not isinstance(value, (int, float, str, bool)) else value
        out[f"{prefix}kind"] = task.kind
    out.update(seeds=space.seeds, steps=space.steps, eval_every=space.eval_every)
    return out


def regularizer_params(configs: dict[str, RunConfig]) -> dict[str, Any]:
    """The regulariser schedule each task of the trial actually trains with (the space's,
    else the reference default scaled to the run, `RunConfig.regularizer`), logged as
    ``regularizer.*`` (``regularizer.<task>.*`` for several tasks)."""
    out: dict[str, Any] = {}
    for name, config in configs.items():
        prefix = "regularizer." if len(configs) == 1 else f"regularizer.{name}."
        schedule = config.regularizer()
        out.update({f"{prefix}{key}": value for key, value in schedule.model_dump().items()})
        out[f"{prefix}source"] = "reference_scaled" if config.train.regularizer is None else "config"
    return out


def compile_params(configs: dict[str, RunConfig]) -> dict[str, Any]:
    """The mode each task of the trial trains in, ``compiled`` or ``eager``, as ``compile``
    resolves it on this worker's device (`service.training.trainer.compile_mode`), logged
    as ``compile_mode`` (``compile_mode.<task>`` for several tasks)."""
    from service.training.trainer import compile_mode

    out: dict[str, Any] = {}
    for name, config in configs.items():
        try:
            out["compile_mode" if len(configs) == 1 else f"compile_mode.{name}"] = compile_mode(config)
        except ValueError:  # a device torch does not see: the trial fails in its own run, recorded there
            pass
    return out
