"""Packed runs: K configurations of one structure trained as one seed batch, each member
bit-identical to the same configuration trained alone (issue 17)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from service.config import RunConfig
from service.pack_structure import packable_path, structure_key
from service.training import Trainer
from service.training.packing import (PackedTrainer, merge_checkpoints, padding_members, seed_bucket,
                                      split_checkpoint)


def _member(lr: float = 1e-2, *, seeds: int = 3, master_seed: int = 0, optimizer: str = "adam",
            layers=None, train=None, compile: str = "off", operation: str = "mul", **extra) -> RunConfig:
    base_train = {"steps": 120, "batch_size": 16, "eval_every": 40,
                  "optimizer": {"name": optimizer, "lr": lr}, "clip": {"mode": "norm", "max": 1.0},
                  "regularizer": {"lambda_max": 1.0, "t_start": 30, "t_end": 90}}
    for key, value in (train or {}).items():
        base_train[key] = {**base_train[key], **value} if isinstance(value, dict) and key in base_train else value
    return RunConfig.model_validate({
        "task": {"kind": "arithmetic", "operation": operation, "eval_samples": 600, "threshold_samples": 5_000},
        "model": {"layers": layers or [{"unit": "nau"}, {"unit": "nmu"}]},
        "train": base_train, "seeds": seeds, "master_seed": master_seed,
        "device": "cpu", "compile": compile, **extra,
    })


def _assert_same(alone, packed) -> None:
    """Two results of one configuration: the same metrics, history, weights and digest."""
    assert packed is not None
    assert packed.params_sha256 == alone.params_sha256
    assert [s.model_dump_json() for s in packed.seeds] == [s.model_dump_json() for s in alone.seeds]
    assert packed.aggregate == alone.aggregate
    assert np.array_equal(packed.history.steps, alone.history.steps)
    assert np.array_equal(packed.history.interpolation_mse, alone.history.interpolation_mse, equal_nan=True)
    for name, v in alone.history.extrapolation_mse.items():
        assert np.array_equal(packed.history.extrapolation_mse[name], v, equal_nan=True)
    for name, w in alone.weights.items():
        assert np.array_equal(packed.weights[name], w, equal_nan=True)
    assert packed.config == alone.config


def _assert_pack_equals_alone(members: list[RunConfig]) -> list:
    results = PackedTrainer(members).run()
    for member, packed in zip(members, results, strict=True):
        _assert_same(Trainer(member).run(), packed)
    return results


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop", "sgd"])
def test_packed_members_train_as_they_do_alone(optimizer):
    """Members differing in lr, betas/alpha/momentum, eps, λ_max, schedule times, seed
    counts and master seeds: each is bit-identical to its own run alone."""
    members = [
        _member(1e-2, optimizer=optimizer),
        _member(3e-2, seeds=2, master_seed=7, optimizer=optimizer,
                train={"optimizer": {"betas": (0.8, 0.99), "alpha": 0.9, "momentum": 0.5, "eps": 1e-6},
                       "regularizer": {"lambda_max": 5.0, "t_start": 10, "t_end": 60}}),
        _member(5e-3, seeds=4, optimizer=optimizer,
                train={"regularizer": {"shape": "linear", "lambda_max": 0.1, "t_start": 0, "t_end": 20}}),
    ]
    assert len({structure_key(m) for m in members}) == 1
    results = _assert_pack_equals_alone(members)
    assert results[0].params_sha256 != results[2].params_sha256  # the settings did change something


def test_packed_gate_temperatures_gate_biases_and_lr_schedules():
    """NALU with a temperature schedule and a bias gate, a cosine learning rate: per-seed
    τ(t), gate-bias inits and lr(t) give each member its own trajectory, as alone."""
    def nalu(tau_start, bias, lr):
        layers = [{"unit": "nalu", "options": {"gate": "bias", "tau_schedule": "linear", "tau_start": tau_start,
                                               "tau_end": 2.0, "tau_t1": 100, "gate_bias_init": bias}},
                  {"unit": "nalu", "options": {"gate": "bias", "tau_schedule": "linear", "tau_start": tau_start,
                                               "tau_end": 2.0, "tau_t1": 100, "gate_bias_init": bias}}]
        return _member(lr, layers=layers, train={"optimizer": {"lr_schedule": "cosine", "lr_min": lr / 10}})

    _assert_pack_equals_alone([nalu(0.2, 0.0, 1e-2), nalu(0.7, -1.0, 3e-2)])


def test_packed_uniform_init_bounds():
    members = [_member(layers=[{"unit": "nau", "init": f"uniform(-{r}, {r})"}, {"unit": "nmu"}]) for r in (0.1, 0.9)]
    assert structure_key(members[0]) == structure_key(members[1])
    _assert_pack_equals_alone(members)


@pytest.mark.parametrize("shared_batch", [False, True])
def test_the_operation_is_a_per_seed_setting(shared_batch):
    """A model's four operations train as one seed batch: each member with its own targets,
    evaluation targets and thresholds, exactly as alone."""
    members = [_member(lr, seeds=n, master_seed=i, operation=op, train={"shared_batch": shared_batch})
               for i, (op, lr, n) in enumerate([("add", 1e-2, 2), ("sub", 2e-2, 1), ("mul", 1e-2, 3), ("div", 5e-3, 2)])]
    assert len({structure_key(m) for m in members}) == 1
    results = _assert_pack_equals_alone(members)
    assert len({json.dumps(r.thresholds, sort_keys=True) for r in results}) == 4
    assert [r.config.task.operation for r in results] == ["add", "sub", "mul", "div"]


def test_operations_whose_default_models_differ_do_not_pack():
    def config(op: str) -> RunConfig:
        return RunConfig.model_validate({"task": {"kind": "arithmetic", "operation": op}})

    assert structure_key(config("add")) == structure_key(config("sub"))  # NAU → NAU both
    assert structure_key(config("add")) != structure_key(config("mul"))  # NAU → NMU
    assert structure_key(config("mul")) != structure_key(
        RunConfig.model_validate({"task": {"kind": "arithmetic", "operation": "mul", "input_size": 50}}))


@pytest.mark.slow
def test_packed_members_compiled_train_as_they_do_alone():
    members = [_member(1e-2, compile="on"), _member(4e-2, seeds=2, compile="on", operation="div",
                                                    train={"optimizer": {"betas": (0.7, 0.95)}})]
    _assert_pack_equals_alone(members)


def test_a_dropped_member_stops_and_the_others_go_on_unchanged():
    """Dropping member 1 at step 40 (a pruned trial): it gets no result and no later
    evaluation; members 0 and 2 end exactly as alone."""
    members = [_member(1e-2), _member(2e-2), _member(4e-2, seeds=2)]
    packed = PackedTrainer(members)
    seen: list[tuple[int, int]] = []

    def on_eval(evals):
        seen.extend((e.index, e.report.step) for e in evals)
        if evals[0].report.step == 40:
            packed.drop([1])

    results = packed.run(on_eval)
    assert results[1] is None and packed.active == [0, 2]
    assert (1, 40) in seen and (1, 80) not in seen and (2, 120) in seen
    for index in (0, 2):
        _assert_same(Trainer(members[index]).run(), results[index])


def test_member_checkpoints_are_the_members_own():
    """A pack's checkpoint split per member resumes each member alone to the same end as
    an uninterrupted run, and the members' checkpoints merge back into the pack's."""
    members = [_member(1e-2), _member(3e-2, seeds=2, master_seed=3)]
    taken = {}

    def on_eval(evals):
        for e in evals:
            if e.report.checkpoint is not None:
                taken[e.index] = e.report.checkpoint

    PackedTrainer(members).run(on_eval, checkpoint_every=1)
    assert set(taken) == {0, 1}
    for index, member in enumerate(members):
        resumed = Trainer(member).run(resume_from=taken[index])
        _assert_same(Trainer(member).run(), resumed)
    resumed_pack = PackedTrainer(members).run(resume_from=[taken[0], taken[1]])
    for member, result in zip(members, resumed_pack):
        _assert_same(Trainer(member).run(), result)


def test_split_and_merge_are_inverse():
    members = [_member(1e-2, seeds=2), _member(3e-2, seeds=3)]
    trainer = Trainer(members[0], members=members)
    trainer.train_steps(5)
    trainer.evaluate()
    ckpt = trainer.checkpoint()
    merged = merge_checkpoints(split_checkpoint(ckpt, members), members)
    assert merged.config_fingerprint == ckpt.config_fingerprint and merged.seed_ids == ckpt.seed_ids
    for k, v in ckpt.model.items():
        assert torch.equal(merged.model[k], v)
    assert torch.equal(merged.optimizer_powers, ckpt.optimizer_powers)


def test_structure_keys_and_packable_paths():
    assert structure_key(_member(1e-2)) == structure_key(_member(0.3, seeds=7, master_seed=2))
    assert structure_key(_member()) != structure_key(_member(layers=[{"unit": "nac_add"}, {"unit": "nmu"}]))
    assert structure_key(_member()) != structure_key(_member(optimizer="sgd"))
    assert structure_key(_member()) != structure_key(_member(train={"steps": 121}))
    assert structure_key(_member()) != structure_key(
        _member(layers=[{"unit": "nau", "init": "xavier_uniform"}, {"unit": "nmu"}]))
    with pytest.raises(ValueError, match="cannot train as one pack"):
        PackedTrainer([_member(), _member(train={"batch_size": 8})])
    for path in ("train.optimizer.lr", "train.optimizer.betas.1", "train.regularizer.lambda_max",
                 "train.regularizer.t_end", "model.layers.0.options.tau_start", "model.layers.*.options.gate_bias_init"):
        assert packable_path(path), path
    for path in ("train.optimizer.name", "train.steps", "model.layers.0.unit", "model.layers.0.options.gate",
                 "model.hidden_size", "train.regularizer.shape", "seeds"):
        assert not packable_path(path), path


def test_seed_buckets_and_padding_rows():
    """A compiled pack trains the next power of two of seed rows, the extra rows copies of
    its members' first seeds (`padding_members`)."""
    assert [seed_bucket(n) for n in (1, 2, 3, 5, 8, 9, 100, 128)] == [1, 2, 4, 8, 8, 16, 128, 128]
    members = [_member(seeds=3), _member(2e-2, seeds=2, master_seed=4)]
    assert padding_members(members, 5) == []
    assert [p.seeds for p in padding_members(members, 8)] == [3]
    pads = padding_members(members, 16)
    assert [p.seeds for p in pads] == [3, 2, 3, 2, 1]
    for i, pad in enumerate(pads):
        member = members[i % 2]
        assert pad.seed_ids == member.seed_ids[:pad.seeds]
        assert pad.model_copy(update={"seeds": member.seeds}) == member


