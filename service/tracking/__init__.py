"""MLflow tracking of sweeps: the store, parent/child runs, and per-trial artifacts."""

from service.tracking.store import default_tracking_uri, resolve_tracking_uri

__all__ = ["default_tracking_uri", "resolve_tracking_uri"]
