"""Counter-based uniform numbers, one stream per (master seed, stream name, seed id).

``uniform(keys, counter, shape)`` is a pure function of (stream key, counter, element index):
a seed's data never depends on which other seeds share its batch, needs no generator state,
and is cheap on CPU or GPU, eager or inside ``torch.compile``.

The generator: Philox4x32-10
----------------------------
The counter-based generator of Random123 (Salmon et al., SC 2011), also cuRAND's
``Philox4_32_10`` (behind PyTorch's CUDA random numbers) and TensorFlow's ``philox``: ten
rounds of two 32 x 32 -> 64-bit multiplies (0xD2511F53, 0xCD9E8D57) on a 128-bit counter
under a 64-bit key bumped by the Weyl increments (0x9E3779B9, 0xBB67AE85); the paper finds
it passes TestU01's BigCrush with rounds to spare.

Layout (`service.seeding.streams`): ``keys`` holds int64 rows ``(k0, k1, seed_id)``::

    key     = (k0, k1)                 64-bit hash of (master seed, stream name)
    counter = (c0, c1, c2, c3)         c0 = block index i // 4, c1 = seed id,
                                       (c2, c3) = the call counter (low, high 32 bits)
    element i of a call = word i % 4 of block i // 4
    float   = (word >> 8) * 2**-24     exact: U[0, 1) with 24 random mantissa bits

For a fixed key Philox is a bijection of the counter, so distinct seed ids (< 2**32) or
distinct call counters never share a block: no seed's stream is another's, by
construction. One call gives at most 2**31 numbers per seed (c0 < 2**29 is far from
wrapping).

Implementations, bit-for-bit identical
--------------------------------------
* CPU: the C kernel ``service/native/philox.c`` (AVX-512 when the CPU has it, eight blocks
  per 512-bit vector with ``_mm512_mul_epu32``; else AVX2, four blocks per 256-bit vector;
  else portable C: the level is the CPU's, never the run's, and every level gives the same
  integers), compiled once with the system
  C compiler into a private per-user cache (see `service.native`) and called through
  ctypes; inside ``torch.compile`` the opaque op ``nalu_sweep::rng_uniform``.
* Otherwise (CUDA and any other device, no C compiler, ``NALU_SWEEP_RNG_NATIVE=0`` or
  ``NALU_SWEEP_NATIVE=0``): `service.seeding.philox`, the same integers from int64 torch
  ops (exact 32 x 32 -> 64 products from 16-bit halves of the multiplier, nothing relies on
  integer overflow); fused by inductor/triton when
  compiled. The CUDA path is exactly this torch-ops code.

Training batches: `sample`
--------------------------
``sample(keys, counter, shape, intervals, row_sums)`` is ``uniform`` mapped onto a range
(a union of intervals, `map_to_intervals`, the formula of ``Range.from_uniform``) plus the
sums of runs of each row (the operands of the subset tasks). The C kernel does all three
in one pass, chunk by chunk in L1; ``x`` is bit-for-bit the torch formula and the sums are
added in one fixed order on every path (`service.native.ordered.lane_sum`: eight strided
lanes, then a pairwise tree), so native and fallback runs see the same targets. Inside
``torch.compile`` it is the op ``nalu_sweep::rng_sample``.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from service import native
from service.native.ordered import lane_sum
from service.seeding import philox

__all__ = ["uniform", "uniform_into", "sample", "sample_plan", "map_to_intervals", "native_available",
           "native_draw"]

MAX_INTERVALS = 8
"""Most intervals of a range the native kernel maps to (its ``NALU_MAX_INTERVALS``)."""
_ENV_NATIVE = "NALU_SWEEP_RNG_NATIVE"  # "0" forces the torch-ops path
_uniform_torch = philox.uniform


_lib_state: dict[str, object] = {}  # "fn": a ctypes function or None; "isa"; "error"; "draw": an address
ISA_NAMES = ("portable C", "AVX2", "AVX-512")
"""The native draw's instruction sets by the level ``nalu_rng_isa`` returns (same bits on all)."""


def _setup(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.nalu_rng_force_portable.restype = None
    lib.nalu_rng_force_portable.argtypes = [ctypes.c_int]
    lib.nalu_rng_force_isa.restype = None
    lib.nalu_rng_force_isa.argtypes = [ctypes.c_int]
    lib.nalu_rng_isa.restype = ctypes.c_int
    lib.nalu_philox_raw.restype = None
    lib.nalu_philox_raw.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    lib.nalu_rng_uniform.restype = None
    lib.nalu_rng_uniform.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    lib.nalu_rng_sample.restype = ctypes.c_int
    lib.nalu_rng_sample.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float), ctypes.c_float,
        ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
    ]
    return lib


