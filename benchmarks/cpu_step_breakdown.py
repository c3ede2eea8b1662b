"""Where a CPU training step's time goes, on ONE thread, at the papers' protocol (NAU → NMU,
100-input mul task, S seeds, batch 128, evaluation every 1,000 steps), and what that leaves
for a faster step: the data draw is a floor no step can go below.

    python benchmarks/cpu_step_breakdown.py [--seeds 100] [--steps 400] [--json PATH]

Pin it to one CPU for steadier figures (``taskset -c 1 python ...``). It prints and writes
(default ``benchmarks/results/cpu_step_breakdown.json``, shown on the docs' Measured figures
page):

* ``draw_ms``: one step's data alone, as the trainer draws it (`rng.sample`: S × 128 × 100
  Philox4x32-10 uniforms on the interpolation range and the operands' row sums, into the
  trainer's buffers), the minimum over many repetitions;
* ``draw_and_first_layer_ms``: the step's one pass that draws the batch and applies the
  first layer (NAU) to it seed tile by seed tile (`service.units.sampled_linear`), timed
  the same way;
* ``weight_gradient_ms``: the first layer's weight gradient over that batch (``linear_dw``);
* ``step_ms``: the whole training step as the run trains it (``compile: auto``: the native
  CPU step, `service.training.cpu_step`, one call per block), the fastest block of 50 of
  ``--steps`` steps (``step_ms_median``: the median block, what a shared machine gave);
  ``torch_eager_step_ms`` and ``torch_compiled_step_ms``: the same run's torch step, eager
  (the same bits) and compiled (``compile: on``), timed in this run;
* ``eval_ms_per_step``: one evaluation (both 10,000-sample sets) divided by 1,000 steps;
* ``ops``: for a torch step (``--compile on``), its self time per operation from torch's
  profiler (the native kernels are ``nalu_sweep::*``; the rest is the compiled graph's own
  code and its dispatch); none for the native step;
* ``seed_steps_per_s`` now, and ``ceiling_seed_steps_per_s``: S / (draw + evaluation), what
  the step would reach if everything but the draw and the evaluation cost nothing;
* ``instruction_set``: the native kernels' (`service.seeding.generator.ISA_NAMES`); on a CPU
  with AVX-512, ``avx2_baseline`` times the same trainer's step and draw with both native
  libraries held to AVX2 (the same bits), blocks alternated with the AVX-512 ones in this one
  run: their fastest blocks and the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from service.config import RunConfig  # noqa: E402
from service.seeding import generator as rng  # noqa: E402
from service.training import Trainer  # noqa: E402
from service.units import kernels, sampled_linear  # noqa: E402

EVAL_EVERY = 1000
BLOCK = 50  # steps timed together
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "cpu_step_breakdown.json"


def config(seeds: int, compile: str = "auto") -> RunConfig:
    return RunConfig.model_validate({
        "task": {"kind": "arithmetic", "operation": "mul"}, "seeds": seeds, "device": "cpu", "compile": compile,
        "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
        "train": {"steps": 30_000, "batch_size": 128, "eval_every": EVAL_EVERY},
    })


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def min_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def _readable(op: str) -> str:
    """The profiler's name of an operation, without the compiled graph's hash."""
    return "compiled graph (its own code)" if op.startswith("## Call CompiledFxGraph") else op


def _levels() -> tuple[int, int]:
    """(the draw's, the layers' kernels') instruction-set levels (0 none/portable, 1 AVX2, 2 AVX-512)."""
    draw = int(rng._lib_state["lib"].nalu_rng_isa()) if rng.native_available() else 0
    layers = int(kernels.native_library().nalu_units_isa()) if kernels.native_available() else 0
    return draw, layers


@contextlib.contextmanager
def _avx2_only():
    """Both native libraries held to AVX2 (the same bits, the previous instruction set)."""
    draw_lib, layers_lib = rng._lib_state["lib"], kernels.native_library()
    draw_lib.nalu_rng_force_isa(1)
    layers_lib.nalu_units_force_isa(1)
    try:
        yield
    finally:
        draw_lib.nalu_rng_force_portable(0)
        layers_lib.nalu_units_force_isa(2)


def _block_ms(trainer: Trainer) -> float:
    """Mean ms per step of `BLOCK` steps, trained as the run's loop trains them
    (``train_steps``: one native call where the native CPU step trains the run)."""
    t = time.perf_counter()
    trainer.train_steps(BLOCK)
    return (time.perf_counter() - t) / BLOCK * 1e3


def _blocks(trainer: Trainer, steps: int) -> list[float]:
    return [_block_ms(trainer) for _ in range(max(1, steps // BLOCK))]


@contextlib.contextmanager
def _torch_step(trainer: Trainer):
    """The same trainer on the torch step (eager, the native layers inside: the same bits)."""
    native, trainer.cpu_steps = trainer.cpu_steps, None
    try:
        yield
    finally:
        trainer.cpu_steps = native


def measure(seeds: int, steps: int, compile: str = "auto", compiled_baseline: bool = True) -> dict:
    torch.set_num_threads(1)
    trainer = Trainer(config(seeds, compile))
    trainer.train_steps(20)  # warm-up (the first step compiles where the run is compiled)
    keys, shape = trainer.data_keys, (128, trainer.task.input_size)
    runs = trainer.task.operand_runs() or ()
    buffers = trainer._batch_buffers(keys.shape[0], shape, len(runs))
    step = torch.tensor(7)
    intervals = trainer.task.interpolation.intervals
    reps = max(50, steps)
    draw = min_ms(lambda: rng.sample(keys, step, shape, intervals, runs, out=buffers), reps)
    first_pass = weight_gradient = None
    if trainer.fuses_first_layer:  # the step's one pass: the draw and the first layer, seed tile by tile
        w = trainer.model.units[0].input_product_weight()
        with torch.no_grad():
            first_pass = min_ms(lambda: sampled_linear.sample_linear(keys, step, shape, intervals, runs, w,
                                                                     out=buffers), reps)
            gz = torch.randn(seeds, shape[0], w.shape[1])
            weight_gradient = min_ms(lambda: kernels.weight_gradient(gz, buffers[0]), reps)
    # mean step time of blocks of BLOCK steps: the fastest block is the code's cost, the
    # median what a shared machine gave
    blocks = _blocks(trainer, steps)
    step_ms, median_ms = min(blocks), statistics.median(blocks)
    evaluation = min_ms(trainer.evaluate, 3) / EVAL_EVERY
    native = trainer.cpu_steps is not None
    baselines = {}
    if native:  # the torch step of the same run, in this run: eager, and compiled (the step before)
        with _torch_step(trainer):
            baselines["torch_eager_step_ms"] = round(min(_blocks(trainer, min(steps, 4 * BLOCK))), 3)
        if compiled_baseline:
            other = Trainer(config(seeds, "on"))
            other.train_steps(20)
            baselines["torch_compiled_step_ms"] = round(min(_blocks(other, steps)), 3)
    levels = _levels()
    baseline = None
    if min(levels) >= 2:  # AVX-512 against AVX2 in this run: blocks alternated, fastest of each
        pairs = [(_block_ms(trainer), _avx2_only_block(trainer)) for _ in range(max(1, steps // BLOCK))]
        with _avx2_only():
            draw_avx2 = min_ms(lambda: rng.sample(keys, step, shape, intervals, runs, out=buffers), reps)
        fast, slow = min(a for a, _ in pairs), min(b for _, b in pairs)
        baseline = {"draw_ms": round(draw_avx2, 3), "step_ms": round(slow, 3), "avx512_step_ms": round(fast, 3),
                    "step_ratio": round(round(slow, 3) / round(fast, 3), 2)}  # from the figures beside it

    shares = None
    if not native:  # the torch step's own operations, from torch's profiler
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(min(steps, 200)):
                trainer.train_step()
        total = sum(e.self_cpu_time_total for e in prof.key_averages())
        ops = sorted(((e.key, e.self_cpu_time_total) for e in prof.key_averages()), key=lambda kv: -kv[1])
        shares = {_readable(name): round(us / total, 3) for name, us in ops[:8] if total}
    return {
        "command": f"taskset -c 1 python benchmarks/cpu_step_breakdown.py --seeds {seeds}"
                   + (f" --compile {compile}" if compile != "auto" else ""),
        "machine": f"{platform.machine()}, {cpu_model()}, torch {torch.__version__}, 1 thread",
        "seeds": seeds, "compiled": trainer.compiled, "native_step": native,
        "draw_ms": round(draw, 3),
        "draw_and_first_layer_ms": round(first_pass, 3) if first_pass is not None else None,
        "weight_gradient_ms": round(weight_gradient, 3) if weight_gradient is not None else None,
        "step_ms": round(step_ms, 3), "step_ms_median": round(median_ms, 3),
        "eval_ms_per_step": round(evaluation, 3),
        "draw_share_of_step": round(draw / step_ms, 2),
        # both from the rounded figures written beside them, so a reader can recompute them
        "seed_steps_per_s": round(seeds / ((round(step_ms, 3) + round(evaluation, 3)) / 1e3)),
        "ceiling_seed_steps_per_s": round(seeds / ((round(draw, 3) + round(evaluation, 3)) / 1e3)),
        **baselines,
        "ops": shares,
        "instruction_set": rng.ISA_NAMES[min(levels)] if min(levels) else "none (torch ops)",
        "avx2_baseline": baseline,
    }


def _avx2_only_block(trainer: Trainer) -> float:
    with _avx2_only():
        return _block_ms(trainer)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--steps", type=int, default=400, help="training steps timed (after 20 warm-up steps)")
    parser.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                        help="the run's compile setting (auto, as the run trains: the native CPU step; on: "
                             "the compiled torch step)")
    parser.add_argument("--compiled-baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the compiled torch step of the same run (compiles it: ~10 s)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the figures")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.steps < 1:
        parser.error("--seeds and --steps must be at least 1")
    figures = measure(args.seeds, args.steps, args.compile, args.compiled_baseline)
    print(f"S = {figures['seeds']}, one thread ({figures['machine']}), native step: {figures['native_step']}, "
          f"compiled: {figures['compiled']}")
    print(f"  data draw alone      {figures['draw_ms']:8.3f} ms  ({figures['draw_share_of_step']:.0%} of the step)")
    if figures["draw_and_first_layer_ms"] is not None:
        print(f"  draw + first layer   {figures['draw_and_first_layer_ms']:8.3f} ms  (the step's one pass)")
        print(f"  its weight gradient  {figures['weight_gradient_ms']:8.3f} ms")
    print(f"  whole training step  {figures['step_ms']:8.3f} ms  (median block {figures['step_ms_median']:.3f} ms)")
    for key, what in (("torch_eager_step_ms", "the torch step, eager"),
                      ("torch_compiled_step_ms", "the torch step, compiled")):
        if key in figures:
            print(f"  {what:<21} {figures[key]:7.3f} ms  ({figures[key] / figures['step_ms']:.2f}x the step)")
    print(f"  evaluation, per step {figures['eval_ms_per_step']:8.3f} ms")
    print(f"  seed·steps/s now {figures['seed_steps_per_s']:,}; with everything but the draw and the "
          f"evaluation free: {figures['ceiling_seed_steps_per_s']:,}")
    for name, share in (figures["ops"] or {}).items():
        print(f"    {share:6.1%}  {name[:70]}")
    print(f"  native kernels: {figures['instruction_set']}")
    if (base := figures["avx2_baseline"]) is not None:
        print(f"  held to AVX2 (same bits, blocks alternated): draw {base['draw_ms']:.3f} ms, step "
              f"{base['step_ms']:.3f} ms against {base['avx512_step_ms']:.3f} ms: AVX-512 {base['step_ratio']:.2f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    main()
