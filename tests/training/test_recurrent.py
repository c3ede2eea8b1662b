"""Recurrent runs: exact cells extrapolate in length (an LSTM does not), evaluation is
chunked without changing a number, R_z is the NAU paper's, and a seed trained alone or
beside others gives identical results."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from service.config import RunConfig
from service.scoring.metrics import per_seed_metrics
from service.training import Trainer
from service.training import recurrent as recurrent_module
from service.training.recurrent import RecurrentTrainer, recurrent_schedules
from service.units.recurrent import z_regularizer
from service.units.registry import build_unit

SUM = {"kind": "sequence_arithmetic", "operation": "sum", "eval_samples": 200}
PROD = {"kind": "sequence_arithmetic", "operation": "prod", "eval_samples": 200}


def _config(task: dict, layers=None, **train) -> RunConfig:
    return RunConfig.model_validate({
        "task": task, "model": {"layers": layers}, "seeds": 2, "device": "cpu",
        "train": {"steps": 1, "eval_every": 1, "batch_size": 16, **train},
    })


def _scores(trainer: Trainer) -> dict[str, bool]:
    trainer.evaluate()
    seeds = per_seed_metrics(trainer.history(), trainer.thresholds, np.zeros(trainer.num_seeds),
                             np.zeros(trainer.num_seeds, bool), prerequisites=trainer.task.range_prerequisites())
    return {n: all(s.success_per_range[n] for s in seeds) for n in trainer.extrapolation_names}


def _load_exact(trainer: Trainer, cell_weights, mode: str) -> None:
    readout, cell = trainer.model.units
    readout.load_exact_(trainer.task.selection().float(), "add")
    cell.load_exact_(torch.tensor(cell_weights), mode)


def test_a_recurrent_task_gets_the_recurrent_trainer():
    trainer = Trainer(_config(SUM))
    assert isinstance(trainer, RecurrentTrainer) and not trainer.compiled
    assert trainer.extrapolation_names == ["length_1", "length_10", "length_100", "length_1000", "readout"]


def test_an_exact_nau_cell_extrapolates_to_length_1000_and_a_nearly_exact_one_does_not():
    trainer = Trainer(_config(SUM))
    _load_exact(trainer, [[1.0, 1.0]], "add")
    assert _scores(trainer) == dict.fromkeys(trainer.extrapolation_names, True)
    # the test can fail: a recurrence weight of 0.999 forgets, and length 1000 shows it
    trainer = Trainer(_config(SUM))
    _load_exact(trainer, [[1.0, 0.999]], "add")
    scores = _scores(trainer)
    assert scores["length_1"] and not scores["length_1000"]


def test_an_exact_nmu_cell_extrapolates_the_product_to_length_20():
    trainer = Trainer(_config(PROD))
    assert trainer.task.test_lengths == (1, 2, 5, 10, 20)
    _load_exact(trainer, [[1.0, 1.0]], "mul")
    assert _scores(trainer) == dict.fromkeys(trainer.extrapolation_names, True)


def test_an_lstm_learns_the_training_length_but_does_not_extrapolate():
    layers = [{"unit": "nau"}, {"unit": "lstm", "options": {"hidden_size": 8}}]
    trainer = Trainer(_config(SUM, layers, steps=150, eval_every=150, optimizer={"lr": 0.03}))
    result = trainer.run()
    mse = result.history.interpolation_mse
    assert (mse[-1] < 0.5 * mse[0]).all()  # it learns something at length 10 ...
    for seed in result.seeds:  # ... and is nowhere near the sum at length 1000
        assert not seed.success_per_range["length_1000"]
        assert seed.extrapolation_mse["length_1000"] > 1e6 * result.thresholds["length_1000"]


def test_chunked_evaluation_gives_the_same_numbers(monkeypatch):
    layers = [{"unit": "nau"}, {"unit": "nau"}]
    trainer = Trainer(_config({**SUM, "test_lengths": [1, 7, 50]}, layers))
    test = trainer.sequence_sets["test"]
    whole = trainer.sequence_mse(test)
    monkeypatch.setattr(recurrent_module, "_EVAL_ELEMENTS_PER_SEED", 1)  # one position per chunk
    assert torch.equal(trainer.sequence_mse(test), whole)
    assert whole.shape == (2, 3) and not whole.requires_grad


def test_the_z_regularizer_is_the_nau_papers():
    nau = build_unit("nau", 2, 1, 2)
    nmu = build_unit("nmu", 2, 1, 2)
    with torch.no_grad():
        nau.weight.copy_(torch.tensor([[[1.0, 0.5]], [[-0.25, 0.0]]]))
        nmu.weight.copy_(torch.tensor([[[1.0, 0.5]], [[0.25, 0.0]]]))
    z = torch.tensor([[2.0, 3.0], [-1.0, 0.5]])
    expected_nau = torch.tensor([(0 * 4 + 0.5 * 9) / 2, (0.75 * 1 + 1 * 0.25) / 2])
    expected_nmu = torch.tensor([(0 * 1 + 0.5 * 4) / 2, (0.75 * 4 + 1 * 0.25) / 2])
    torch.testing.assert_close(z_regularizer(nau, z), expected_nau)
    torch.testing.assert_close(z_regularizer(nmu, z), expected_nmu)
    assert torch.equal(z_regularizer(build_unit("linear", 2, 1, 2), z), torch.zeros(2))


def test_r_z_enters_the_loss_and_reaches_the_read_out():
    task = {**SUM, "test_lengths": [1]}
    on = Trainer(_config(task, regularizer_z={"shape": "constant", "lambda_max": 100.0, "t_start": 0}))
    off = Trainer(_config(task, regularizer_z={"shape": "constant", "lambda_max": 0.0, "t_start": 0}))
    step = torch.zeros((), dtype=torch.int64)
    total_on, loss_on = on._loss_eager(step)
    total_off, loss_off = off._loss_eager(step)
    assert torch.equal(loss_on, loss_off) and total_on > total_off
    grad = torch.autograd.grad(total_on, on.model.units[0].weight)[0]
    assert grad.abs().sum() > 0


def test_default_schedules_fit_a_short_run():
    sparsity, z = recurrent_schedules(_config(SUM, steps=2000))
    assert 0 <= sparsity.t_start < sparsity.t_end <= 2000
    assert z.lambda_max == 1.0 and (z.t_start, z.t_end) == (sparsity.t_start, sparsity.t_end)


DIGITS = {"kind": "sequential_digits", "eval_samples": 20, "test_lengths": [1, 30], "reference_steps": 20}
LSTM = [{"unit": "nau"}, {"unit": "lstm", "options": {"hidden_size": 4}}]


def _pair(task, layers, steps=12):
    common = {"task": task, "model": {"layers": layers}, "device": "cpu",
              "train": {"steps": steps, "eval_every": 6, "batch_size": 8, "optimizer": {"lr": 0.05}}}
    together = Trainer(RunConfig.model_validate({**common, "seeds": 3}))
    alone = Trainer(RunConfig.model_validate({**common, "seeds": 1, "seed_offset": 1}))
    return together, alone


@pytest.mark.parametrize("task", [SUM, PROD], ids=["nau-sum", "nmu-prod"])
def test_a_seed_alone_and_among_others_trains_bit_identically_with_native_units(task):
    together, alone = (t.run() for t in _pair(task, None))
    assert alone.seeds[0].seed == together.seeds[1].seed == 1
    np.testing.assert_array_equal(alone.history.interpolation_mse[:, 0], together.history.interpolation_mse[:, 1])
    for name, values in alone.history.extrapolation_mse.items():
        np.testing.assert_array_equal(values[:, 0], together.history.extrapolation_mse[name][:, 1])
    for name, w in alone.weights.items():
        np.testing.assert_array_equal(w[0], together.weights[name][1])
    assert alone.seeds[0] == together.seeds[1]


@pytest.mark.parametrize("task, layers", [(DIGITS, None), (SUM, LSTM)], ids=["digits-mlp", "lstm"])
def test_a_seed_alone_and_among_others_follows_the_same_trajectory(task, layers, monkeypatch):
    """Bit for bit, as for static runs. Three things made one seed differ from itself among
    three, and each fails this test: ``torch.bmm`` over one seed (an LSTM's ``w_hh``
    gradient) rounds unlike the same seed in a batch (`kernels.seed_products`); an MLP
    bias's gradient summed by the compiled step in an order set by the seed count
    (`kernels.add_bias`); the evaluation's chunk of positions sized from the seed count,
    which moved the read-out metric's last digits (`tree_sum`)."""
    together, alone = _pair(task, layers)
    n = together.sequence_sets["test"].inputs.shape[0]
    width = max(together.task.input_size, together.config.model.hidden_size, 2)
    monkeypatch.setattr(recurrent_module, "_EVAL_ELEMENTS_PER_SEED", 7 * n * width)  # chunks of 7 positions
    a, b = together.run(), alone.run()
    for name, w in b.weights.items():
        np.testing.assert_array_equal(w[0], a.weights[name][1])
    assert b.seeds[0] == a.seeds[1]
    for name, data in together.sequence_sets.items():
        assert torch.equal(together.sequence_mse(data, own_readout=True)[1:2],
                           alone.sequence_mse(data, own_readout=True)), name


