"""Philox4x32-10 in Triton: the data streams of `service.seeding.generator`, bit for bit.

The same integers as the C kernel and the torch-ops reference (`service.seeding.philox`):
key ``(k0, k1)``, counter ``(c0, c1, c2, c3)`` = (block index, seed id, step low 32 bits,
step high 32 bits), ten rounds of the two 32 x 32 -> 64-bit multiplies (``tl.umulhi`` for
the high half, uint32 wrap-around for the low), element ``i`` of a call is word ``i % 4``
of block ``i // 4``, and the float is ``(word >> 8) · 2**-24``. The map onto the training
range is ``u · (hi − lo) + lo`` in float32 with no fused multiply-add (every kernel of the
engine is launched with ``enable_fp_fusion=False``), the formula of ``Range.from_uniform``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def philox4x32(c0, c1, c2, c3, k0, k1):
    """The four words of block ``(c0, c1, c2, c3)`` under key ``(k0, k1)`` (uint32 tensors of
    one shape)."""
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, 0xD2511F53)
        lo0 = c0 * 0xD2511F53
        hi1 = tl.umulhi(c2, 0xCD9E8D57)
        lo1 = c2 * 0xCD9E8D57
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _to_unit(word):
    return (word >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def draw_rows(keys_ptr, step, rows, I: tl.constexpr, IP: tl.constexpr, JOIN: tl.constexpr,
              lo, scale):
    """One seed's training inputs ``x [len(rows), IP]`` (float32) of ``step`` on the range
    ``U[lo, lo + scale)``, columns from ``I`` on zero. ``keys_ptr`` points at the seed's row
    ``(k0, k1, seed_id)``. ``JOIN`` (I a multiple of 4): one Philox call per block of four
    columns; else one per element (its block's word picked)."""
    k0 = tl.load(keys_ptr).to(tl.uint32)
    k1 = tl.load(keys_ptr + 1).to(tl.uint32)
    sid = tl.load(keys_ptr + 2).to(tl.uint32)
    step = step.to(tl.int64)
    c2 = (step & 0xFFFFFFFF).to(tl.uint32)
    c3 = ((step >> 32) & 0xFFFFFFFF).to(tl.uint32)
    cols = tl.arange(0, IP)
    if JOIN:
        blk = tl.arange(0, IP // 4)
        c0 = (rows[:, None] * (I // 4) + blk[None, :]).to(tl.uint32)
        z = c0 * 0
        w0, w1, w2, w3 = philox4x32(c0, z + sid, z + c2, z + c3, z + k0, z + k1)
        words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), (rows.shape[0], IP))
    else:
        e = rows[:, None].to(tl.int64) * I + cols[None, :]
        c0 = (e // 4).to(tl.uint32)
        z = c0 * 0
        w0, w1, w2, w3 = philox4x32(c0, z + sid, z + c2, z + c3, z + k0, z + k1)
        q = e % 4
        words = tl.where(q == 0, w0, tl.where(q == 1, w1, tl.where(q == 2, w2, w3)))
    x = _to_unit(words) * scale + lo
    return tl.where(cols[None, :] < I, x, 0.0)


@triton.jit(do_not_specialize=["step"])
def draw_kernel(out_ptr, keys_ptr, step, B: tl.constexpr, I: tl.constexpr, IP: tl.constexpr,
                JOIN: tl.constexpr, lo, scale):
    """``out [S, B, I]``: every seed's batch of ``step`` (the contract tests' view of the draw)."""
    s = tl.program_id(0)
    rows = tl.arange(0, B)
    x = draw_rows(keys_ptr + 3 * s, step, rows, I, IP, JOIN, lo, scale)
    cols = tl.arange(0, IP)
    ptrs = out_ptr + s * B * I + rows[:, None] * I + cols[None, :]
    tl.store(ptrs, x, mask=cols[None, :] < I)
