"""What the sweep tests share: a trainable whose first attempt crashes after a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.sweep.trainable import TRAINABLE_NAME


def crash_once(marker: Path, crash_at: int, execute: str = "execute_trial"):
    """A `make_trainable` whose trainable (``service.sweep.trainable.<execute>``) dies on its
    first attempt — an exception out of the trainable, as a crashing worker's — right after
    reporting step ``crash_at``; ``marker`` records that it did."""

    def make(settings):
        def nalu_sweep_trial(config):
            from unittest import mock

            import ray.tune

            from service.sweep import trainable

            run = getattr(trainable, execute)
            if marker.exists():
                return run(config, settings)
            real_report = ray.tune.report

            def report(metrics, *, checkpoint=None):
                real_report(metrics, checkpoint=checkpoint)
                if metrics["step"] >= crash_at:
                    marker.write_text(str(metrics["step"]))
                    raise RuntimeError("injected fault after a checkpoint")

            with mock.patch.object(ray.tune, "report", report):
                run(config, settings)

        nalu_sweep_trial.__name__ = TRAINABLE_NAME
        return nalu_sweep_trial

    return make


@pytest.fixture
def crashing_trainable():
    """`crash_once`, for tests that patch it over `service.sweep.driver.make_trainable`."""
    return crash_once
