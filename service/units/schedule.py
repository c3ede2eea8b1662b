"""The regulariser scaling λ(t) of docs/domain/units.md.

Total loss = task_loss + λ(t) · Σ_layers R_layer (+ oob · Σ_layers out-of-bound penalty).
λ is computed from a step *tensor* so a compiled training step is not re-traced each step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import model_validator

from service.frozen import Frozen

if TYPE_CHECKING:
    import torch

EXP_RATE = 5.0


class RegularizerSchedule(Frozen):
    """``linear``: λ_max·clamp((t − t_start)/(t_end − t_start), 0, 1) (the papers' warm-up);
    ``constant``: λ_max from t_start on; ``exponential``: λ_max·(e^{5p} − 1)/(e^5 − 1) with
    the same p, a slow start that reaches λ_max at t_end."""

    shape: Literal["linear", "constant", "exponential"] = "linear"
    # no default times: a schedule is given whole (or left out, for the reference schedule
    # scaled to the run, `RunConfig.regularizer`); a default t_start of 1e6 silently left
    # 50,000-step runs unregularised. Only ``lambda_max: 0`` (off) needs no times.
    lambda_max: float
    t_start: int | None = None
    t_end: int | None = None
    oob: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _times(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("lambda_max") == 0 and "t_start" not in data and "t_end" not in data:
            return {**data, "t_start": 0, "t_end": 1}
        return data

    @model_validator(mode="after")
    def _check(self) -> "RegularizerSchedule":
        if self.shape == "constant" and self.t_start is not None and self.t_end is None:
            object.__setattr__(self, "t_end", self.t_start + 1)  # unused by a constant schedule
        if self.t_start is None or self.t_end is None:
            raise ValueError("give t_start and t_end with lambda_max (or lambda_max: 0 to turn the "
                             "regulariser off, or leave 'regularizer' out for the reference "
                             "schedule scaled to the run)")
        if self.lambda_max < 0:
            raise ValueError("lambda_max must be >= 0")
        if self.oob < 0:
            raise ValueError("oob must be >= 0")
        if self.t_start < 0:
            raise ValueError("t_start must be >= 0")
        if self.shape != "constant" and self.t_end <= self.t_start:
            raise ValueError(f"t_end ({self.t_end}) must be > t_start ({self.t_start})")
        return self

    def value(self, step: torch.Tensor | int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """λ(step) as a 0-d ``dtype`` tensor (float32 by default; on ``step``'s device),
        computed in ``dtype``."""
        import torch  # not at the top: configs are checked where torch is not loaded

        dtype = torch.float32 if dtype is None else dtype
        t = torch.as_tensor(step).to(dtype)
        if self.shape == "constant":
            return torch.where(t >= self.t_start, self.lambda_max, 0.0).to(dtype)
        p = ((t - self.t_start) / float(self.t_end - self.t_start)).clamp(0.0, 1.0)
        if self.shape == "linear":
            return self.lambda_max * p
        return self.lambda_max * torch.expm1(EXP_RATE * p) / math.expm1(EXP_RATE)