def _lib() -> ctypes.CDLL | None:
    """The compiled kernel library, or None when it cannot be had (built once per process)."""
    if "lib" not in _lib_state:
        lib = native.load("philox", _setup, env=_ENV_NATIVE)
        if lib is not None:
            _lib_state["isa"] = int(lib.nalu_rng_isa())
            _lib_state["fn"] = lib.nalu_rng_uniform
        else:
            _lib_state["fn"] = None
            _lib_state["error"] = native.errors.get("philox", "disabled")
        _lib_state["lib"] = lib
    return _lib_state["lib"]  # type: ignore[return-value]


def _native_fn():
    _lib()
    return _lib_state["fn"]


@native.compile_time_constant
def native_available() -> bool:
    """Whether CPU draws use the compiled C kernel (builds it on first use)."""
    return _lib() is not None


def _fill_native(out: torch.Tensor, keys: torch.Tensor, counter: int, n: int) -> None:
    keys = keys.to(torch.int64).contiguous()
    _native_fn()(out.data_ptr(), keys.data_ptr(), keys.shape[0], int(counter), n)


# The ops run inside compiled graphs. Declared with `torch.library.Library` (~6 µs a call)
# rather than `torch.library.custom_op` (~25 µs): they need no autograd and no Python-side
# argument processing.
OPS = torch.library.Library("nalu_sweep", "FRAGMENT")
OPS.define("rng_uniform(Tensor keys, Tensor counter, int n) -> Tensor")
OPS.define("rng_sample(Tensor keys, Tensor counter, int rows, int cols, float[] lows, float[] highs, "
           "int[] starts, int[] ends) -> (Tensor, Tensor)")


