"""``compile: auto`` decides from the device and the run's length only (issue 33): a seed
trains in the same mode alone, among 64 or packed, so it stays bit-identical."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from service.config import RunConfig
from service.pack_structure import check_pack
from service.training import Trainer
from service.training.packing import PackedTrainer
from service.training.device import CPU_COMPILE_FROM_STEPS, compile_mode, compile_pays_off


def _issue_config(steps: int, seeds: int, seed_offset: int = 0, **extra) -> RunConfig:
    """``nalu-sweep run --task arithmetic --operation mul --units nau,nmu --steps N`` with
    the CLI's defaults otherwise (`service.cli.run`)."""
    return RunConfig.model_validate({
        "task": {"kind": "arithmetic", "operation": "mul"},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
        "train": {"steps": steps}, "seeds": seeds, "seed_offset": seed_offset, **extra})


def _old_rule(steps: int, seeds: int) -> bool:
    """The decision before issue 33: compile when steps × (0.8 ms + 5 µs × S) ≥ 25 s."""
    return steps * (0.8e-3 + 5e-6 * seeds) >= 25.0


def test_auto_decides_from_device_and_length_not_from_seeds():
    cpu = torch.device("cpu")
    assert not compile_pays_off(cpu, CPU_COMPILE_FROM_STEPS - 1) and compile_pays_off(cpu, CPU_COMPILE_FROM_STEPS)
    assert compile_pays_off(torch.device("cuda"), 10)
    # 25,000 steps (the issue's run) and the shortest run the old rule compiled for 64
    # seeds but not for one: each seed count gets the same mode now
    shortest = next(n for n in range(20_000, 40_000) if _old_rule(n, 64) and not _old_rule(n, 1))
    # (the issue's run itself, NAU -> NMU with Adam, is the native CPU step's: never compiled
    # at any length; with gradient clipping it is not, and compiles from 20,000 steps)
    for steps in (1_000, shortest, 25_000, 40_000):
        for clip, compiles in (({}, False), ({"clip": {"mode": "norm"}}, steps >= CPU_COMPILE_FROM_STEPS)):
            modes = set()
            for seeds, offset in ((1, 7), (64, 0)):
                config = _issue_config(steps, seeds, offset, device="cpu")
                config = RunConfig.model_validate({**config.model_dump(), "train": {**config.train.model_dump(), **clip}})
                trainer = Trainer(config)  # construction only: compiling happens at the first step
                assert compile_mode(config) == ("compiled" if trainer.compiled else "eager")
                modes.add(trainer.compiled)
            assert modes == {compiles}, (steps, clip)


def test_explicit_modes_and_recurrent_tasks():
    assert compile_mode(_issue_config(10, 1, compile="on", device="cpu")) == "compiled"
    assert compile_mode(_issue_config(10**6, 64, compile="off", device="cpu")) == "eager"
    recurrent = RunConfig.model_validate({"task": {"kind": "sequence_arithmetic", "operation": "sum"},
                                          "train": {"steps": 10**6}, "device": "cpu"})
    assert compile_mode(recurrent) == "eager" and not Trainer(recurrent).compiled  # auto, CPU: eager
    assert compile_mode(recurrent.model_copy(update={"compile": "on"})) == "compiled"
    assert compile_pays_off(torch.device("cuda"), 10, recurrent=True)  # a GPU step is launch-bound
    assert not compile_pays_off(torch.device("cpu"), 10**7, recurrent=True)


def test_a_pack_holds_only_members_of_one_mode():
    """Members that would run in different modes (or on different devices) alone do not
    pack: the pack would run them all in the first one's mode."""
    base = _issue_config(100, 2, device="cpu", compile="off")
    check_pack([base, base.model_copy(update={"seed_offset": 2})])
    for other in ({"compile": "on"}, {"compile": "auto"}, {"device": "auto"}):
        with pytest.raises(ValueError, match="cannot train as one pack"):
            PackedTrainer([base, base.model_copy(update={"seed_offset": 2, **other})])


def test_a_packed_member_with_default_flags_trains_as_alone():
    small = {"eval_samples": 200, "threshold_samples": 20_000}
    members = [_issue_config(300, 3, 0, task={"kind": "arithmetic", "operation": "mul", **small}),
               _issue_config(300, 2, 7, task={"kind": "arithmetic", "operation": "mul", **small},
                             train={"steps": 300, "optimizer": {"lr": 3e-2}})]
    packed = PackedTrainer(members).run()
    for member, got in zip(members, packed):
        alone = Trainer(member).run()
        assert got is not None and got.compiled == alone.compiled
        assert got.params_sha256 == alone.params_sha256
        assert [s.model_dump_json() for s in got.seeds] == [s.model_dump_json() for s in alone.seeds]


@pytest.mark.slow
def test_seed_7_alone_and_among_64_with_default_flags_at_25000_steps():
    """The issue's run, default flags (``compile: auto``): seed 7 alone and among 64 end
    with the same bits, final weights and every metric."""
    alone = Trainer(_issue_config(25_000, 1, 7, device="cpu"))
    among = Trainer(_issue_config(25_000, 64, 0, device="cpu"))
    assert alone.compiled == among.compiled
    a, b = alone.run(), among.run()
    assert a.compiled == b.compiled
    for name, w in a.weights.items():
        assert np.array_equal(b.weights[name][7:8], w), name
    assert b.seeds[7].model_dump_json() == a.seeds[0].model_dump_json()
    assert np.array_equal(b.history.interpolation_mse[:, 7], a.history.interpolation_mse[:, 0], equal_nan=True)


def test_collection_is_paused_for_a_capture():
    """A CUDA graph capture runs with automatic garbage collection off (a collection could
    free a dead trainer's graph inside it, issue 35) and restores the setting after."""
    from service.training.graphs import collection_paused

    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
