"""A sweep's options: the CLI's flags, resolved (`service.sweep.driver` runs a sweep with them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SweepOptions:
    """Where and how a sweep runs (the CLI's flags, resolved)."""

    name: str
    tracking_uri: str
    storage_path: str
    space_file: Path | None = None
    address: str | None = None
    resume: bool = False
    verbose: bool = False
    optuna_storage: str | None = None  # an RDB URL: keep the Optuna study there (name = the sweep's)
    keep_ray: bool = False  # leave a Ray this sweep started running (the caller validates next)
