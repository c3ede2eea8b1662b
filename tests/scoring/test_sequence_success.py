"""Per-length success of the recurrent tasks measures accuracy, not bias
(docs/metrics-sequence.md): a length is solved with an accurate read-out and a cell that is
exact on the seed's own read-out there and at every shorter test length. A noisy read-out
that is less biased than the reference no longer passes the long lengths only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from service.config import RunConfig
from service.scoring.metrics import EvalHistory, aggregate, per_seed_metrics
from service.training import Trainer, train

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"
DIGITS = {"kind": "sequential_digits", "operation": "sum", "eval_samples": 100}


def _monotone(success: dict[str, bool], lengths) -> bool:
    """No length passed after a shorter one failed."""
    flags = [success[f"length_{n}"] for n in sorted(lengths)]
    return all(a or not b for a, b in zip(flags, flags[1:]))


def test_a_range_needs_its_prerequisites_where_it_counts():
    """``prerequisites``: length 1000 below its threshold while length 1 is not (or the
    read-out is not) does not count; the seed's success and ``solved_at`` are unchanged."""
    names = ["length_1", "length_1000", "readout"]
    mse = {"length_1": [[5.0, 0.1, 0.1]], "length_1000": [[0.1, 0.1, 0.1]], "readout": [[0.1, 5.0, 0.1]]}
    history = EvalHistory(np.array([100]), np.zeros((1, 3)), {n: np.array(mse[n]) for n in names})
    thresholds = dict.fromkeys(names, 1.0)
    needs = {"length_1": ("readout",), "length_1000": ("readout", "length_1")}
    plain = per_seed_metrics(history, thresholds, np.zeros(3), np.zeros(3, bool))
    seeds = per_seed_metrics(history, thresholds, np.zeros(3), np.zeros(3, bool), prerequisites=needs)
    assert [s.success_per_range["length_1000"] for s in plain] == [True, True, True]
    assert [s.success_per_range["length_1000"] for s in seeds] == [False, False, True]
    assert [s.success_per_range["length_1"] for s in seeds] == [False, False, True]
    assert [s.solved_at_per_range["length_1000"] for s in seeds] == [None, None, 100]
    assert [s.success for s in seeds] == [s.success for s in plain] == [False, False, True]
    assert aggregate(seeds).success_rate_per_range == {"length_1": 1 / 3, "length_1000": 1 / 3, "readout": 2 / 3}
    with pytest.raises(ValueError, match="not in the history"):
        per_seed_metrics(history, thresholds, np.zeros(3), np.zeros(3, bool), prerequisites={"readout": ("x",)})



@pytest.mark.parametrize("operation", ["sum", "prod"])
def test_each_threshold_is_the_references_mean_plus_its_99_percent_margin(operation, tmp_path, monkeypatch):
    """docs/metrics-sequence.md: a threshold is the reference's mean squared error plus a
    one-sided 99% upper bound on that mean, ``mean + 2.326·sd/√N``. Without the margin a
    seed as good as the reference fails about half its draws; with it doubled a worse cell
    passes. "Thresholds rise with length" tells neither from the right one: the margin
    itself is checked here, against the reference's errors recomputed."""
    from service.tasks import parse_task
    from service.tasks.sequence import _thresholds_cached

    # computed here, not read from a cache an earlier version of the code wrote
    monkeypatch.setenv("NALU_SWEEP_CACHE_DIR", str(tmp_path))
    _thresholds_cached.cache_clear()

    task = parse_task({"kind": "sequence_arithmetic", "operation": operation, "eval_samples": 100})
    thresholds = task.success_thresholds()
    test = task.sequence_sets()["test"]
    cell = task.cell_reference_errors(test).numpy()
    errors = {**{name: cell[:, j] for j, name in enumerate(test.lengths)},
              "readout": task.readout_reference_errors(test).numpy()[:, 0]}
    assert set(errors) == set(thresholds)
    z99 = 2.3263478740408408  # the standard normal's 0.99 quantile
    for name, e in errors.items():
        margin = z99 * e.std(ddof=1) / np.sqrt(e.size)
        assert margin > 0, name
        assert thresholds[name] - e.mean() == pytest.approx(margin, rel=1e-3), name

