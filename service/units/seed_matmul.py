"""Seed-batched matrix products whose every seed is computed from its own data alone, in an
order fixed by the shapes of one seed: the GPU's matmul for the units.

``torch.bmm`` on a GPU hands each call to cuBLAS, which picks its kernel (tile sizes,
split-K, a gemv path for one column) from the whole call's shape, the seed count among
it; ``torch.compile`` may also rewrite a product over one seed into a plain ``mm``. So a
seed's products, and from them its trajectory, could change with its batch mates
(issue 35: a recurrent seed trained alone and among three others parted on an H200).
`seed_mm` is one Triton kernel with fixed tiles: program ``(seed, tile)`` sums its dot
products over ``K`` in blocks of `BLOCK_K`, in IEEE float32 (no TF32), so a seed's numbers
depend on its own operands and on ``(M, N, K)``, never on how many seeds share the call.

It is the custom operator ``nalu_sweep::seed_mm`` with its own backward (two more
`seed_mm` calls), so ``torch.compile`` keeps it whole and CUDA graphs capture it. The
units take it for float32 on CUDA (`use_on`); on a CPU they keep their native kernels.
Triton's interpreter (``TRITON_INTERPRET=1``) runs it on CPU tensors, for the tests.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the units keep their CPU paths
    triton = None

BLOCK_K = 32
"""Inputs summed per block: the order of a dot product's additions depends on it alone."""


def use_on(*tensors: Tensor) -> bool:
    """Whether the units compute their products with `seed_mm` for these operands:
    float32 on CUDA, with Triton installed."""
    return triton is not None and all(t.is_cuda and t.dtype == torch.float32 for t in tensors)


def _blocks(m: int, n: int) -> tuple[int, int]:
    """Tile rows and columns, from one seed's shape (never from the seed count)."""
    return (16 if m <= 16 else 64), (16 if n <= 16 else 32)


if triton is not None:
    @triton.jit
    def _seed_mm_kernel(a, b, c, seeds, m, n, k,
                        sas, sam, sak, sbs, sbk, sbn, scs, scm, scn,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        tiles_m = tl.cdiv(m, BM)
        tiles_n = tl.cdiv(n, BN)
        per_seed = tiles_m * tiles_n
        s = pid // per_seed
        tile = pid % per_seed
        rm = (tile // tiles_n) * BM + tl.arange(0, BM).to(tl.int64)
        rn = (tile % tiles_n) * BN + tl.arange(0, BN).to(tl.int64)
        rk = tl.arange(0, BK).to(tl.int64)
        a_seed = a + s * sas
        b_seed = b + s * sbs
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        k0 = 0
        while k0 < k:  # not range(): Triton 3.6's interpreter cannot loop to a runtime bound
            kk = k0 + rk
            a_tile = tl.load(a_seed + rm[:, None] * sam + kk[None, :] * sak,
                             mask=(rm[:, None] < m) & (kk[None, :] < k), other=0.0)
            b_tile = tl.load(b_seed + kk[:, None] * sbk + rn[None, :] * sbn,
                             mask=(kk[:, None] < k) & (rn[None, :] < n), other=0.0)
            acc = tl.dot(a_tile, b_tile, acc, input_precision="ieee")
            k0 += BK
        tl.store(c + s * scs + rm[:, None] * scm + rn[None, :] * scn, acc,
                 mask=(rm[:, None] < m) & (rn[None, :] < n))

    @torch.library.custom_op("nalu_sweep::seed_mm", mutates_args=())
    def seed_mm(a: Tensor, b: Tensor) -> Tensor:
        """``a [S, M, K] @ b [S, K, N] -> [S, M, N]`` (any strides; a stride of 0 shares one
        matrix among the seeds), every seed by itself (module docstring)."""
        if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
            raise ValueError(f"seed_mm takes [S, M, K] and [S, K, N], not {list(a.shape)} and {list(b.shape)}")
        seeds, m, k = a.shape
        n = b.shape[2]
        out = torch.empty((seeds, m, n), dtype=torch.float32, device=a.device)
        if out.numel() == 0:
            return out
        if k == 0:
            return out.zero_()
        bm, bn = _blocks(m, n)
        grid = (seeds * triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        _seed_mm_kernel[grid](a, b, out, seeds, m, n, k, *a.stride(), *b.stride(), *out.stride(),
                              BM=bm, BN=bn, BK=BLOCK_K)
        return out

    @seed_mm.register_fake
    def _(a: Tensor, b: Tensor) -> Tensor:
        return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))

    def _setup(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    def _backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        ga = seed_mm(grad, b.transpose(1, 2)) if ctx.needs_input_grad[0] else None
        gb = seed_mm(a.transpose(1, 2), grad) if ctx.needs_input_grad[1] else None
        return ga, gb

    seed_mm.register_autograd(_backward, setup_context=_setup)