def test_a_recurrent_run_resumes_from_a_checkpoint_bit_for_bit():
    config = _config(SUM, steps=12, eval_every=3, optimizer={"lr": 0.05})
    checkpoints = []
    whole = Trainer(config).run(lambda rep: checkpoints.append(rep.checkpoint) if rep.checkpoint else None,
                                checkpoint_every=2)
    assert checkpoints and checkpoints[0].step == 6
    resumed = Trainer(config).run(resume_from=checkpoints[0])
    assert resumed.params_sha256 == whole.params_sha256
    np.testing.assert_array_equal(resumed.history.extrapolation_mse["length_1000"],
                                  whole.history.extrapolation_mse["length_1000"])


def test_longest_length_solved_counts_from_the_shortest_length():
    from service.scoring.metrics import SeedMetrics
    from service.scoring.sequence import longest_solved

    def seed(*ok):
        names = ["length_1", "length_10", "length_100", "length_1000"]
        return SeedMetrics(seed=0, success=all(ok), success_per_range=dict(zip(names, ok)), best_step=0,
                           interpolation_mse=0.0, extrapolation_mse={}, solved_at=None, solved_at_per_range={},
                           sparsity_error=0.0, diverged=False)

    lengths = (1, 10, 100, 1000)
    assert longest_solved(seed(True, True, False, True), lengths) == 10
    assert longest_solved(seed(False, True, True, True), lengths) == 0
    assert longest_solved(seed(True, True, True, True), lengths) == 1000


