"""The training protocol the fused training steps cover: a pure check of the run
configuration (no torch), shared by the device engine (`service.engine.coverage`) and the
native CPU step (`service.training.cpu_step`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.config import RunConfig


def protocol_gap(config: RunConfig) -> str | None:
    """The training protocol the fused steps (the device engine, `service.engine`, and the
    native CPU step, `service.training.cpu_step`) train, beyond their model and task: None, or the first
    setting they do not cover. Adam at a constant learning rate, the MSE, no clipping, no
    re-initialisation, per-seed batches, float32, a linear or constant λ(t) with no
    out-of-bounds penalty."""
    t = config.train
    checks = [
        (t.optimizer.name != "adam", f"the optimiser {t.optimizer.name}"),
        (t.optimizer.lr_schedule != "constant", f"the learning-rate schedule {t.optimizer.lr_schedule}"),
        (t.loss != "mse", f"the loss {t.loss}"),
        (t.clip.mode != "none", f"clip mode {t.clip.mode}"),
        (t.reinit.enabled, "re-initialisation"),
        (t.shared_batch, "a shared batch"),
        (config.dtype != "float32", f"dtype {config.dtype}"),
    ]
    for failing, reason in checks:
        if failing:
            return reason
    schedule = config.regularizer()
    if schedule.shape not in ("linear", "constant"):
        return f"the {schedule.shape} regulariser schedule"
    if schedule.oob > 0:
        return "the out-of-bounds penalty"
    return None
