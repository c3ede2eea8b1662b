"""Search-space files: the shipped ones load; each kind of mistake names file, key and fix."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from service.search.loading import load_space, parse_space, with_overrides
from service.search.space import SearchSpaceError

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"
SHIPPED = sorted(SPACES.glob("*.yaml"))


def test_the_required_spaces_are_shipped():
    names = {p.stem for p in SHIPPED}
    assert {"nalu_gates", "nau_nmu_regularizer", "initializations", "optimizer_study", "smoke"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_space_loads(path):
    space = load_space(path)
    assert space.name == path.stem
    assert space.trials >= 1 and space.seeds >= 1 and space.params


def test_smoke_space_is_small():
    space = load_space(SPACES / "smoke.yaml")
    assert space.seeds * space.steps * space.trials * len(space.task_configs()) <= 100_000


def _good() -> dict:
    return yaml.safe_load((SPACES / "smoke.yaml").read_text())


def _error(mutate) -> str:
    data = _good()
    mutate(data)
    with pytest.raises(SearchSpaceError) as info:
        parse_space(copy.deepcopy(data), source="spaces/x.yaml")
    return str(info.value)


def _set(path: str, value):
    def mutate(data):
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    return mutate


def _drop(path: str):
    def mutate(data):
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        del node[last]
    return mutate


MISTAKES = [
    # (id, mutation, expected text: file, key and what is allowed)
    ("loguniform-low", _set("params.lr.low", 0), "spaces/x.yaml: params.lr.low: must be > 0"),
    ("low-above-high", _set("params.lr.low", 0.5), "params.lr: low (0.5) must be < high (0.3)"),
    ("unknown-distribution", _set("params.lr.type", "logunifrom"),
     "params.lr.type: unknown distribution 'logunifrom'; allowed: loguniform, uniform, int, categorical"),
    ("missing-type", _drop("params.lr.type"), "params.lr.type: missing 'type'"),
    ("unknown-top-key", _set("stepz", 3), "stepz: unknown key; did you mean 'steps'? allowed: name, description, task"),
    ("unknown-param-key", _set("params.lr.hihg", 3), "params.lr.hihg: unknown key; did you mean 'high'? allowed: target, when"),
    ("when-unknown-param", _set("params.momentum.when", {"optimiser": "sgd"}),
     "params.momentum.when: refers to 'optimiser', which is not a parameter; parameters: lr, optimizer"),
    ("when-unknown-choice", _set("params.momentum.when", {"optimizer": "sgdd"}),
     "params.momentum.when.optimizer: 'sgdd' is not a choice of 'optimizer'; choices: adam, rmsprop, sgd"),
    ("when-self", _set("params.momentum.when", {"momentum": 0.5}), "a parameter cannot depend on itself"),
    ("target-top-level", _set("params.lr.target", "trian.optimizer.lr"),
     "params.lr.target: 'trian.optimizer.lr': unknown top-level field 'trian'; allowed: model, train"),
    ("target-unknown-field", _set("params.lr.target", "train.optimizer.lrate"),
     "params.lr: 0.01 gives an invalid run config: train.optimizer.lrate: unknown key; allowed: name, lr"),
    ("target-missing-layer", _set("params.nau_init.target", "model.layers.5.init"),
     "params.nau_init.target: model.layers.5: index 5 is out of range (the list has 2 items)"),
    ("unknown-unit-choice", _set("params.unit", {"type": "categorical", "choices": ["nau", "nalux"],
                                                 "target": "model.layers.0.unit"}),
     "params.unit: 'nalux' gives an invalid run config: model.layers.0: unknown unit 'nalux'; valid units:"),
    ("unknown-init-choice", _set("params.nau_init.choices", ["default", "glorot"]),
     "params.nau_init: 'glorot' gives an invalid run config: model.layers.0: unknown initialisation 'glorot'"),
    ("option-of-other-unit", _set("params.gate", {"type": "categorical", "choices": ["standard"],
                                                  "target": "model.layers.0.options.gate"}),
     "unit 'nau' has no option 'gate'"),
    ("non-plain-choices", _set("params.nau_init.choices", [[1, 2], [3]]),
     "params.nau_init.choices: choices must be a list of plain values"),
    ("empty-choices", _set("params.nau_init.choices", []), "params.nau_init.choices: needs at least one choice"),
    ("unknown-task-kind", _set("task.kind", "small_mull"), "task: unknown task kind 'small_mull'; valid kinds:"),
    ("bad-task-range", _set("task.interpolation", "U[2,1]"), "task.interpolation: empty interval"),
    ("task-and-tasks", _set("tasks", {"a": {"kind": "small_mul"}}), "task: give exactly one of 'task'"),
    ("no-task", _drop("task"), "task: give exactly one of 'task'"),
    ("eval-every-above-steps", _set("eval_every", 5000), "eval_every: must be ≤ steps (2000), got 5000"),
    ("steps-in-fixed", _set("fixed.train.steps", 10), "fixed.train.steps: set 'steps' at the top level"),
    ("task-in-fixed", _set("fixed.task", {"kind": "small_mul"}), "fixed.task: set the task under 'task:'"),
    ("bad-fixed-value", _set("fixed.train.batch_size", 0), "fixed.train.batch_size: Input should be greater than or equal to 1"),
    ("unknown-fixed-key", _set("fixed.trian", {}), "fixed.trian: unknown key; did you mean 'train'? allowed: task, model, train"),
    ("bad-scheduler", _set("scheduler", {"type": "hyperband"}), "scheduler.type: Input should be 'asha', 'none' or 'race'"),
    ("race-key-for-asha", _set("scheduler", {"type": "asha", "first_block": 4}), "scheduler.first_block: only for 'type: race'"),
    ("race-bad-budget", _set("scheduler", {"type": "race", "first_block": 32, "max_seeds": 16}),
     "scheduler.max_seeds: max_seeds (16) must be at least first_block (32)"),
    ("race-searched-seeds", lambda d: [_set("scheduler", {"type": "race"})(d), _set("params.offset", {
        "type": "categorical", "choices": [0, 100], "target": "seed_offset"})(d)],
     "params.offset: targets seed_offset: a race compares settings on the same seeds"),
    ("negative-gpus", _set("resources.gpus", -1), "resources.gpus: Input should be greater than or equal to 0"),
    ("zero-seeds", _set("seeds", 0), "seeds: Input should be greater than or equal to 1"),
    ("no-steps", _drop("steps"), "steps: Field required"),
    ("grid-with-numbers", _set("sampler", "grid"), "params.lr: the grid sampler needs categorical parameters"),
    ("bad-name", _set("name", "my sweep!"), "name: not a valid sweep name: ASCII letters, digits"),
    ("cycle", lambda d: (d["params"]["momentum"].update(when={"lambda_max": 0.1}),
                         d["params"]["lambda_max"].update(when={"momentum": 0.5})),
     "conditions form a cycle: "),
    ("int-log-from-zero", _set("params.bs", {"type": "int", "low": 0, "high": 8, "log": True,
                                             "target": "train.batch_size"}), "params.bs.low: must be ≥ 1 when log: true"),
]


@pytest.mark.parametrize("mutate,expected", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_mistake_gives_clear_message(mutate, expected):
    message = _error(mutate)
    assert expected in message, message
    assert message.startswith("spaces/x.yaml: ")


def test_a_misspelt_required_key_is_one_line_that_names_the_right_key():
    """``choises`` for ``choices``: not first a misleading "choices must be a list" line."""
    def misspell(data):
        data["params"]["optimizer"]["choises"] = data["params"]["optimizer"].pop("choices")
    message = _error(misspell)
    assert message == ("spaces/x.yaml: params.optimizer.choises: unknown key; did you mean 'choices'? "
                       "allowed: target, when, description, type, choices"), message
    far = _error(_set("params.lr.zzz", 1))  # nothing close: no guess
    assert "did you mean" not in far and "params.lr.zzz: unknown key; allowed:" in far


def test_run_config_keys_suggest_the_closest(tmp_path):
    from pydantic import ValidationError

    from service.config import RunConfig
    from service.search.loading import describe_run_config_error

    data = {"task": {"kind": "small_mul"}, "train": {"stesp": 10}, "seedz": 3}
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate(data)
    text = describe_run_config_error(info.value, data, "run.yaml")
    assert "run.yaml: train.stesp: unknown key; did you mean 'steps'? allowed: steps" in text, text
    assert "run.yaml: seedz: unknown key; did you mean 'seeds'?" in text, text


def test_one_message_per_problem():
    message = _error(_set("task.kind", "small_mull"))
    assert len(message.splitlines()) == 1, message


@pytest.mark.parametrize("text,expected", [
    ("", "the file is empty"),
    ("- a\n- b\n", "the top level must be a mapping"),
    ("name: [unclosed\n", "not valid YAML"),
])
def test_file_level_mistakes(tmp_path, text, expected):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SearchSpaceError, match=expected):
        load_space(path)


def test_missing_file(tmp_path):
    with pytest.raises(SearchSpaceError, match="no such file"):
        load_space(tmp_path / "nope.yaml")


def test_overrides_are_validated_and_change_the_hash():
    space = load_space(SPACES / "smoke.yaml")
    more = with_overrides(space, trials=4, seeds=8, steps=1000)
    assert (more.trials, more.seeds, more.steps) == (4, 8, 1000)
    assert more.spec_hash() != space.spec_hash()
    assert with_overrides(space).spec_hash() == space.spec_hash()
    with pytest.raises(SearchSpaceError, match="cli: eval_every: must be ≤ steps"):
        with_overrides(space, "cli", steps=100)


def test_scheduler_reports_and_grace_period():
    space = load_space(SPACES / "smoke.yaml")  # 2000 steps, eval every 250, grace 1000
    assert space.reports_per_task() == 8
    assert space.grace_reports() == 4
    assert load_space(SPACES / "nalu_gates.yaml").total_reports() == 3 * 50


def test_grid_sampler_trials_cannot_exceed_grid():
    data = yaml.safe_load((SPACES / "initializations.yaml").read_text())
    data["trials"] = 49
    with pytest.raises(SearchSpaceError, match="the grid has 48 combinations"):
        parse_space(data)