@torch.no_grad()
def _digit_trainer() -> Trainer:
    """Three seeds of the digit sum with hand-set weights: 0 a read-out less biased but
    noisier than the reference, with an exact cell; 1 the reference read-out and an exact
    cell; 2 the reference read-out and a cell that forgets (recurrence weight 0.999)."""
    trainer = Trainer(RunConfig.model_validate({"task": DIGITS, "seeds": 3, "device": "cpu",
                                                "train": {"steps": 1, "eval_every": 1}}))
    task = trainer.task
    readout, cell = trainer.model.units
    w1, b1, w2, b2 = (torch.as_tensor(t) for t in _reference(task))
    test = task.sequence_sets()["test"]
    values = task.reference_readout(test.table)[test.inputs]
    bias = float((values - test.operands).mean())
    centre = float(values.mean())
    scale = 0.4  # z = (1 + scale)·ref − bias − scale·centre: unbiased, noisier per digit
    for k in range(3):
        readout.weights[0][k] = w1
        readout.biases[0][k] = b1
        readout.weights[1][k] = w2 * (1 + scale if k == 0 else 1)
        readout.biases[1][k] = (b2 * (1 + scale) - bias - scale * centre) if k == 0 else b2
    cell.weight[:, 0] = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.999]])
    return trainer


def _reference(task):
    from service.tasks.sequential_digits import _fit_reference

    return _fit_reference(task)


def test_a_less_biased_but_noisier_read_out_does_not_pass_long_lengths_alone():
    """The issue's failure, by hand: seed 0's read-out has no mean error but a larger one per
    digit than the reference. Judged end to end against the reference (the old metric) it
    failed at length 1 and passed at 1000; now it fails its read-out and so every length.
    The reference read-out with an exact cell solves every length; a forgetting cell
    solves length 1 only (its read-out is fine, its arithmetic drifts from length 10 on)."""
    trainer = _digit_trainer()
    trainer.evaluate()
    result = trainer.result(0.0)
    noisy, exact, forgetting = result.seeds
    thr = result.thresholds
    assert noisy.extrapolation_mse["readout"] > thr["readout"]  # noisier per digit than the reference
    assert noisy.extrapolation_mse["length_1000"] < thr["length_1000"]  # its cell is exact on its values
    assert not any(noisy.success_per_range.values()) and not noisy.success
    assert all(exact.success_per_range.values()) and exact.success
    longer = [f"length_{n}" for n in trainer.task.test_lengths[1:]]
    assert forgetting.success_per_range == {"length_1": True, **dict.fromkeys(longer, False), "readout": True}
    for seed in result.seeds:
        assert _monotone(seed.success_per_range, trainer.task.test_lengths)
    assert result.aggregate.success_rate_per_range["length_1000"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("source", ["sequential_sum", "sequential_product", "run:sequential_digits",
                                    "run:sequence_arithmetic"])
def test_no_seed_passes_a_length_after_failing_a_shorter_one(source):
    """The shipped configurations (the spaces' fixed settings, the ``run`` defaults), at a
    small size: every seed's per-length success is monotone in the length, and so is the
    aggregate's ``success_rate_per_range``."""
    if source.startswith("run:"):
        task = {"kind": source[4:], "operation": "sum", "eval_samples": 40}
        data = {"task": task, "seeds": 3, "device": "cpu", "train": {"steps": 120, "eval_every": 40}}
    else:
        space = yaml.safe_load((SPACES / f"{source}.yaml").read_text())
        data = {**space["fixed"], "task": {**space["task"], "eval_samples": 40}, "seeds": 3, "device": "cpu"}
        data["train"] = {**data.get("train", {}), "steps": 120, "eval_every": 40}
    result = train(RunConfig.model_validate(data))
    lengths = result.config.task.test_lengths
    for seed in result.seeds:
        assert _monotone(seed.success_per_range, lengths), seed.success_per_range
    rates = [result.aggregate.success_rate_per_range[f"length_{n}"] for n in lengths]
    assert all(a >= b for a, b in zip(rates, rates[1:])), rates


@pytest.mark.slow  # ~20 s of CPU: the issue's run, 8 seeds × 2,000 steps
def test_the_issues_digit_sum_run_is_monotone_in_length():
    """``nalu-sweep run --task sequential_digits --operation sum --seeds 8 --steps 2000``:
    judged end to end against the reference, 0/8 seeds passed at length 1 and 5/8 at
    500–1000 (each failing short and passing long); now no seed passes after failing."""
    result = train(RunConfig.model_validate({"task": {"kind": "sequential_digits", "operation": "sum"},
                                             "seeds": 8, "device": "cpu", "train": {"steps": 2000}}))
    lengths = result.config.task.test_lengths
    for seed in result.seeds:
        assert _monotone(seed.success_per_range, lengths), seed.success_per_range
