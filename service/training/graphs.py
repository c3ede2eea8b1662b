"""CUDA-graph capture of the trainer's steps: `GRAPH_STEPS` compiled steps recorded once
and replayed, warmed up and captured on one side stream per device, with nothing else
allowed to call CUDA meanwhile (no garbage collection, thread-local capture mode)."""

from __future__ import annotations

import contextlib
import gc
import warnings
from typing import Iterator

import torch

GRAPH_STEPS = 50  # steps per captured CUDA graph
GRAPH_WARMUP = 3  # steps run (compiled, uncaptured) before the capture


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No automatic garbage collection until the block ends (a CUDA graph capture: a
    collection inside it could run a dead trainer's finalisers, which call CUDA). Garbage
    left from before is collected after the block, as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_CAPTURE_STREAMS: dict[torch.device, "torch.cuda.Stream"] = {}


def capture_stream(device: torch.device) -> "torch.cuda.Stream":
    """The side stream every CUDA graph on ``device`` is warmed up and captured on (one
    per device, so its lazy set-up happens once)."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


class CapturedSteps:
    """The capture half of `service.training.trainer.Trainer` (it provides ``device``,
    ``step``, ``step_t``, ``compiled``, ``graphed``, ``_graph``, ``_step`` and `train_step`)."""

    def _warm_up_and_capture(self, end: int) -> None:
        """`GRAPH_WARMUP` steps (the first compiles) then the capture, both on the side
        stream the graph is captured on (CUDA's documented recipe: lazy per-stream set-up,
        cuBLAS workspaces among them, happens in the warm-up, not inside the capture)."""
        stream = capture_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(GRAPH_WARMUP):
                if self.step >= end:
                    break
                self.train_step()
            if self.compiled:
                try:
                    self._capture_graph(stream)
                except RuntimeError as e:  # recording runs nothing: the state is as before
                    warnings.warn(f"CUDA graph capture failed ({str(e)[:200]}); training step by step",
                                  RuntimeWarning)
                    self.graphed = False
            else:  # compiling failed ("auto" fell back to eager): step by step from now on
                self.graphed = False
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def _capture_graph(self, stream: "torch.cuda.Stream") -> None:
        """Record `GRAPH_STEPS` steps, the step counter advanced on the device between
        them, as one CUDA graph (recording runs nothing). It leaves ``step_t`` at the last
        step's index, as `train_step` does. Reads and writes the trainer's own tensors in
        place, so it stays valid across re-initialisation and checkpoint loading.

        Nothing else may call CUDA while the capture runs, or the capture is invalidated
        (``cudaErrorStreamCaptureInvalidated``, issue 35): no garbage is collected during
        it (a dead trainer — trainers are reference cycles, freed by the cycle collector
        at whichever allocation triggers it — destroys its CUDA graph, ``cudaGraphExecDestroy``,
        and its memory when collected), and the capture mode is
        ``thread_local``, so another thread's CUDA calls (a listener, a tracking thread)
        cannot invalidate it."""
        with collection_paused():
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                for i in range(GRAPH_STEPS):
                    if i:
                        self.step_t.add_(1)
                    self._step(self.step_t)
        self._graph = graph

    def release_graph(self) -> None:
        """Destroy the captured CUDA graph now (between captures: a trainer that is done
        with, e.g. a pack being rebuilt); the next `train_steps` captures again."""
        self._graph = None