def test_sparsity_error_covers_an_nau_read_out_but_not_an_mlp_one():
    trainer = Trainer(_config(SUM))
    _load_exact(trainer, [[1.0, 1.0]], "add")
    assert torch.equal(trainer.model.sparsity_error(), torch.zeros(2))
    with torch.no_grad():
        trainer.model.units[0].weight[:, 0, 2] = 0.25  # an unused input leaks in
    assert torch.equal(trainer.model.sparsity_error(), torch.full((2,), 0.25))
    digits = Trainer(_config(DIGITS))
    digits.model.units[1].load_exact_(torch.tensor([[1.0, 1.0]]), "add")
    assert torch.equal(digits.model.sparsity_error(), torch.zeros(2))  # the MLP's weights do not count
    lstm = Trainer(_config(DIGITS, [{"unit": "mlp"}, {"unit": "lstm"}]))
    assert lstm.model.sparsity_error().isnan().all()  # no arithmetic weights anywhere: undefined


@pytest.mark.slow
def test_a_recurrent_nau_learns_the_running_sum_and_extrapolates_to_length_1000():
    config = RunConfig.model_validate({
        "task": {"kind": "sequence_arithmetic", "operation": "sum"}, "seeds": 8, "device": "cpu",
        "train": {"steps": 3000, "eval_every": 500, "batch_size": 64,
                  "optimizer": {"name": "adam", "lr": 0.01, "lr_schedule": "cosine", "lr_min": 1e-6},
                  "regularizer": {"shape": "linear", "lambda_max": 1.0, "t_start": 500, "t_end": 1500}},
    })
    result = Trainer(config).run()
    # 3 of 8 since a length counts only with an accurate read-out (docs/metrics-sequence.md):
    # 5 seeds miss the read-out's bound, although the median length-1000 MSE is 2e-6 (7 of 8
    # succeeded under the end-to-end metric; whether that bound is too strict is open)
    assert result.aggregate.successes >= 3
    assert result.aggregate.success_rate_per_range["length_1000"] == result.aggregate.success_rate


@pytest.mark.slow
def test_a_compiled_recurrent_step_keeps_seeds_apart_and_follows_the_eager_one():
    """``compile: on`` compiles the recurrent training step (``auto`` does on a GPU): one
    graph, no graph break; seed 2 alone and among 4 ends bit-identical, and the compiled
    run follows the eager one (they round differently)."""
    from torch._dynamo.utils import counters

    def config(seeds: int, offset: int = 0, compile: str = "on") -> RunConfig:
        return RunConfig.model_validate({
            "task": {"kind": "sequential_digits", "operation": "sum"}, "seeds": seeds, "seed_offset": offset,
            "device": "cpu", "compile": compile, "train": {"steps": 30, "eval_every": 15, "batch_size": 16}})

    breaks = sum(counters["graph_break"].values())
    together = Trainer(config(4))
    assert together.compiled and not Trainer(config(4, compile="auto")).compiled  # auto: eager on a CPU
    a = together.run()
    b = Trainer(config(1, 2)).run()
    eager = Trainer(config(4, compile="off")).run()
    assert a.compiled and b.compiled and not eager.compiled
    assert sum(counters["graph_break"].values()) == breaks
    for name, w in a.weights.items():
        assert np.array_equal(w[2:3], b.weights[name]), name
        np.testing.assert_allclose(w, eager.weights[name], rtol=1e-4, atol=1e-6)
    assert a.seeds[2].model_dump_json() == b.seeds[0].model_dump_json()


def test_a_digit_batch_is_drawn_on_the_data_given():
    """`train_data` placed once (on the trainer's device) gives the batch `train_batch`
    draws without it: the same images and running sums."""
    trainer = Trainer(_config({"kind": "sequential_digits", "operation": "sum"}))
    keys, step = trainer.data_keys, torch.tensor(17)
    x, t = trainer.task.train_batch(keys, step, 8)
    xd, td = trainer.task.train_batch(keys, step, 8, trainer.train_data)
    assert torch.equal(x, xd) and torch.equal(t, td)
    images, labels = trainer.train_data
    assert labels.dtype == torch.float32 and images.shape[0] == labels.shape[0]
    assert torch.equal(t[..., 0], t[..., 0].round()) and float(t[..., -1, 0].max()) <= 9 * 10
