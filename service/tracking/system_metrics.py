"""MLflow system metrics (CPU, memory, disk, network; GPU with pynvml) for a sweep's parent
run, sampled by the driver while the sweep runs. Enabled when ``psutil`` is installed;
``NALU_SWEEP_SYSTEM_METRICS=0`` turns it off."""

from __future__ import annotations

import importlib.util
import logging
import os
from contextlib import contextmanager
from typing import Iterator


def available() -> bool:
    return importlib.util.find_spec("psutil") is not None and os.environ.get("NALU_SWEEP_SYSTEM_METRICS", "1") != "0"


@contextmanager
def system_metrics(run_id: str, tracking_uri: str, interval_s: float = 10.0) -> Iterator[bool]:
    """Sample system metrics into ``run_id`` for the duration of the block (never raises)."""
    monitor = None
    if available():
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
            monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, tracking_uri=tracking_uri)
            monitor.start()
        except Exception:  # noqa: BLE001 - monitoring is optional
            monitor = None
    try:
        yield monitor is not None
    finally:
        if monitor is not None:
            try:
                monitor.finish()
            except Exception:  # noqa: BLE001
                pass
