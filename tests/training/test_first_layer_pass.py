"""A CPU step draws the batch and applies a plain first layer in one pass
(`service.units.sampled_linear`) where the structure allows it, and trains exactly as the
step that draws first and applies the layer after: the same parameters, bit for bit,
eager and compiled."""

from __future__ import annotations

import pytest

from service.config import RunConfig
from service.training import Trainer
from service.units import sampled_linear


def _config(layers=("nau", "nmu"), compile="off", **train) -> RunConfig:
    return RunConfig.model_validate({
        "task": {"kind": "arithmetic", "operation": "mul", "eval_samples": 200, "threshold_samples": 20_000},
        "model": {"layers": [{"unit": u} for u in layers]},
        "train": {"steps": 40, "batch_size": 32, "eval_every": 20, **train},
        "seeds": 5, "device": "cpu", "compile": compile})


def _unfused(config: RunConfig, monkeypatch) -> Trainer:
    with monkeypatch.context() as m:
        m.setattr(Trainer, "_fuses_first_layer", lambda self: False)
        return Trainer(config)


def test_which_structures_take_the_one_pass():
    if not sampled_linear.available():
        pytest.skip("no native kernels here")
    assert Trainer(_config()).fuses_first_layer
    assert Trainer(_config(("linear", "nmu"))).fuses_first_layer
    assert not Trainer(_config(("nmu", "nau"))).fuses_first_layer  # not a plain product
    assert not Trainer(_config(("nalu", "nalu"))).fuses_first_layer
    assert not Trainer(_config(shared_batch=True)).fuses_first_layer  # one batch for all seeds
    assert not Trainer(_config().model_copy(update={"dtype": "float64"})).fuses_first_layer
    recurrent = RunConfig.model_validate({"task": {"kind": "sequence_arithmetic", "operation": "sum",
                                                   "eval_samples": 20},
                                          "train": {"steps": 10, "batch_size": 8, "eval_every": 10},
                                          "seeds": 2, "device": "cpu"})
    assert not Trainer(recurrent).fuses_first_layer


@pytest.mark.parametrize("compile", ["off", pytest.param("on", marks=pytest.mark.slow)])
def test_the_one_pass_trains_as_the_two(monkeypatch, compile):
    if not sampled_linear.available():
        pytest.skip("no native kernels here")
    config = _config(compile=compile)
    fused, apart = Trainer(config), _unfused(config, monkeypatch)
    assert fused.fuses_first_layer and not apart.fuses_first_layer
    a, b = fused.run(), apart.run()
    assert a.params_sha256 == b.params_sha256
    assert [s.model_dump() for s in a.seeds] == [s.model_dump() for s in b.seeds]
