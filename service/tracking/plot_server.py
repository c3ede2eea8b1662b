"""A trial worker's plots drawn by a warm process of its own (issue 14, sweep overhead).

A trial ends by drawing its two figures. In a worker's first trial that means importing
matplotlib and drawing a first figure (fonts, caches): about 1.2 s of a one-trial sweep's
critical path, while the other core sat idle through the training before it. `start`
launches ``python -m service.tracking.plot_server`` as the worker starts training: it
imports matplotlib, draws a throw-away figure of each kind unless a job arrives first
(`warm_up`), and waits. `draw` then sends it the figures' contents (`figures.save_plots`:
plain arrays, nothing unpickled) and the PNG paths, one JSON line each way over a pipe
pair, and waits for its answer.

The figures are the same either way, drawn by the same `figures` code: where no server was
started, where it died, failed or went silent (`ANSWER_TIMEOUT_S`), `draw` draws them in
this process, as before. The server ends when the worker does (its pipe closes)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from service.tracking.figures import (
    CurvesPlot,
    WeightsPlot,
    draw_plots,
    load_plots,
    save_plots,
)
from service.tracking.helper import same_code_env

ANSWER_TIMEOUT_S = 120.0  # a server importing on a busy machine, then drawing: well under this


class PlotServer:
    """The worker's side of one plotting process, started on creation."""

    def __init__(self) -> None:
        to_server_r, to_server_w = os.pipe()
        from_server_r, from_server_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.tracking.plot_server", str(to_server_r), str(from_server_w)],
            pass_fds=(to_server_r, from_server_w), stdin=subprocess.DEVNULL, close_fds=True,
            env=same_code_env())
        os.close(to_server_r)
        os.close(from_server_w)
        self.send: IO[bytes] = os.fdopen(to_server_w, "wb")
        self.receive: IO[bytes] = os.fdopen(from_server_r, "rb")

    def draw(self, job: dict[str, Any]) -> bool:
        """Whether the server drew ``job`` (``contents``: a `save_plots` file; ``curves``,
        ``weights``: the PNGs' paths); ``False`` where it failed, died or went silent."""
        try:
            self.send.write(json.dumps(job).encode() + b"\n")
            self.send.flush()
            ready, _, _ = select.select([self.receive], [], [], ANSWER_TIMEOUT_S)
            line = self.receive.readline() if ready else b""
            return bool(line) and json.loads(line).get("ok") is True
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        for f in (self.send, self.receive):
            try:
                f.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


_lock = threading.Lock()
_server: PlotServer | None = None


def start(cold_only: bool = True) -> None:
    """Launch this process's plotting server unless one runs or, with ``cold_only``,
    matplotlib is loaded here already (drawing here is then as quick). Never raises:
    without a server `draw` draws here."""
    global _server
    with _lock:
        if _server is not None and _server.proc.poll() is None:
            return
        if cold_only and "matplotlib.pyplot" in sys.modules:
            return
        try:
            _server = PlotServer()
        except OSError:
            _server = None


def current() -> PlotServer | None:
    """This process's plotting server, if one was started and not yet given up."""
    with _lock:
        return _server


def stop() -> None:
    """End this process's plotting server (it also ends with this process)."""
    global _server
    with _lock:
        if _server is not None:
            _server.stop()
        _server = None


def draw(curves: CurvesPlot, weights: WeightsPlot | None, curves_path: Path,
         weights_path: Path | None) -> list[Path]:
    """Both figures as PNGs (`figures.draw_plots`), by the server where one runs, else here."""
    global _server
    with _lock:
        server = _server
        if server is not None:
            curves_path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="nalu-sweep-plot-") as tmp:
                contents = save_plots(Path(tmp) / "plots.npz", curves, weights)
                drawn = server.draw({"contents": str(contents), "curves": str(curves_path),
                                     "weights": str(weights_path) if weights_path is not None else None})
            if drawn:
                return [curves_path] + ([weights_path] if weights is not None and weights_path is not None else [])
            server.stop()
            _server = None
    return draw_plots(curves, weights, curves_path, weights_path)


def warm_up(job_waiting: Callable[[], bool]) -> int:
    """Draw a small figure of each kind and throw it away, so that fonts, caches and the
    Agg canvas are loaded before the first real plot; stop as soon as a job waits (a
    throw-away figure would only delay it). Returns how many figures it drew."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from service.tracking.figures import curves_figure, weights_figure

    curves = CurvesPlot(steps=np.arange(3, dtype=np.float64), names=("warm-up",), values=(np.ones((3, 2)),),
                        thresholds=(0.5,), success=np.array([True, False]), title="warm-up")
    weights = WeightsPlot(rows=("warm-up",), names=("W",), matrices=((np.eye(2),),))
    drawn = 0
    for draw in (lambda: curves_figure(curves), lambda: weights_figure(weights)):
        if job_waiting():
            break
        fig = draw()
        fig.savefig(io.BytesIO(), format="png", dpi=90)
        plt.close(fig)
        drawn += 1
    return drawn


def _serve(from_worker: IO[bytes], to_worker: IO[bytes]) -> None:
    """Answer drawing jobs, one JSON line each, until the worker's pipe closes."""
    for line in from_worker:
        try:
            job = json.loads(line)
            curves, weights = load_plots(Path(job["contents"]))
            weights_path = Path(job["weights"]) if job.get("weights") else None
            draw_plots(curves, weights, Path(job["curves"]), weights_path)
            answer: dict[str, Any] = {"ok": True}
        except Exception as e:  # noqa: BLE001 - the worker draws it itself instead
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        to_worker.write(json.dumps(answer).encode() + b"\n")
        to_worker.flush()


def main(argv: list[str]) -> None:
    from_worker, to_worker = os.fdopen(int(argv[0]), "rb"), os.fdopen(int(argv[1]), "wb")
    try:
        warm_up(lambda: bool(select.select([from_worker], [], [], 0)[0]))
    except Exception:  # noqa: BLE001, S110 - only a head start; a real job reports its own error
        pass
    _serve(from_worker, to_worker)


if __name__ == "__main__":
    main(sys.argv[1:])
