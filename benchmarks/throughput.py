"""Seed·steps/s of the seed-batched trainer against a plain one-seed loop, in one run.

The configuration is the papers' arithmetic task (100 inputs, mul), NAU → NMU, batch 128,
evaluation every 1000 steps on 10,000 interpolation and 10,000 extrapolation samples.

  (a) reference: the straightforward one-seed torch loop a researcher would write
      (float32, torch.optim.Adam, torch.rand data, no extra Python per step);
  (b) the batched trainer at S = 1, 10, 100, 1000 (each seed with its own data stream).

Both with torch.set_num_threads(1), then with 2 threads; each line also gives the
projected wall time of 5·10⁶ steps of that many seeds (at S = 100: the papers' protocol,
100 seeds × 5·10⁶ steps). Usage:
    python benchmarks/throughput.py [--seconds 5] [--seeds 1,10,100,1000] [--threads 1,2]
                                    [--device cpu|cuda] [--cuda-graphs on|off]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from service.config import RunConfig
from service.training import Trainer

STEPS_LONG = 1_000_000  # the configured length (only a prefix is timed)
PROTOCOL_STEPS = 5_000_000  # the papers' protocol: 100 seeds × 5e6 steps
DEVICE = "cpu"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def config(seeds: int, compile_mode: str, cuda_graphs: bool = True) -> RunConfig:
    return RunConfig.model_validate({
        "task": {"kind": "arithmetic", "operation": "mul"},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
        # the papers' protocol schedule for NAU → NMU (its 5e6-step run), stated explicitly
        "train": {"steps": STEPS_LONG, "batch_size": 128, "eval_every": 1000,
                  "regularizer": {"lambda_max": 10.0, "t_start": 1_000_000, "t_end": 2_000_000}},
        "seeds": seeds, "device": DEVICE, "compile": compile_mode, "cuda_graphs": cuda_graphs,
    })


def reference_loop(seconds: float) -> float:
    """Steps/s of a plain one-seed loop on the same task and model."""
    cfg = config(1, "off")
    task = cfg.task
    sched = cfg.regularizer()
    dev = torch.device(DEVICE)
    evals = {k: (x.to(dev), y.to(dev)) for k, (x, y) in task.evaluation_sets().items()}
    sel = task.selection().float().to(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    fan = task.input_size + 2
    r = min(0.5, (3 ** 0.5) * (2 / fan) ** 0.5)
    w1 = torch.empty(2, task.input_size, device=dev).uniform_(-r, r, generator=g).requires_grad_()
    w2 = torch.empty(1, 2, device=dev).uniform_(0.25, 0.75, generator=g).requires_grad_()
    opt = torch.optim.Adam([w1, w2], lr=1e-3)
    lo, hi = task.interpolation.intervals[0]

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = x @ w1.t()
        return (w2 * h.unsqueeze(1) + 1 - w2).prod(-1)

    def step(i: int) -> None:
        x = torch.rand(128, task.input_size, generator=g, device=dev) * (hi - lo) + lo
        t = task.apply_operation(x @ sel.t())
        loss = (forward(x) - t).square().mean()
        reg = (torch.minimum(w1.abs(), (1 - w1.abs()).abs()).mean()
               + torch.minimum(w2.abs(), (1 - w2).abs()).mean())
        loss = loss + sched.value(i) * reg
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            w1.clamp_(-1, 1)
            w2.clamp_(0, 1)
        if i % 1000 == 0:
            with torch.no_grad():
                for x, y in evals.values():
                    (forward(x) - y).square().mean().item()

    for i in range(50):
        step(i)
    _sync()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(n)
        n += 1
    _sync()
    return n / (time.perf_counter() - start)


def batched(seeds: int, seconds: float, compile_mode: str, cuda_graphs: bool) -> tuple[float, float]:
    """(seed·steps/s, set-up + compile seconds) of the batched trainer."""
    t0 = time.perf_counter()
    trainer = Trainer(config(seeds, compile_mode, cuda_graphs))
    trainer.train_steps(1000 if DEVICE == "cuda" else 3)  # compile (and capture the GPU graph)
    _sync()
    setup = time.perf_counter() - t0
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n == 0:
        trainer.evaluate()  # every 1000 steps, as the trainer's loop does
        trainer.train_steps(1000)
        n += 1000
        _sync()  # the host runs ahead of the GPU: time what the GPU finished
    return n * seeds / (time.perf_counter() - start), setup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="timed seconds per measurement")
    p.add_argument("--seeds", default="1,10,100,1000")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                   help="the trainer's compile setting (auto, the default, trains a run the native CPU step covers natively)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--cuda-graphs", default="on", choices=["on", "off"],
                   help="on a GPU: replay 50 compiled steps as one captured CUDA graph")
    args = p.parse_args()
    global DEVICE
    DEVICE = args.device
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else (platform.processor() or platform.machine())
    print(f"machine: {where}, torch {torch.__version__}, device={DEVICE}, compile={args.compile}"
          + (f", cuda_graphs={args.cuda_graphs}" if DEVICE == "cuda" else ""))
    for threads in map(int, args.threads.split(",")):
        torch.set_num_threads(threads)
        ref = reference_loop(args.seconds)
        print(f"\n[{threads} thread(s)] reference one-seed loop: {ref:,.0f} steps/s")
        print(f"{'S':>6} {'seed·steps/s':>14} {'× reference':>12} {'set-up s':>9} {'5e6 steps':>10}")
        for s in map(int, args.seeds.split(",")):
            rate, setup = batched(s, args.seconds, args.compile, args.cuda_graphs == "on")
            protocol_min = PROTOCOL_STEPS * s / rate / 60  # S seeds for 5e6 steps
            print(f"{s:>6} {rate:>14,.0f} {rate / ref:>12.1f} {setup:>9.1f} {protocol_min:>8,.1f} min",
                  flush=True)


if __name__ == "__main__":
    main()
