"""The training batch drawn and the model's first linear layer applied, a few seeds at a time.

A step draws each seed's batch ``x [S, B, I]`` (`service.seeding.generator.sample`) and the
first layer multiplies it by its weights (`service.units.kernels.linear`). Done one after
the other, the layer reads the whole batch back: at S = 1,000 that is 51 MB, from memory.
`sample_linear` does both tile by tile of seeds in one native call (``nalu_sample_linear``
in ``service/native/units.c``): a tile's batch is drawn, then multiplied while it is in
cache. Each seed's numbers come from the same per-seed routines either way, so the batch,
the operand sums and the layer's output are bit for bit those of `sample` then `linear`,
whatever the tile and the seed count.

The weight gradient is `kernels`' (``linear_dw``: it reads the batch once more, after the
rest of the model has run). Where either native library cannot be had, `sample_linear` is
`sample` then `linear` (`available` says which).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from service import native
from service.seeding import generator as rng
from service.units import kernels

TILE_BYTES = 1 << 18
"""A tile's batch at most (256 KiB: inside every x86-64 core's L2), at least one seed."""

@native.compile_time_constant
def available() -> bool:
    """Whether `sample_linear` runs as one native pass (both the generator's and the units'
    kernels built, AVX2 and FMA); else it is `sample` then `linear`, with the same bits."""
    return rng.native_available() and kernels.native_available()


def tile_seeds(rows: int, cols: int) -> int:
    """Seeds per tile for batches of ``rows × cols`` float32."""
    return max(1, TILE_BYTES // max(1, rows * cols * 4))


def _native(x: Tensor, sums: Tensor, z: Tensor, keys: Tensor, counter: int, w: Tensor,
            intervals: rng.Intervals, runs: tuple[tuple[int, int], ...]) -> None:
    S, rows, cols = x.shape
    draw, (n_iv, lows, offsets, total, k, starts, ends) = rng.native_draw(intervals, runs)
    if keys.dtype != torch.int64 or not keys.is_contiguous():
        keys = keys.to(torch.int64).contiguous()
    status = kernels.native_library().nalu_sample_linear(
        draw, tile_seeds(rows, cols), z.data_ptr(), w.data_ptr(), w.shape[1], x.data_ptr(), keys.data_ptr(),
        S, counter, rows, cols, n_iv, lows, offsets, total, sums.data_ptr() if k else None, k, starts, ends)
    if status != 0:
        raise RuntimeError(f"nalu_sample_linear failed ({status})")


def _op(keys: Tensor, counter: Tensor, rows: int, cols: int, lows: list[float], highs: list[float],
        starts: list[int], ends: list[int], w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    S = keys.shape[0]
    x = torch.empty(S, rows, cols, dtype=torch.float32)
    sums = torch.empty(S, rows, len(starts), dtype=torch.float32)
    z = torch.empty(S, rows, w.shape[1], dtype=torch.float32)
    _native(x, sums, z, keys, int(counter), w.contiguous(), tuple(zip(lows, highs)), tuple(zip(starts, ends)))
    return x, sums, z


OPS = torch.library.Library("nalu_sweep", "FRAGMENT")
OPS.define("sample_linear(Tensor keys, Tensor counter, int rows, int cols, float[] lows, float[] highs, "
           "int[] starts, int[] ends, Tensor w) -> (Tensor, Tensor, Tensor)")
OPS.impl("sample_linear", _op, "CPU")


@torch.library.register_fake("nalu_sweep::sample_linear")
def _(keys, counter, rows, cols, lows, highs, starts, ends, w):
    S = keys.shape[0]
    return (keys.new_empty((S, rows, cols), dtype=torch.float32),
            keys.new_empty((S, rows, len(starts)), dtype=torch.float32),
            keys.new_empty((S, rows, w.shape[1]), dtype=torch.float32))


class _SampleLinear(torch.autograd.Function):
    """``(x, sums, z)``: the batch, its operand sums and ``z = x wᵀ``; the gradient of ``w``
    by `kernels`' weight gradient (``x`` and ``sums`` are data: no gradient)."""

    @staticmethod
    def forward(ctx, w: Tensor, keys: Tensor, counter: Tensor, plan: tuple, out: tuple | None):
        rows, cols, intervals, runs = plan
        if torch.compiler.is_compiling():
            x, sums, z = torch.ops.nalu_sweep.sample_linear(
                keys, torch.as_tensor(counter, dtype=torch.int64), rows, cols,
                [lo for lo, _ in intervals], [hi for _, hi in intervals],
                [a for a, _ in runs], [e for _, e in runs], w)
        else:
            S = keys.shape[0]
            x, sums = out if out is not None else (torch.empty(S, rows, cols), torch.empty(S, rows, len(runs)))
            z = torch.empty(S, rows, w.shape[1], dtype=torch.float32)
            _native(x, sums, z, keys, int(counter), w, intervals, runs)
        ctx.save_for_backward(x)
        ctx.mark_non_differentiable(x, sums)
        return x, sums, z

    @staticmethod
    @once_differentiable
    def backward(ctx, gx: Tensor | None, gsums: Tensor | None, gz: Tensor) -> tuple:
        (x,) = ctx.saved_tensors
        return kernels.weight_gradient(gz, x), None, None, None, None


def usable(keys: Tensor, w: Tensor, shape: tuple[int, int], intervals: rng.Intervals) -> bool:
    """Whether `sample_linear` takes its native pass for these operands (CPU float32, a
    narrow contiguous ``w [S, out, cols]``, a range `sample`'s kernel takes); it depends
    on the structure alone, never on the number of seeds."""
    return (keys.device.type == "cpu" and w.device.type == "cpu" and w.dtype == torch.float32
            and w.dim() == 3 and w.is_contiguous() and w.shape[0] == keys.shape[0]
            and w.shape[2] == shape[-1] and 1 <= w.shape[1] <= kernels.MAX_OUT
            and len(intervals) <= rng.MAX_INTERVALS and available())


def sample_linear(keys: Tensor, counter: Tensor | int, shape: tuple[int, int], intervals: rng.Intervals,
                  row_sums: tuple[tuple[int, int], ...], w: Tensor,
                  out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``x, sums = sample(keys, counter, shape, intervals, row_sums)`` and ``z = linear(x, w)``
    (``w [S, out, shape[-1]]``), bit for bit, in one pass tile by tile where `usable`;
    ``out``: `sample`'s buffers (eager only)."""
    shape, intervals, row_sums, rows, cols = rng.sample_plan(shape, intervals, row_sums)
    if len(shape) != 2 or not usable(keys, w, shape, intervals):
        x, sums = rng.sample(keys, counter, shape, intervals, row_sums, out=out)
        return x, sums, kernels.linear(x, w)
    if out is not None and not all(b.is_contiguous() and b.dtype == torch.float32 and tuple(b.shape) == s
                                   for b, s in zip(out, ((keys.shape[0], rows, cols),
                                                         (keys.shape[0], rows, len(row_sums))))):
        out = None
    return _SampleLinear.apply(w, keys, counter, (rows, cols, intervals, row_sums), out)
