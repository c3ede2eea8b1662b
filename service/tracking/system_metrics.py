"""MLflow system metrics (CPU, memory, disk, network; GPU with pynvml) for a sweep's parent
run, sampled by the driver while the sweep runs. Enabled when ``psutil`` is installed;
``NALU_SWEEP_SYSTEM_METRICS=0`` turns it off.

The samples go through an `Outbox` like a trial's metrics: a tracking server that is away
for a while neither stops the sampling (MLflow's own monitor gives up at the first failed
request) nor loses the samples taken meanwhile."""

from __future__ import annotations

import importlib.util
import logging
import os
from contextlib import contextmanager
from typing import Iterator


def available() -> bool:
    return importlib.util.find_spec("psutil") is not None and os.environ.get("NALU_SWEEP_SYSTEM_METRICS", "1") != "0"


class _OutboxLogger:
    """What `SystemMetricsMonitor` publishes to (``record_metrics``/``flush``), journalled."""

    def __init__(self, outbox) -> None:
        self.outbox = outbox
        self.data: list = []
        self.total_training_time = self.total_log_batch_time = 0.0

    def record_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        import math
        import time

        now = int(time.time() * 1000)
        self.outbox.log_metrics([(k, float(v), now, int(step or 0)) for k, v in metrics.items()
                                 if v is not None and math.isfinite(float(v))])

    def flush(self) -> None:
        pass


def _monitor(run_id: str, tracking_uri: str, interval_s: float):
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    from service.tracking import store
    from service.tracking.spool import Outbox

    class SpooledMonitor(SystemMetricsMonitor):
        """Samples until `finish`, whatever the server does; publishes to the outbox."""

        def monitor(self) -> None:
            while not self._shutdown_event.is_set():
                for _ in range(self.samples_before_logging):
                    self.collect_metrics()
                    if self._shutdown_event.wait(self.sampling_interval):
                        break
                self.publish_metrics(self.aggregate_metrics())

    monitor = SpooledMonitor(run_id, sampling_interval=interval_s, tracking_uri=tracking_uri)
    outbox = Outbox(store.client(tracking_uri), run_id, tracking_uri)
    monitor.mlflow_logger = _OutboxLogger(outbox)
    return monitor, outbox


@contextmanager
def system_metrics(run_id: str, tracking_uri: str, interval_s: float = 10.0) -> Iterator[bool]:
    """Sample system metrics into ``run_id`` for the duration of the block (never raises);
    at its end, waits for the samples to arrive (up to the tracking patience)."""
    monitor = outbox = None
    if available():
        try:
            logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
            monitor, outbox = _monitor(run_id, tracking_uri, interval_s)
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
        if outbox is not None:
            try:
                outbox.close()
            except OSError as e:  # the spool's disk, say: the samples are optional, the sweep is not
                logging.getLogger("nalu_sweep.tracking").warning("system metrics of run %s: %s", run_id, e)
