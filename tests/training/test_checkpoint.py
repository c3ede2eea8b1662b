"""Checkpoints: a run interrupted after a checkpoint and resumed from the file ends exactly
where the uninterrupted run ends (parameters, optimiser state, masks, metrics).

Eager mode (``compile="off"``): every eager CPU kernel here is deterministic at a fixed
thread count, so "equal" means bit-identical (`torch.equal`). A compiled run is equally
deterministic, but compiling costs ~10 s per configuration, too slow for this file.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from service.config import RunConfig
from service.training import Trainer
from service.training.checkpoint import FORMAT, CheckpointError, TrainerCheckpoint, load_payload


def _config(**overrides) -> RunConfig:
    base = {
        "task": {"kind": "arithmetic", "operation": "mul", "eval_samples": 200, "threshold_samples": 20_000},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
        "train": {"steps": 80, "batch_size": 16, "eval_every": 10,
                  "optimizer": {"name": "adam", "lr": 0.05, "lr_schedule": "cosine"},
                  "clip": {"mode": "norm", "max": 0.5},
                  "regularizer": {"lambda_max": 1.0, "t_start": 10, "t_end": 60}},
        "seeds": 6, "device": "cpu", "compile": "off",
    }
    for key, value in overrides.items():
        if key == "train":
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return RunConfig.model_validate(base)


class Interrupted(Exception):
    """The crash a test injects right after a checkpoint was written."""


def _run(config: RunConfig, hook=None, **kwargs):
    """An uninterrupted run; ``hook(trainer, report)`` sees every evaluation."""
    trainer = Trainer(config)
    result = trainer.run(None if hook is None else lambda rep: hook(trainer, rep), **kwargs)
    return trainer, result


def _interrupted_and_resumed(config: RunConfig, stop_at: int, path, hook=None, every: int = 2):
    """Train until the first checkpoint at or after ``stop_at``, save it, crash; then train a
    fresh `Trainer` from the file to the end. Returns (the resumed trainer, its result,
    the steps the resumed run reported)."""
    saved = []
    first = Trainer(config)

    def on_eval(rep):
        if hook is not None:
            hook(first, rep)
        if rep.checkpoint is not None:
            rep.checkpoint.save(path)
            saved.append(rep.step)
            if rep.step >= stop_at:
                raise Interrupted

    with pytest.raises(Interrupted):
        first.run(on_eval, checkpoint_every=every)
    assert saved and saved[-1] >= stop_at
    reported = []
    trainer = Trainer(config)

    def on_resumed_eval(rep):
        if hook is not None:
            hook(trainer, rep)
        reported.append(rep.step)

    result = trainer.run(on_resumed_eval, resume_from=TrainerCheckpoint.load(path))
    return trainer, result, reported


def _assert_same_state(a: Trainer, b: Trainer) -> None:
    for pa, pb in zip(a.params, b.params, strict=True):
        assert torch.equal(pa, pb)
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert torch.equal(sa["steps"], sb["steps"]) and torch.equal(sa["powers"], sb["powers"])
    for bufs_a, bufs_b in zip(sa["state"], sb["state"], strict=True):
        for x, y in zip(bufs_a, bufs_b, strict=True):
            assert torch.equal(x, y)
    for name in ("alive", "diverged_at", "last_improved"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    torch.testing.assert_close(a.best_loss, b.best_loss, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(a.best_step, b.best_step)
    for name in ("best_interpolation_mse", "best_sparsity_error"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0, equal_nan=True)
    assert a.reinit_counts == b.reinit_counts
    assert a.step == b.step


def _assert_same_result(a, b) -> None:
    assert a.params_sha256 == b.params_sha256 and len(a.params_sha256) == 64
    assert [s.model_dump_json() for s in a.seeds] == [s.model_dump_json() for s in b.seeds]
    assert a.aggregate.model_dump_json() == b.aggregate.model_dump_json()
    np.testing.assert_array_equal(a.history.steps, b.history.steps)
    np.testing.assert_array_equal(a.history.interpolation_mse, b.history.interpolation_mse)
    for name, v in a.history.extrapolation_mse.items():
        np.testing.assert_array_equal(v, b.history.extrapolation_mse[name])
    for name, w in a.weights.items():
        np.testing.assert_array_equal(w, b.weights[name])
    assert a.reinitialisations == b.reinitialisations


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop", "sgd"])
def test_resumed_run_ends_exactly_where_the_uninterrupted_run_ends(optimizer, tmp_path):
    cfg = _config(train={"optimizer": {"name": optimizer, "lr": 0.02, "lr_schedule": "cosine"}})
    whole, whole_result = _run(cfg)
    resumed, result, reported = _interrupted_and_resumed(cfg, stop_at=40, path=tmp_path / "c.pt")
    assert reported == [50, 60, 70, 80]  # continued after step 40; step 40 is not evaluated again
    _assert_same_state(whole, resumed)
    _assert_same_result(whole_result, result)
    # and training really moved on from the checkpoint (not a no-op run)
    at_40 = TrainerCheckpoint.load(tmp_path / "c.pt")
    assert at_40.step == 40
    assert not torch.equal(at_40.model["units.0.weight"], resumed.params[0])


def test_a_diverged_seed_stays_diverged_after_resuming(tmp_path):
    """Seed 2 blows up at step 20 (injected in both runs alike); the masks and the step it
    diverged at survive the checkpoint, and the other seeds train on identically."""
    def blow_up(trainer, rep):
        if rep.step == 20:
            with torch.no_grad():
                trainer.params[0][2].fill_(float("inf"))

    cfg = _config()
    whole, whole_result = _run(cfg, blow_up)
    assert [s.diverged for s in whole_result.seeds] == [False, False, True, False, False, False]
    resumed, result, _ = _interrupted_and_resumed(cfg, stop_at=40, path=tmp_path / "c.pt", hook=blow_up)
    ckpt = TrainerCheckpoint.load(tmp_path / "c.pt")
    assert not bool(ckpt.alive[2]) and int(ckpt.diverged_at[2]) >= 20
    _assert_same_state(whole, resumed)
    _assert_same_result(whole_result, result)
    assert result.seeds[2].diverged_at == whole_result.seeds[2].diverged_at is not None


def test_reinitialisations_before_and_after_the_checkpoint_match(tmp_path):
    """Stuck seeds are re-drawn from their own (seed id, count) generators: counts, best
    losses and improvement steps are part of the checkpoint, so the re-draws after resuming
    are the uninterrupted run's."""
    cfg = _config(train={"reinit": {"enabled": True, "every": 10, "patience": 3, "threshold": 0.0},
                         "steps": 100})
    whole, whole_result = _run(cfg)
    resumed, result, _ = _interrupted_and_resumed(cfg, stop_at=40, path=tmp_path / "c.pt")
    at_ckpt = TrainerCheckpoint.load(tmp_path / "c.pt")
    assert sum(at_ckpt.reinit_counts) > 0, "no re-initialisation before the checkpoint"
    assert sum(whole.reinit_counts) > sum(at_ckpt.reinit_counts), "none after it"
    _assert_same_state(whole, resumed)
    _assert_same_result(whole_result, result)


