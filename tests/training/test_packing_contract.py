"""What the sweep relies on from `service.training.packing.PackedTrainer` (whatever trains the
pack inside): every member's evaluations, checkpoints and result are those of its config
trained alone, a dropped member stops and the others go on unchanged, and a pack continues
from its members' checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from service.config import RunConfig
from service.pack_structure import packable, packable_path, structure_key
from service.sweep.trial import partial_aggregate
from service.training import Trainer
from service.training.packing import PackedTrainer


def _config(lr: float, **train) -> RunConfig:
    return RunConfig.model_validate({
        "task": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "seeds": 3, "device": "cpu", "compile": "off",
        "train": {"steps": 120, "eval_every": 30, "batch_size": 16, "optimizer": {"lr": lr},
                  "regularizer": {"lambda_max": 0.1, "t_start": 30, "t_end": 90}, **train},
    })


def _alone(config: RunConfig):
    evals = []
    trainer = Trainer(config)
    result = trainer.run(lambda rep: evals.append((rep.step, partial_aggregate(trainer, rep))), checkpoint_every=2)
    return result, evals


def test_members_train_as_alone_and_a_dropped_member_stops():
    configs = [_config(0.01), _config(0.05), _config(0.2)]
    pack = PackedTrainer(configs)
    seen: dict[int, list] = {i: [] for i in range(3)}

    def on_eval(evals):
        assert [e.index for e in evals] == pack.active
        for e in evals:
            seen[e.index].append((e.report.step, e.aggregate, e.report.checkpoint is not None))
        if evals[0].report.step == 60:
            pack.drop([1])

    results = pack.run(on_eval, checkpoint_every=2)
    assert results[1] is None and pack.active == [0, 2]
    assert [s for s, _, _ in seen[1]] == [0, 30, 60]
    for i in (0, 2):
        alone, evals = _alone(configs[i])
        assert results[i].params_sha256 == alone.params_sha256
        assert results[i].seeds == alone.seeds
        np.testing.assert_array_equal(results[i].history.interpolation_mse, alone.history.interpolation_mse)
        assert [(s, a) for s, a, _ in seen[i]] == evals
        assert [c for _, _, c in seen[i]] == [False, False, True, False, False]  # as `Trainer.run` hands them


def test_a_pack_continues_from_its_members_checkpoints():
    configs = [_config(0.05), _config(0.1)]
    checkpoints = {}

    def keep(evals):
        for e in evals:
            if e.report.checkpoint is not None:
                checkpoints[e.index] = e.report.checkpoint

    PackedTrainer(configs).run(keep, checkpoint_every=2)
    steps = []
    results = PackedTrainer(configs).run(lambda evals: steps.append(evals[0].report.step),
                                         resume_from=[checkpoints[0], checkpoints[1]], checkpoint_every=2)
    assert steps == [90, 120]  # the evaluation at the checkpoint's step is not done again
    assert [r.params_sha256 for r in results] == [Trainer(c).run().params_sha256 for c in configs]


def test_what_may_differ_within_a_pack():
    assert packable_path("train.optimizer.lr") and packable_path("train.regularizer.lambda_max")
    assert packable_path("model.layers.*.options.gate_bias_init")
    assert not packable_path("train.optimizer.name") and not packable_path("train.batch_size")
    assert structure_key(_config(0.01)) == structure_key(_config(0.3))
    assert structure_key(_config(0.01)) != structure_key(_config(0.01, batch_size=32))
    with pytest.raises(ValueError):
        PackedTrainer([_config(0.01), _config(0.01, batch_size=32)])
    recurrent = RunConfig.model_validate({"task": {"kind": "sequence_arithmetic", "operation": "sum"}})
    assert not packable(recurrent) and packable(_config(0.1))
    assert structure_key(recurrent) != structure_key(recurrent.model_copy(update={"master_seed": 1}))
