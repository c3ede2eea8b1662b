"""The native CPU step (`service.training.cpu_step`) trains exactly the eager torch step:
the same parameters, optimiser state, divergence and history, bit for bit, over the
structures it covers (operations, batch and input sizes, regulariser schedules, packs with
per-seed settings, Adam past its bias table, a diverging seed), alone or among others; a
run without its kernels (``NALU_SWEEP_NATIVE=0``) gets the same digest; `compile: auto`
never compiles a covered run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from service.config import RunConfig
from service.training import Trainer, cpu_step
from service.training.device import compile_mode

ROOT = Path(__file__).resolve().parents[2]


def _config(operation="mul", seeds=3, task=None, model=None, **train) -> RunConfig:
    train = {"steps": 120, "batch_size": 32, "eval_every": 40,
             "regularizer": {"lambda_max": 10, "t_start": 20, "t_end": 80}, **train}
    return RunConfig.model_validate({
        "task": {"kind": "arithmetic", "operation": operation, "eval_samples": 200,
                 "threshold_samples": 20_000, **(task or {})},
        "model": model or {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
        "train": train, "seeds": seeds, "device": "cpu"})


def _native_or_skip():
    if not cpu_step.available():
        pytest.skip("no native CPU step here (no C compiler or no AVX2/FMA)")


def _state(tr: Trainer) -> dict[str, torch.Tensor]:
    out = {f"param{i}": p.detach().clone() for i, p in enumerate(tr.params)}
    for i, st in enumerate(tr.optimizer.state):
        out.update({f"m{i}": st[0].clone(), f"v{i}": st[1].clone()})
    out.update(steps=tr.optimizer.steps.clone(), powers=tr.optimizer.powers.clone(), alive=tr.alive.clone(),
               diverged_at=tr.diverged_at.clone())
    return out


def _same(a: dict, b: dict) -> None:
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs in {int((a[k] != b[k]).sum())} elements"


def _both(members: list[RunConfig]):
    """(native, eager torch) trainers of ``members`` after their whole run, with results."""
    native = Trainer(members[0], members=members)
    assert native.cpu_steps is not None and not native.compiled
    eager = Trainer(members[0], members=members)
    eager.cpu_steps = None  # the torch step (the native layers inside it give the fallback's bits)
    return (native, native.run()), (eager, eager.run())


@pytest.mark.parametrize("config", [
    _config(),
    _config("add", batch_size=100),
    _config("sub", task={"input_size": 37}, batch_size=13),
    _config("div", task={"interpolation": {"intervals": [[1.0, 2.0]]}}, batch_size=24),
    _config("squared"),
    _config("root", task={"interpolation": {"intervals": [[1.0, 2.0]]}}),
    _config(regularizer={"lambda_max": 3, "t_start": 30, "t_end": 30, "shape": "constant"}),
    _config(seeds=1, optimizer={"lr": 0.05, "betas": [0.5, 0.6]}),  # past Adam's bias table (t ≈ 50)
    _config(task={"interpolation": {"intervals": [[1e9, 1e10]]}}),  # the loss overflows: seeds diverge
], ids=["mul", "add-B100", "sub-I37-B13", "div", "squared", "root", "constant-lambda", "past-bias-table",
        "diverging"])
def test_the_native_step_trains_the_eager_steps_bits(config):
    _native_or_skip()
    (native, rn), (eager, re) = _both([config])
    _same(_state(native), _state(eager))
    assert rn.params_sha256 == re.params_sha256
    assert (rn.history.interpolation_mse == re.history.interpolation_mse).all()
    if config.task.interpolation.intervals[0][0] > 1e6:
        assert not bool(native.alive.any()) and bool((native.diverged_at == 0).all())


def test_a_pack_with_per_seed_settings_and_mixed_operations():
    _native_or_skip()
    members = [_config(seeds=2), _config("add", seeds=1, optimizer={"lr": 0.01}),
               _config(seeds=2, optimizer={"betas": [0.8, 0.99]},
                       regularizer={"lambda_max": 1, "t_start": 0, "t_end": 60})]
    (native, rn), (eager, re) = _both(members)
    _same(_state(native), _state(eager))
    # a seed's numbers are its own: the third member trained alone gives its rows
    alone = Trainer(members[2])
    alone.run()
    for a, p in zip(alone.params, native.params):
        assert torch.equal(a, p[3:])


def test_steps_one_at_a_time_or_many_per_call_are_the_same(monkeypatch):
    """One call for 50 steps, 50 calls of one, and 50 steps cut into calls of at most
    7 seed·steps (`SEED_STEPS_PER_CALL`, which keeps Ctrl-C responsive) train the same bits."""
    _native_or_skip()
    a, b, c = Trainer(_config()), Trainer(_config()), Trainer(_config())
    a.train_steps(50)
    for _ in range(50):
        b.train_step()
    monkeypatch.setattr(cpu_step, "SEED_STEPS_PER_CALL", 7)
    c.train_steps(50)
    _same(_state(a), _state(b))
    _same(_state(a), _state(c))


def test_any_number_of_threads_trains_the_same_bits():
    """The seeds are split into contiguous ranges, one per torch thread, each range its own
    native call: 1, 2 and 3 threads (5 seeds: ranges of 5; 2 and 3; 1, 2 and 2) give the
    same bits."""
    _native_or_skip()
    before = torch.get_num_threads()
    states = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            tr = Trainer(_config(seeds=5))
            tr.train_steps(60)
            states.append(_state(tr))
    finally:
        torch.set_num_threads(before)
    _same(states[0], states[1])
    _same(states[0], states[2])


def test_which_runs_it_covers():
    assert cpu_step.gap(_config()) is None
    cases = {
        "a model other than nau -> nmu": _config(model={"layers": [{"unit": "nau"}, {"unit": "nau"}]}),
        "clip mode norm": _config(clip={"mode": "norm"}),
        "re-initialisation": _config(reinit={"enabled": True}),
        "the loss smooth_l1": _config(loss="smooth_l1"),
        "the optimiser sgd": _config(optimizer={"name": "sgd"}),
        "the learning-rate schedule cosine": _config(optimizer={"lr_schedule": "cosine"}),
        "a shared batch": _config(shared_batch=True),
    }
    for reason, config in cases.items():
        assert cpu_step.gap(config) == reason
    long = _config(steps=50_000, eval_every=1000)
    assert compile_mode(long) == "eager"  # covered: never compiled, with or without the kernels
    assert compile_mode(_config(steps=50_000, eval_every=1000, clip={"mode": "norm"})) == "compiled"
    assert compile_mode(long.model_copy(update={"compile": "on"})) == "compiled"


_RUN = """
import json, sys
from service.config import RunConfig
from service.training import Trainer
tr = Trainer(RunConfig.model_validate(json.loads(sys.argv[1])))
result = tr.run()
print(json.dumps({"digest": result.params_sha256, "native": tr.cpu_steps is not None}))
"""


@pytest.mark.slow
def test_without_the_kernels_the_same_digest():
    _native_or_skip()
    config = _config(seeds=4, steps=200).model_dump(mode="json")
    out = {}
    for flag in ("1", "0"):
        proc = subprocess.run([sys.executable, "-c", _RUN, json.dumps(config)], cwd=ROOT, capture_output=True,
                              text=True, timeout=600, check=True, env={**os.environ, "NALU_SWEEP_NATIVE": flag})
        out[flag] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["1"]["native"] and not out["0"]["native"]
    assert out["1"]["digest"] == out["0"]["digest"]