def _rng_uniform_op(keys: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.empty(keys.shape[0], n, dtype=torch.float32)
    _fill_native(out, keys, int(counter), n)
    return out


OPS.impl("rng_uniform", _rng_uniform_op, "CPU")


@torch.library.register_fake("nalu_sweep::rng_uniform")
def _(keys: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    return keys.new_empty((keys.shape[0], n), dtype=torch.float32)


# -- intervals and row sums -------------------------------------------------------------------
Intervals = tuple[tuple[float, float], ...]


def _interval_constants(intervals: Intervals) -> tuple[float, list[float], list[float]]:
    """(total length, lower ends, start offsets) as the float32 values the maps use."""
    lengths = [hi - lo for lo, hi in intervals]
    offsets, acc = [0.0], 0.0
    for length in lengths[:-1]:
        acc += length
        offsets.append(acc)
    return sum(lengths), [lo for lo, _ in intervals], offsets


def map_to_intervals(u: torch.Tensor, intervals: Intervals) -> torch.Tensor:
    """Map U[0, 1) numbers onto a union of disjoint intervals ``((lo, hi), ...)``, each
    getting its share of the total length: ``s = u · Σ lengths``, ``x = s + lo_0``, and
    ``x = (s − offset_k) + lo_k`` where ``s ≥ offset_k`` (``offset_k`` = the lengths before
    interval k). The native `sample` computes exactly these float operations."""
    if len(intervals) == 1:
        lo, hi = intervals[0]
        return u * (hi - lo) + lo
    total, lows, offsets = _interval_constants(intervals)
    s = u * total
    out = s + lows[0]
    for lo, offset in zip(lows[1:], offsets[1:]):
        out = torch.where(s >= offset, s - offset + lo, out)
    return out


@functools.lru_cache(maxsize=64)
def _sample_args(intervals: Intervals, runs: tuple[tuple[int, int], ...]) -> tuple:
    """The kernel's constant arguments for a range and its runs (ctypes arrays, cached)."""
    if len(intervals) > MAX_INTERVALS:
        raise ValueError(f"sample: at most {MAX_INTERVALS} intervals")
    total, lows, offsets = _interval_constants(intervals)
    k = len(runs)
    lo_arr = (ctypes.c_float * len(lows))(*lows)
    off_arr = (ctypes.c_float * len(offsets))(*offsets)
    starts = (ctypes.c_int64 * max(k, 1))(*[a for a, _ in runs])
    ends = (ctypes.c_int64 * max(k, 1))(*[e for _, e in runs])
    return len(lows), lo_arr, off_arr, total, k, starts, ends


def _sample_native(x: torch.Tensor, sums: torch.Tensor, keys: torch.Tensor, counter: int,
                   intervals: Intervals, runs: tuple[tuple[int, int], ...]) -> None:
    cols = x.shape[-1]
    n_iv, lo_arr, off_arr, total, k, starts, ends = _sample_args(intervals, runs)
    if keys.dtype != torch.int64 or not keys.is_contiguous():
        keys = keys.to(torch.int64).contiguous()
    _lib_state["lib"].nalu_rng_sample(
        x.data_ptr(), keys.data_ptr(), keys.shape[0], counter, x[0].numel() // cols, cols,
        n_iv, lo_arr, off_arr, total, sums.data_ptr() if k else None, k, starts, ends,
    )


def native_draw(intervals: Intervals, runs: tuple[tuple[int, int], ...]) -> tuple[int, tuple]:
    """For a native kernel that draws training batches itself (`service.units.sampled_linear`):
    the address of the C function behind `sample` (``nalu_rng_sample``) and its arguments
    that depend on ``intervals`` and ``runs`` alone, in its order (``n_iv, lows, offsets,
    total, K, starts, ends``). Only where `native_available`."""
    if "draw" not in _lib_state:
        lib = _lib()
        if lib is None:
            raise RuntimeError("native_draw: the native generator is not available")
        _lib_state["draw"] = ctypes.cast(lib.nalu_rng_sample, ctypes.c_void_p).value
    return _lib_state["draw"], _sample_args(intervals, runs)


def sample_plan(shape: tuple[int, ...], intervals: Intervals, row_sums: tuple[tuple[int, int], ...]
                ) -> tuple:
    """`sample`'s arguments checked and normalised: ``(shape, intervals, row_sums, rows, cols)``
    (raises ``ValueError`` on arguments `sample` refuses)."""
    if torch.compiler.is_compiling():
        return _sample_plan.__wrapped__(shape, intervals, row_sums)
    try:
        return _sample_plan(shape, intervals, row_sums)
    except TypeError:  # lists somewhere: not hashable
        return _sample_plan.__wrapped__(shape, intervals, row_sums)


def _rng_sample_op(keys: torch.Tensor, counter: torch.Tensor, rows: int, cols: int,
                   lows: list[float], highs: list[float], starts: list[int], ends: list[int]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.empty(keys.shape[0], rows, cols, dtype=torch.float32)
    sums = torch.empty(keys.shape[0], rows, len(starts), dtype=torch.float32)
    _sample_native(x, sums, keys, int(counter), tuple(zip(lows, highs)), tuple(zip(starts, ends)))
    return x, sums


OPS.impl("rng_sample", _rng_sample_op, "CPU")


@torch.library.register_fake("nalu_sweep::rng_sample")
def _(keys, counter, rows, cols, lows, highs, starts, ends):
    return (keys.new_empty((keys.shape[0], rows, cols), dtype=torch.float32),
            keys.new_empty((keys.shape[0], rows, len(starts)), dtype=torch.float32))


# -- public API ------------------------------------------------------------------------------
def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def uniform(keys: torch.Tensor, counter: torch.Tensor | int, shape: tuple[int, ...]) -> torch.Tensor:
    """U[0, 1) float32 of shape ``[S, *shape]`` for per-seed stream ``keys`` ``[S, 3]`` (rows
    ``(k0, k1, seed_id)`` from `service.seeding.stream_keys`; a 1-D tensor is read as seed ids
    under the key (0, 0)) at ``counter``.

    ``counter`` is usually the training step (a 0-d int64 tensor so a compiled step is not
    re-traced), possibly with stream bits above 2**32; distinct (key, seed id, counter)
    triples give distinct Philox blocks.  Row ``k`` depends only on ``keys[k]``, ``counter``
    and ``shape``.
    """
    shape = tuple(int(d) for d in shape)
    n = _numel(shape)
    if n >= 1 << 31:
        raise ValueError(f"uniform: {n} numbers per seed is more than the 2**31 one call gives")
    keys = philox.as_stream_keys(keys)
    S = keys.shape[0]
    if keys.device.type == "cpu" and S > 0 and n > 0 and native_available():
        if torch.compiler.is_compiling():
            c = torch.as_tensor(counter, dtype=torch.int64)
            return torch.ops.nalu_sweep.rng_uniform(keys, c, n).view(S, *shape)
        out = torch.empty(S, n, dtype=torch.float32)
        _fill_native(out, keys, int(counter), n)
        return out.view(S, *shape)
    c = torch.as_tensor(counter, dtype=torch.int64, device=keys.device)
    return _uniform_torch(keys, c, n).view(S, *shape)


def uniform_into(out: torch.Tensor, keys: torch.Tensor, counter: torch.Tensor | int) -> torch.Tensor:
    """Write ``uniform(keys, counter, out.shape[1:])`` into ``out`` (float32 ``[S, ...]``) and
    return it; on CPU with the native kernel no temporary is allocated (eager only)."""
    keys = philox.as_stream_keys(keys)
    if out.dtype != torch.float32 or out.shape[0] != keys.shape[0]:
        raise ValueError("uniform_into: out must be float32 with one row per key")
    n = _numel(tuple(out.shape[1:]))
    if (out.device.type == "cpu" and keys.device.type == "cpu" and out.is_contiguous()
            and n > 0 and not torch.compiler.is_compiling() and native_available()):
        _fill_native(out, keys, int(counter), n)
        return out
    out.copy_(uniform(keys, counter, tuple(out.shape[1:])))
    return out


def sample(
    keys: torch.Tensor,
    counter: torch.Tensor | int,
    shape: tuple[int, ...],
    intervals: Intervals = ((0.0, 1.0),),
    row_sums: tuple[tuple[int, int], ...] = (),
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x = map_to_intervals(uniform(keys, counter, shape), intervals)`` (bit-for-bit) and the
    sums of runs of its last dimension: ``sums[..., j] = lane_sum(x[..., a_j:e_j])`` for
    ``row_sums = ((a_0, e_0), ...)``, shape ``[S, *shape[:-1], len(row_sums)]``.

    The native CPU kernel writes x and its sums in one pass (no U[0, 1) temporary, the sums
    while each row is in cache); both paths add in `lane_sum`'s order, so their sums are
    bit-for-bit equal (torch's ``sum`` may differ in the last bits). ``out = (x, sums)``: contiguous float32
    buffers to fill instead of allocating (eager only; ignored when compiling or off CPU).
    """
    shape, intervals, row_sums, rows, cols = sample_plan(shape, intervals, row_sums)
    keys = philox.as_stream_keys(keys)
    S = keys.shape[0]
    n = rows * cols
    sums_shape = (S, *shape[:-1], len(row_sums))
    if (keys.device.type == "cpu" and S > 0 and n > 0 and len(intervals) <= MAX_INTERVALS
            and native_available()):
        if torch.compiler.is_compiling():
            c = torch.as_tensor(counter, dtype=torch.int64)
            x, sums = torch.ops.nalu_sweep.rng_sample(
                keys, c, rows, cols, [lo for lo, _ in intervals], [hi for _, hi in intervals],
                [a for a, _ in row_sums], [e for _, e in row_sums])
            return x.view(S, *shape), sums.view(sums_shape)
        if out is not None and _usable_buffers(out, (S, *shape), sums_shape):
            x, sums = out
        else:
            x = torch.empty((S, *shape), dtype=torch.float32)
            sums = torch.empty(sums_shape, dtype=torch.float32)
        _sample_native(x, sums, keys, int(counter), intervals, row_sums)
        return x, sums
    x = map_to_intervals(uniform(keys, counter, shape), intervals)
    if row_sums:
        sums = torch.stack([lane_sum(x[..., a:e]) for a, e in row_sums], -1)
    else:
        sums = x.new_empty(sums_shape)
    return x, sums


@functools.lru_cache(maxsize=256)
def _sample_plan(shape, intervals, row_sums) -> tuple:
    """Checked, normalised arguments of `sample`: (shape, intervals, row_sums, rows, cols)."""
    shape = tuple(int(d) for d in shape)
    intervals = tuple((float(lo), float(hi)) for lo, hi in intervals)
    row_sums = tuple((int(a), int(e)) for a, e in row_sums)
    if not shape:
        raise ValueError("sample: shape needs at least one dimension (the row)")
    if not intervals:
        raise ValueError("sample: at least one interval")
    cols = shape[-1]
    for a, e in row_sums:
        if not 0 <= a < e <= cols:
            raise ValueError(f"sample: row sum range [{a}, {e}) is not inside rows of {cols}")
    n = _numel(shape)
    if n >= 1 << 31:
        raise ValueError(f"sample: {n} numbers per seed is more than the 2**31 one stream holds")
    return shape, intervals, row_sums, (n // cols if cols else 0), cols


def _usable_buffers(out: tuple[torch.Tensor, torch.Tensor], x_shape: tuple[int, ...],
                    sums_shape: tuple[int, ...]) -> bool:
    return all(
        b.device.type == "cpu" and b.dtype == torch.float32 and b.is_contiguous() and tuple(b.shape) == shape
        for b, shape in zip(out, (x_shape, sums_shape))
    )
