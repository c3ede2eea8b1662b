"""Milliseconds per [100, 128, 100] uniform draw on ONE CPU thread (the data of one training
step at 100 seeds x batch 128 x 100 inputs). "new" rows: the Philox4x32-10 generator of
`service.seeding.generator` (C kernel, torch ops); "old hash": an earlier home-made hash.

    python benchmarks/rng_speed.py             # all variants
    python benchmarks/rng_speed.py --quick     # skip torch.compile (saves ~1 min)
    python benchmarks/rng_speed.py --diagnose  # also: why trivial int32 kernels compile slow

Timings on a shared machine are noisy: each variant is run many times and the minimum
(and the median) is reported.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from service.seeding import generator as rng  # noqa: E402
from service.seeding import stream_keys  # noqa: E402

S, SHAPE = 100, (128, 100)

# -- an earlier generator (two full lowbias32 rounds per element), for comparison ------------
_M1 = 0x7FEB352D
_M2 = 0x846CA68B - (1 << 32)


def _mix32(v: torch.Tensor) -> torch.Tensor:
    v = v ^ ((v >> 16) & 0xFFFF)
    v = v * _M1
    v = v ^ ((v >> 15) & 0x1FFFF)
    v = v * _M2
    v = v ^ ((v >> 16) & 0xFFFF)
    return v


def old_uniform(keys: torch.Tensor, counter: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    counter = torch.as_tensor(counter, dtype=torch.int64, device=keys.device)
    k = keys.to(torch.int32)
    lo = (counter & 0x7FFF_FFFF).to(torch.int32)
    hi = (counter >> 31).to(torch.int32)
    step_key = _mix32(_mix32(k ^ lo) ^ (hi + 0x2545F491))
    idx = torch.arange(n, dtype=torch.int32, device=keys.device).view(1, *shape)
    ones = [1] * len(shape)
    v = _mix32(_mix32(idx ^ step_key.view(-1, *ones)) + k.view(-1, *ones))
    return ((v >> 8) & 0xFFFFFF).to(torch.float32) * (1.0 / 16777216.0)


# -- timing -----------------------------------------------------------------------------------
def timeit(fn, *args, budget_s: float = 2.0, max_reps: int = 400) -> tuple[float, float]:
    """(min, median) milliseconds of ``fn(*args)``."""
    for _ in range(3):
        fn(*args)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < 10 or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    times.sort()
    return times[0] * 1e3, times[len(times) // 2] * 1e3


def row(name: str, fn, *args) -> None:
    lo, med = timeit(fn, *args)
    print(f"  {name:52s} {lo:8.3f} ms  (median {med:7.3f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the torch.compile variants")
    ap.add_argument("--diagnose", action="store_true", help="time trivial compiled int32 kernels")
    args = ap.parse_args()

    torch.set_num_threads(1)
    keys = stream_keys(0, "data", list(range(S)))
    old_keys = torch.tensor([(i * 2654435761 + 7) & 0x7FFF_FFFF for i in range(S)], dtype=torch.int64)
    step = torch.tensor(4_999_999, dtype=torch.int64)
    n = SHAPE[0] * SHAPE[1]
    native = rng.native_available()
    isa = rng.ISA_NAMES[int(rng._lib_state.get("isa", 0))]
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"native kernel: {isa if native else 'unavailable: ' + str(rng._lib_state.get('error'))}")
    print(f"ms per [{S}, {SHAPE[0]}, {SHAPE[1]}] float32 draw ({S * n / 1e6:.2f} M numbers):")

    out = torch.empty(S, *SHAPE)
    row("torch.rand (mt19937)", lambda: torch.rand(S, *SHAPE))
    row("torch.empty(...).uniform_() (mt19937)", lambda: out.uniform_())
    row("old hash, eager", old_uniform, old_keys, step, SHAPE)
    if native:
        row("new: rng.uniform, C kernel (eager)", rng.uniform, keys, step, SHAPE)
        row("new: rng.uniform_into, C kernel (eager)", rng.uniform_into, out, keys, step)
        runs = ((16, 41), (29, 54))  # the arithmetic task's two operand runs
        bufs = (out, torch.empty(S, SHAPE[0], len(runs)))
        row("rng.sample on U[1,2] + 2 row sums, into buffers", rng.sample, keys, step, SHAPE,
            ((1.0, 2.0),), runs, bufs)
        lib = rng._lib_state["lib"]
        for level in range(int(lib.nalu_rng_isa()) - 1, -1, -1):  # the lower instruction sets, same bits
            lib.nalu_rng_force_isa(level)
            try:
                row(f"  the same, {rng.ISA_NAMES[level]} (forced)", rng.sample, keys, step, SHAPE,
                    ((1.0, 2.0),), runs, bufs)
            finally:
                lib.nalu_rng_force_portable(0)
        row("  the same by torch: uniform, map, 2 slice sums",
            lambda: (lambda x: (x, x[..., 16:41].sum(-1), x[..., 29:54].sum(-1)))(
                rng.uniform(keys, step, SHAPE) * 1.0 + 1.0))
    row("new: torch ops, eager (fallback / no compiler)", rng._uniform_torch, keys, step, n)
    row("(memory floor: out.fill_(0.5))", lambda: out.fill_(0.5))

    if not args.quick:
        torch._dynamo.reset()
        old_c = torch.compile(old_uniform, dynamic=False)
        new_c = torch.compile(rng.uniform, dynamic=False)
        ops_c = torch.compile(rng._uniform_torch, dynamic=False)
        row("old hash, torch.compile", old_c, old_keys, step, SHAPE)
        row("new: rng.uniform under torch.compile" + (" (C custom op)" if native else ""), new_c, keys, step, SHAPE)
        row("new: torch ops under torch.compile (inductor C++)", ops_c, keys, step, n)
        assert torch.equal(new_c(keys, step, SHAPE), rng.uniform(keys, step, SHAPE))
        assert torch.equal(ops_c(keys, step, n).view(S, *SHAPE), rng.uniform(keys, step, SHAPE))

    if args.diagnose:
        diagnose(old_keys)


def diagnose(keys: torch.Tensor) -> None:
    """Inductor's AVX2 ``Vectorized<int32_t>::loadu(ptr, count)`` has no full-vector fast
    path: it memcpy's through a stack buffer (two 16-byte stores, one 32-byte load), which
    stalls store-to-load forwarding on every int32 *load*. Index vectors built in-kernel from
    ``arange`` avoid it but cost ~20 scalar insert instructions per 8 lanes."""
    print("diagnosis: (idx ^ key).float() for 1.28 M elements, one thread")
    idx = torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.int32).view(1, *SHAPE)

    def from_arange(keys):
        i = torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.int32).view(1, *SHAPE)
        return (i ^ keys.to(torch.int32).view(-1, 1, 1)).to(torch.float32)

    def from_input(keys, i):
        return (i ^ keys.to(torch.int32).view(-1, 1, 1)).to(torch.float32)

    torch._dynamo.reset()
    row("eager, index as input", from_input, keys, idx)
    row("compiled, index from arange (scalar inserts)", torch.compile(from_arange, dynamic=False), keys)
    row("compiled, index as int32 input (store-fwd stall)", torch.compile(from_input, dynamic=False), keys, idx)


if __name__ == "__main__":
    main()