def test_gumbel_gated_nalu_with_value_clipping_resumes_exactly(tmp_path):
    """Gate noise and the gate temperature depend on the step alone."""
    cfg = _config(task={"kind": "small_mul", "eval_samples": 200, "threshold_samples": 20_000},
                  model={"layers": [{"unit": "nalu", "options": {"gate": "gumbel"}},
                                    {"unit": "nalu", "options": {"gate": "temperature"}}]},
                  train={"clip": {"mode": "value", "max": 0.1}, "optimizer": {"name": "adam", "lr": 0.01}})
    whole, whole_result = _run(cfg)
    resumed, result, _ = _interrupted_and_resumed(cfg, stop_at=60, path=tmp_path / "c.pt", every=3)
    _assert_same_state(whole, resumed)
    _assert_same_result(whole_result, result)


def test_checkpoints_come_every_k_evaluations_by_step():
    steps = []

    def on_eval(trainer, rep):
        if rep.checkpoint is not None:
            steps.append(rep.checkpoint.step)
            assert rep.checkpoint.step == rep.step and rep.checkpoint.eval_steps[-1] == rep.step

    _run(_config(train={"steps": 75}), on_eval, checkpoint_every=3)
    assert steps == [30, 60]  # not step 0, not the final step 75
    steps.clear()
    _run(_config(train={"steps": 75}), on_eval)
    assert steps == []  # off by default


def test_a_checkpoint_continues_only_its_own_configuration(tmp_path):
    cfg = _config()
    Trainer(cfg).checkpoint().save(tmp_path / "c.pt")
    ckpt = TrainerCheckpoint.load(tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="another run configuration"):
        Trainer(_config(train={"optimizer": {"name": "adam", "lr": 0.03}})).load_checkpoint(ckpt)
    Trainer(_config(compile="auto")).load_checkpoint(ckpt)  # the compile mode may change


class _Payload:
    """Stands for any object that is not plain data."""

    def __reduce__(self):
        return (print, ("this must never run",))


def test_loading_never_unpickles_objects(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"format": 1, "step": _Payload()}, path)
    with pytest.raises(CheckpointError, match="cannot read the checkpoint"):
        load_payload(path)
    assert "must never run" not in capsys.readouterr().out
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        TrainerCheckpoint.load(tmp_path / "junk.pt")
    torch.save({"format": 99}, tmp_path / "future.pt")
    with pytest.raises(CheckpointError, match=f"format {FORMAT}"):
        TrainerCheckpoint.load(tmp_path / "future.pt")
    torch.save({"format": 1}, tmp_path / "old-generator.pt")  # trained on the pre-Philox generator
    with pytest.raises(CheckpointError, match=f"format {FORMAT}"):
        TrainerCheckpoint.load(tmp_path / "old-generator.pt")
