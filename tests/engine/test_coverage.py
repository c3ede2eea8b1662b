"""Which runs the engine trains, and the torch path's one-line notice for the others."""

import pytest

from service.config import RunConfig
from service.engine import attach, engine_gap
from service.training import Trainer


def config(task: dict, layers: list[str] | None = None, **train) -> RunConfig:
    model = {} if layers is None else {"layers": [{"unit": u} for u in layers]}
    return RunConfig.model_validate({"task": task, "model": model, "train": {"steps": 10, **train},
                                     "seeds": 2, "device": "cpu", "compile": "off"})


@pytest.mark.parametrize("operation", ["add", "sub", "mul", "div", "squared", "root"])
def test_covers_the_papers_arithmetic_models(operation: str) -> None:
    assert engine_gap(config({"kind": "arithmetic", "operation": operation})) is None


@pytest.mark.parametrize("layers", [["nau", "nmu"], ["nac_add", "nac_mul"], ["linear", "linear"],
                                    ["reg_linear", "nau"], ["nac_add", "nac_add"]])
def test_covers_small_mul_models(layers: list[str]) -> None:
    assert engine_gap(config({"kind": "small_mul"}, layers)) is None


@pytest.mark.parametrize("change, reason", [
    ({"layers": ["nalu", "nalu"]}, "the unit nalu as first layer"),
    ({"layers": ["nau", "npu"]}, "the unit npu as second layer"),
    ({"optimizer": {"name": "rmsprop"}}, "the optimiser rmsprop"),
    ({"clip": {"mode": "norm"}}, "clip mode norm"),
    ({"reinit": {"enabled": True}}, "re-initialisation"),
    ({"regularizer": {"shape": "exponential", "lambda_max": 1, "t_start": 0, "t_end": 5}},
     "the exponential regulariser schedule"),
])
def test_names_what_it_does_not_cover(change: dict, reason: str) -> None:
    layers = change.pop("layers", None)
    assert engine_gap(config({"kind": "small_mul"}, layers, **change)) == reason


def test_other_tasks_and_widths_are_not_covered() -> None:
    assert engine_gap(config({"kind": "identity"})) is not None
    wide = RunConfig.model_validate({"task": {"kind": "small_mul"}, "model": {"hidden_size": 3}})
    assert engine_gap(wide) == "a model other than two layers I -> 2 -> 1"


def test_an_uncovered_run_stays_on_the_torch_path_with_a_one_line_notice() -> None:
    trainer = Trainer(config({"kind": "small_mul"}, ["nalu", "nalu"]))
    lines: list[str] = []
    assert attach(trainer, notice=lines.append) is False
    assert trainer.engine is None
    assert len(lines) == 1 and "\n" not in lines[0] and "torch path" in lines[0]


def test_sweeps_use_the_engine_on_a_gpu_only(monkeypatch) -> None:
    from service.engine import attach_on_gpu

    lines: list[str] = []
    assert attach_on_gpu(Trainer(config({"kind": "small_mul"})), notice=lines.append) is False
    assert lines == []  # a CPU run is the torch path's without a word
    monkeypatch.setenv("NALU_SWEEP_ENGINE", "0")
    gpu = config({"kind": "small_mul"}).model_copy(update={"device": "auto"})
    assert attach_on_gpu(Trainer(gpu), notice=lines.append) is False and lines == []


def test_a_pack_prepares_each_trainer_it_builds() -> None:
    from service.training.packing import PackedTrainer

    members = [config({"kind": "small_mul"}), config({"kind": "small_mul"}).model_copy(update={"seed_offset": 2})]
    seen: list[Trainer] = []
    PackedTrainer(members, prepare=seen.append).run()
    assert len(seen) == 1 and seen[0].num_seeds == 4
