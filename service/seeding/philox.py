"""Philox4x32-10 in integer torch ops: the reference, CPU fallback and CUDA path of
`service.seeding.generator` (the C kernel in ``service/native/philox.c`` computes the same
integers).

Every 32-bit word is held in an int64 tensor (0 <= word < 2**32). The 32 x 32 -> 64-bit
products of the round function are computed exactly from 16-bit halves (every intermediate
below 2**49; nothing relies on integer overflow), so the same code gives the same bits on
any device, eager or compiled.
"""

from __future__ import annotations

import torch

M0, M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
ROUNDS = 10
MASK32 = 0xFFFF_FFFF
SCALE = 1.0 / 16777216.0  # 2**-24: a float is (word >> 8) * 2**-24


def mulhilo(x: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` 32-bit halves of ``m * x`` for int64 tensors ``0 <= x < 2**32``:
    with ``a = x * (m mod 2**16)`` and ``b = x * (m div 2**16)`` (both below 2**48),
    ``m x = a + b 2**16``, so ``hi = ((a >> 16) + b) >> 16`` and
    ``lo = (a + ((b mod 2**16) << 16)) mod 2**32``."""
    a = x * (m & 0xFFFF)
    b = x * (m >> 16)
    return ((a >> 16) + b) >> 16, (a + ((b & 0xFFFF) << 16)) & MASK32


def as_stream_keys(keys: torch.Tensor) -> torch.Tensor:
    """``[S, 3]`` int64 rows ``(k0, k1, seed_id)``; a 1-D tensor is read as seed ids under
    the key (0, 0)."""
    keys = keys.to(torch.int64)
    if keys.dim() == 1:
        keys = torch.stack([torch.zeros_like(keys), torch.zeros_like(keys), keys & MASK32], 1)
    if keys.dim() != 2 or keys.shape[1] != 3:
        raise ValueError(f"stream keys must be [S, 3] rows (k0, k1, seed_id), not {tuple(keys.shape)}")
    return keys


def blocks(keys: torch.Tensor, counter: torch.Tensor, nblocks: int, first: int = 0) -> torch.Tensor:
    """Words ``[S, nblocks, 4]`` (int64) of blocks ``first .. first + nblocks - 1`` (counter
    word c0) for stream keys ``[S, 3]`` at the 64-bit call ``counter`` (a 0-d int64 tensor)."""
    keys = as_stream_keys(keys)
    k0, k1 = keys[:, 0:1], keys[:, 1:2]  # [S, 1]
    counter = counter.to(device=keys.device, dtype=torch.int64)
    x0 = torch.arange(first, first + nblocks, dtype=torch.int64, device=keys.device).unsqueeze(0)  # [1, n]
    x1 = keys[:, 2:3]
    x2 = (counter & MASK32).expand(keys.shape[0], 1)
    x3 = ((counter >> 32) & MASK32).expand(keys.shape[0], 1)
    # words that are the same for every block of a seed stay [S, 1] until mixed in
    for r in range(ROUNDS):
        hi0, lo0 = mulhilo(x0, M0)
        hi1, lo1 = mulhilo(x2, M1)
        x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
        if r + 1 < ROUNDS:
            k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
    shape = (keys.shape[0], nblocks)
    return torch.stack([x0.expand(shape), x1.expand(shape), x2.expand(shape), x3.expand(shape)], -1)


def words(keys: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` words ``[S, n]`` (int64) of each stream: word ``i`` is word ``i % 4`` of
    block ``i // 4``."""
    nb = (n + 3) // 4
    b = blocks(keys, counter, nb)
    return b.reshape(b.shape[0], 4 * nb)[:, :n]


_EAGER_CHUNK = 1 << 14  # blocks per chunk of the eager CPU path (its temporaries stay in cache)


def uniform(keys: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    """U[0, 1) float32 ``[S, n]``: ``(word >> 8) * 2**-24`` (exact: 24 random mantissa bits).
    Eager on CPU in chunks of blocks: the temporaries stay in cache instead of each op
    allocating (and page-faulting) a multi-MB tensor."""
    keys = as_stream_keys(keys)
    S = keys.shape[0]
    if torch.compiler.is_compiling() or keys.device.type != "cpu" or S * n <= _EAGER_CHUNK:
        return (words(keys, counter, n) >> 8).to(torch.float32) * SCALE
    nb = (n + 3) // 4
    out = torch.empty(S, 4 * nb, dtype=torch.float32)
    step = max(1, _EAGER_CHUNK // S)
    for b in range(0, nb, step):
        w = blocks(keys, counter, min(step, nb - b), first=b)
        out[:, 4 * b:4 * b + w.shape[1] * 4] = (w.reshape(S, -1) >> 8).to(torch.float32) * SCALE
    return out[:, :n]
