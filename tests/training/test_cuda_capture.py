"""CUDA-graph capture under stress (issue 35): many captures, packs of changing sizes,
members dropped mid-run, dead trainers (with their graphs) left to the garbage collector.
Skipped without CUDA; part of ``benchmarks/gpu_check.py``. Under a minute on one GPU: one
compilation (every pack pads to 16 seed rows), 24 captures.

One capture in three of ``benchmarks/sweep_throughput.py --level trainer --device cuda
--packs 8`` failed with ``cudaErrorStreamCaptureInvalidated``: a trainer is a reference
cycle, so a finished one is freed by the cycle collector at whatever allocation triggers
it, possibly in the middle of the next trainer's capture, and freeing it destroys its CUDA
graph (``cudaGraphExecDestroy``), a call that invalidates a capture in progress. Captures
now run with automatic collection paused, on their own side stream (warmed up there), in
``thread_local`` capture mode."""

from __future__ import annotations

import gc
import math

import pytest
import torch

from service.config import RunConfig
from service.training.packing import PackedTrainer
from service.training.trainer import Trainer, capture_stream

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")

# seeds per member of each pack: 11 to 16 seeds, and 9 to 15 once the member at index 1
# is dropped (at step 53), so every pack and every rebuilt one trains 16 rows
PACKS = [(6, 2, 4), (3, 4, 3, 3), (8, 1, 7), (5, 2, 6), (7, 3, 2), (6, 3, 4, 1), (9, 2, 2), (4, 4, 4, 4),
         (9, 1, 2), (3, 3, 3, 3, 1), (5, 5, 5), (10, 1)]
assert all(9 <= sum(p) - p[1] and sum(p) <= 16 for p in PACKS)


def _member(seeds: int, master_seed: int, lr: float) -> RunConfig:
    return RunConfig.model_validate({
        "task": {"kind": "arithmetic", "operation": "mul", "eval_samples": 500, "threshold_samples": 20_000},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
        # 53 = 3 warm-up steps + one 50-step graph: every chunk between evaluations replays
        "train": {"steps": 106, "batch_size": 16, "eval_every": 53, "optimizer": {"lr": lr}},
        "seeds": seeds, "master_seed": master_seed, "device": "cuda", "compile": "on"})


# a failed capture only warns (the run goes on step by step): here it fails the test
@pytest.mark.filterwarnings("error:CUDA graph capture failed")
def test_two_dozen_captures_with_packs_of_changing_sizes(monkeypatch):
    from torch._dynamo.utils import counters

    captures = 0
    during_capture: list[tuple[bool, bool]] = []  # per captured step: (collection enabled, on the capture stream)
    capture = Trainer._capture_graph

    def watched_capture(self, stream):  # the trainer's own capture, its step calls watched
        nonlocal captures
        inner = self._step

        def watched(step_t):
            if torch.cuda.is_current_stream_capturing():
                on_stream = torch.cuda.current_stream(self.device) == capture_stream(self.device)
                during_capture.append((gc.isenabled(), on_stream))
            return inner(step_t)

        self._step = watched
        try:
            capture(self, stream)
        finally:
            self._step = inner
        captures += self._graph is not None

    monkeypatch.setattr(Trainer, "_capture_graph", watched_capture)
    graphs_before, first_pack_graphs = counters["stats"]["unique_graphs"], None
    for p, sizes in enumerate(PACKS):
        members = [_member(n, 100 * p + k, 1e-2 * (1 + k)) for k, n in enumerate(sizes)]
        packed = PackedTrainer(members)

        def on_eval(evals, packed=packed):
            if evals[0].report.step == 53:
                packed.drop([1])

        results = packed.run(on_eval)
        assert packed.trainer is not None and packed.trainer.num_seeds == 16 and results[1] is None
        for index, result in enumerate(results):
            if index != 1:
                assert result is not None
                assert all(s.diverged or math.isfinite(s.interpolation_mse) for s in result.seeds)
        if first_pack_graphs is None:
            first_pack_graphs = counters["stats"]["unique_graphs"]
    assert captures == 2 * len(PACKS) >= 20
    assert len(during_capture) == 50 * captures  # _GRAPH_STEPS steps per capture
    assert all(not enabled and on_stream for enabled, on_stream in during_capture)
    assert first_pack_graphs - graphs_before <= 1
    assert counters["stats"]["unique_graphs"] == first_pack_graphs, "a pack of another size compiled again"
