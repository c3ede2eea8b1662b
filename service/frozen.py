"""The one base of every config model: frozen (a config, once checked, never changes under
a running trial), closed (an unknown key is a typo, reported as such) and finite (NaN and
±inf are never a setting)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
