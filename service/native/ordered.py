"""Reductions in the fixed order of the native kernels, in torch ops.

The C kernels (``philox.c``, ``units.c``) add along a dimension in one order: eight lanes,
lane ``l`` accumulating elements ``l, l + 8, l + 16, ...`` from ``0.0`` (missing elements of
the last group count as ``0.0``), then ``((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))``.
`lane_sum` is that order in elementwise float32 torch ops, so a run without the kernels (no
C compiler, another device) gets the same bits as one with them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LANES = 8


def lane_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum of ``x`` over ``dim`` in the kernels' order (the dimension is removed)."""
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    groups = max(1, (n + LANES - 1) // LANES)
    if groups * LANES != n:
        x = F.pad(x, (0, groups * LANES - n))
    x = x.unflatten(-1, (groups, LANES))
    acc = x[..., 0, :] + 0.0  # 0.0 + first group, as the kernels start from 0.0 (-0.0 -> 0.0)
    for g in range(1, groups):
        acc = acc + x[..., g, :]
    pairs = acc[..., 0::2] + acc[..., 1::2]  # (l0 + l1), (l2 + l3), (l4 + l5), (l6 + l7)
    quads = pairs[..., 0::2] + pairs[..., 1::2]
    return quads[..., 0] + quads[..., 1]


def tree_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum of ``x`` over ``dim`` (removed) by pairwise additions of halves, in elementwise
    ops only: ``x[:h] + x[h:2h]`` (an odd element carried to the next level), log₂ n levels.
    The order depends on the dimension's length alone, never on the other dimensions: a
    GPU's reduction kernels split a row by how many rows there are (seeds, for a metric),
    so a seed's sum could change with its batch mates."""
    return _tree(x, dim, torch.add, 0.0)


def tree_prod(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Product of ``x`` over ``dim`` in `tree_sum`'s order (its gradient elementwise too)."""
    return _tree(x, dim, torch.mul, 1.0)


def _tree(x: torch.Tensor, dim: int, op, empty: float) -> torch.Tensor:
    x = x.movedim(dim, -1)
    if x.shape[-1] == 0:
        return torch.full(x.shape[:-1], empty, dtype=x.dtype, device=x.device)
    while x.shape[-1] > 1:
        n = x.shape[-1]
        half = n // 2
        paired = op(x[..., :half], x[..., half:2 * half])
        x = torch.cat([paired, x[..., 2 * half:]], -1) if n % 2 else paired
    return x[..., 0]