@pytest.mark.slow
def test_packs_of_changing_sizes_reuse_the_compiled_step():
    """Compiled packs of 6 and 8 seeds, and the 8 after a member is dropped (6 again),
    all train 8 rows: one compilation for all (dynamo's counters), and each member ends
    bit-identical to itself alone (compiled, unpadded)."""
    from torch._dynamo.utils import counters

    short = {"steps": 40, "eval_every": 20}
    a = _member(1e-2, compile="on", train=short)
    b = _member(3e-2, seeds=2, master_seed=3, compile="on", train=short)
    c = _member(2e-2, master_seed=5, compile="on", train=short)
    alone = {m.master_seed: Trainer(m).run() for m in (a, c)}  # 3 seeds each, not padded

    first = PackedTrainer([a, c])
    graphs_before = counters["stats"]["unique_graphs"]
    results = first.run()
    assert first.trainer is not None and first.trainer.num_seeds == 8
    graphs = counters["stats"]["unique_graphs"]
    assert graphs - graphs_before <= 1  # none when an earlier test compiled this shape
    for m, r in zip((a, c), results):
        _assert_same(alone[m.master_seed], r)

    packed = PackedTrainer([a, b, c])

    def on_eval(evals):
        if evals[0].report.step == 20:
            packed.drop([1])

    results = packed.run(on_eval)
    assert packed.trainer is not None and packed.trainer.num_seeds == 8 and packed.active == [0, 2]
    assert results[1] is None
    assert counters["stats"]["unique_graphs"] == graphs, "a pack of another size compiled again"
    _assert_same(alone[a.master_seed], results[0])
    _assert_same(alone[c.master_seed], results[2])
