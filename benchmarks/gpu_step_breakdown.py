"""Where a GPU training step's time goes, at the papers' protocol (NAU → NMU, 100-input mul
task, S seeds, batch 128): the data draw alone, the whole compiled step, and one
evaluation (README, Performance).

    python benchmarks/gpu_step_breakdown.py [--seeds 100]

* the data draw of one step ([S, 128, 100] uniforms): Philox4x32-10 in torch ops compiled
  for CUDA (the trainer's path on a GPU), the earlier home-made hash, and ``torch.rand``;
  each compiled, captured 50 times in one CUDA graph and replayed, so the figure is GPU
  time per draw without launch overhead;
* the training step: ``Trainer.train_steps`` (its own CUDA-graph replays), per step;
* one ``Trainer.evaluate()`` (both evaluation sets), wall time, which the trainer pays every
  ``eval_every`` steps.

Needs a CUDA GPU; the CPU figures are `benchmarks/rng_speed.py` and `benchmarks/throughput.py`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import rng_speed  # noqa: E402
import throughput  # noqa: E402
from service.seeding import generator as rng  # noqa: E402
from service.seeding import stream_keys  # noqa: E402
from service.training import Trainer  # noqa: E402

SHAPE = (128, 100)


def graphed_us(fn, *args) -> float:
    """GPU microseconds per call of ``fn(*args)``: 50 calls captured in one CUDA graph,
    replayed 40 times (after warm-up on a side stream, as graph capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(50):
            fn(*args)
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(40):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / 2000 * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: torch sees no CUDA device; this benchmark times the GPU path only "
              "(on a CPU: benchmarks/rng_speed.py, benchmarks/throughput.py)", file=sys.stderr)
        return 2
    S = args.seeds
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, S = {S}")
    keys = stream_keys(0, "data", list(range(S))).cuda()
    old_keys = torch.tensor([(i * 2654435761 + 7) & 0x7FFF_FFFF for i in range(S)], dtype=torch.int64, device="cuda")
    step = torch.tensor(4_999_999, dtype=torch.int64, device="cuda")
    draws = {
        "Philox4x32-10, torch ops compiled": (torch.compile(rng.uniform, dynamic=False), keys),
        "old hash, compiled": (torch.compile(rng_speed.old_uniform, dynamic=False), old_keys),
    }
    for name, (fn, k) in draws.items():
        print(f"  data draw, {name}: {graphed_us(fn, k, step, SHAPE):.1f} µs")
    print(f"  data draw, torch.rand: {graphed_us(lambda: torch.rand(S, *SHAPE, device='cuda')):.1f} µs")

    throughput.DEVICE = "cuda"
    trainer = Trainer(throughput.config(S, "on"))
    trainer.train_steps(1000)
    trainer.evaluate()
    torch.cuda.synchronize()
    start = time.perf_counter()
    trainer.train_steps(5000)
    torch.cuda.synchronize()
    print(f"  training step (CUDA-graph replays): {(time.perf_counter() - start) / 5000 * 1e6:.1f} µs")
    start = time.perf_counter()
    for _ in range(10):
        trainer.evaluate()
    torch.cuda.synchronize()
    print(f"  one evaluation: {(time.perf_counter() - start) / 10 * 1e3:.1f} ms (every "
          f"{trainer.config.train.eval_every} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
