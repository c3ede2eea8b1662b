"""Which run configurations can train as one pack, decided from the configs alone.

The members of a pack share their structure — task, units, categorical options, steps,
batch, loss, clipping, device and compile mode — and may differ only in the continuous settings the trainer holds
per seed (`service.training.seed_settings`) and in the task fields that set the target alone
(a task's ``PACKABLE``: the arithmetic task's operation). The sweep's driver groups trials by these
rules without loading torch; the trainer checks a pack with the same ones.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Sequence

from service.config import RunConfig
from service.units.init import parse_init
from service.units.options import UNIT_OPTIONS, unit_names, unit_options

OPTIMIZER_FIELDS = frozenset({"lr", "lr_min", "betas", "eps", "momentum", "alpha"})
"""`OptimizerConfig` fields that may differ per seed."""
REGULARIZER_FIELDS = frozenset({"lambda_max", "t_start", "t_end", "oob"})
"""`RegularizerSchedule` fields that may differ per seed (whether ``oob`` is 0 may not)."""
_RUN_FIELDS = ("seeds", "seed_offset", "master_seed")
"""Run-config fields that are per member (seed ids and streams). ``device``, ``compile``
and ``cuda_graphs`` are structure: a pack runs in one mode, so its members must be ones
that would run in that mode alone (compiled and eager steps round differently)."""


def packable_options() -> frozenset[str]:
    """Unit option names that may differ per seed (each unit's ``Options.PACKABLE``)."""
    return frozenset().union(*(UNIT_OPTIONS[name].PACKABLE for name in unit_names()))


_LAYER_OPTION = re.compile(r"^model\.layers\.(\d+|\*)\.options\.([A-Za-z_]\w*)$")


def packable_path(path: str) -> bool:
    """Whether a run-config path (a search parameter's ``target``) names a continuous
    setting that members of one pack may differ in."""
    parts = path.split(".")
    if parts[:2] == ["train", "optimizer"] and len(parts) in (3, 4):
        return parts[2] in OPTIMIZER_FIELDS and (len(parts) == 3 or (parts[2] == "betas" and parts[3] in "01"))
    if parts[:2] == ["train", "regularizer"] and len(parts) == 3:
        return parts[2] in REGULARIZER_FIELDS
    m = _LAYER_OPTION.match(path)
    return bool(m) and m.group(2) in packable_options()


def packable(config: RunConfig) -> bool:
    """Recurrent tasks train with their own trainer, which does not pack."""
    return not getattr(config.task, "recurrent", False)


def structure_key(config: RunConfig) -> str:
    """Configurations with equal keys can train as one packed computation: SHA-256 of the
    configuration with the per-seed settings and the per-member fields left out (the
    layers resolved, the regulariser schedule the effective one). A recurrent task's key
    is its whole configuration, so it packs with nothing but itself."""
    data = config.model_dump(mode="json")
    if packable(config):
        for key in _RUN_FIELDS:
            data.pop(key, None)
        data["task"] = {k: v for k, v in data["task"].items() if k not in type(config.task).PACKABLE}
        train = data["train"]
        train["optimizer"] = {k: v for k, v in train["optimizer"].items() if k not in OPTIMIZER_FIELDS}
        schedule = config.regularizer()
        train["regularizer"] = {"shape": schedule.shape, "oob": schedule.oob > 0}
        layers = []
        for layer in config.layers():
            options_cls = unit_options(layer.unit)
            options = options_cls(**layer.options).model_dump(mode="json")
            layers.append({"unit": layer.unit, "init": parse_init(layer.init).kind,
                           "options": {k: v for k, v in options.items() if k not in options_cls.PACKABLE}})
        data["model"] = {"layers": layers, "hidden_size": config.model.hidden_size}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def check_pack(configs: Sequence[RunConfig]) -> None:
    """A clear error unless ``configs`` can train as one pack."""
    if not configs:
        raise ValueError("a pack needs at least one configuration")
    if len(configs) > 1 and not all(packable(c) for c in configs):
        raise ValueError("recurrent tasks do not pack: train each configuration on its own")
    keys = {structure_key(c) for c in configs}
    if len(keys) > 1:
        raise ValueError("these configurations differ in more than their continuous settings "
                         "(units, options, task, steps, …) and cannot train as one pack")
