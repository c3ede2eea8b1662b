"""How a sweep stops trials: ASHA by steps, a race by seeds, or not at all."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, ValidationError

from service import limits
from service.errors import error_message
from service.frozen import Frozen

if TYPE_CHECKING:  # numpy comes with the race rule: the read-only verbs load spaces without it
    from service.scoring.race import RaceSpec

RACE_KEYS = ("first_block", "growth", "max_seeds", "alpha", "test")
_ASHA_DEFAULTS = {"grace_period": None, "reduction_factor": 3.0, "brackets": 1}


class SchedulerSpec(Frozen):
    """ASHA stops hopeless trials early: at each rung only the top 1/``reduction_factor``
    by the intermediate objective continue. ``grace_period`` is in training steps.

    ``race`` races the settings by seeds instead (`service.scoring.race`, docs/racing.md):
    a trial trains ``first_block`` seeds, then ×``growth`` … up to ``max_seeds`` while a
    paired test at level ``alpha`` cannot show it worse than the incumbent. Its keys are
    None (RaceSpec's defaults) unless given, so a space without them keeps its hash. A
    race with ``grace_period`` also stops a first block early by steps: ASHA's rule over
    the settings' first blocks, at rungs ``grace_period`` × ``reduction_factor``^k
    (`first_block_rungs`); without it every block trains all its steps."""

    type: Literal["asha", "none", "race"] = "asha"
    grace_period: int | None = Field(
        None, ge=1, le=limits.MAX_STEPS, description="training steps before a trial can be stopped (default: steps / 8; "
        "race: given, a first block may be stopped early by steps)"
    )
    reduction_factor: float = Field(3.0, gt=1, le=1000)
    brackets: int = Field(1, ge=1, le=100)
    first_block: int | None = Field(None, description="race: seeds of a setting's first block (default 8)")
    growth: int | None = Field(None, description="race: each budget is the last × growth (default 2)")
    max_seeds: int | None = Field(None, description="race: the most seeds a setting gets (default 64)")
    alpha: float | None = Field(None, description="race: a setting as good as the incumbent is eliminated "
                                "with at most this probability (default 0.05)")
    test: Literal["sign", "score"] | None = Field(None, description="race: the paired test (default sign)")

    def race(self) -> RaceSpec:
        """The race's parameters (RaceSpec checks them; `problems` reports what it refuses)."""
        from service.scoring.race import RaceSpec

        return RaceSpec(**{k: getattr(self, k) for k in RACE_KEYS if getattr(self, k) is not None})

    @property
    def first_block_rungs(self) -> bool:
        """Whether a race stops first blocks early by steps (``grace_period`` given)."""
        return self.type == "race" and self.grace_period is not None

    def problems(self) -> list[tuple[str, str]]:
        if self.type != "race":
            return [(f"scheduler.{k}", f"only for 'type: race' (this scheduler is {self.type!r})")
                    for k in RACE_KEYS if getattr(self, k) is not None]
        out = []
        if self.brackets != _ASHA_DEFAULTS["brackets"]:
            out.append(("scheduler.brackets", "ASHA's setting; 'type: race' replaces ASHA (remove it)"))
        if self.reduction_factor != _ASHA_DEFAULTS["reduction_factor"] and self.grace_period is None:
            out.append(("scheduler.reduction_factor", "with 'type: race' only for stopping first blocks by steps: "
                        "give grace_period too, or remove it"))
        try:
            spec = self.race()
        except ValidationError as e:
            return out + [(f"scheduler.{'.'.join(map(str, err['loc'])) or 'max_seeds'}", error_message(err))
                          for err in e.errors(include_url=False)]
        if spec.max_seeds > limits.MAX_SEEDS:
            out.append(("scheduler.max_seeds", f"must be ≤ {limits.MAX_SEEDS}, the seeds one computation may train"))
        return out
