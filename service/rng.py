"""Counter-based uniform numbers, one independent stream per training seed.

``uniform(keys, counter, shape)`` is a pure function of (key, counter, element index): a
seed's data never depends on which other seeds share its batch, needs no generator state,
and is cheap to fuse into a compiled training step on CPU or GPU.
"""

from __future__ import annotations

import torch

_M1 = 0x7FEB352D
_M2 = 0x846CA68B - (1 << 32)  # as signed int32


def _mix32(v: torch.Tensor) -> torch.Tensor:
    """The 'lowbias32' integer hash on int32 tensors (logical shifts via masks)."""
    v = v ^ ((v >> 16) & 0xFFFF)
    v = v * _M1
    v = v ^ ((v >> 15) & 0x1FFFF)
    v = v * _M2
    v = v ^ ((v >> 16) & 0xFFFF)
    return v


def uniform(keys: torch.Tensor, counter: torch.Tensor | int, shape: tuple[int, ...]) -> torch.Tensor:
    """U[0, 1) float32 of shape ``[S, *shape]`` for per-seed ``keys`` ``[S]`` at ``counter``.

    ``counter`` is usually the training step (a 0-d int64 tensor so a compiled step is not
    re-traced); distinct (key, counter) pairs give independent-looking streams.
    """
    n = 1
    for d in shape:
        n *= d
    device = keys.device
    counter = torch.as_tensor(counter, dtype=torch.int64, device=device)
    k = keys.to(torch.int32)
    lo = (counter & 0x7FFF_FFFF).to(torch.int32)
    hi = (counter >> 31).to(torch.int32)
    step_key = _mix32(_mix32(k ^ lo) ^ (hi + 0x2545F491))  # [S]
    idx = torch.arange(n, dtype=torch.int32, device=device).view(1, *shape)
    v = _mix32(_mix32(idx ^ step_key.view(-1, *([1] * len(shape)))) + k.view(-1, *([1] * len(shape))))
    return ((v >> 8) & 0xFFFFFF).to(torch.float32) * (1.0 / 16777216.0)
