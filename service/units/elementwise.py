"""``tanh`` and ``sigmoid`` that compute the same numbers compiled as eager, and for a seed
the same numbers whatever its batch mates.

**tanh.** Eager CPU ``torch.tanh`` (MKL's) is correctly rounded to within a few values in
10⁵ and returns ±1 from |x| ≥ 9.011, where the float32 rounding of tanh reaches 1; the code
inductor generates (Sleef's ``tanhf``, 1-ulp) returns ±1 already from |x| ≥ 8.665, so
in that band a NAC/NALU Ŵ got zero gradient in compiled runs only (the 2 → 1 NAC layer's
reference init range r ≈ 9.47 reaches it). Compiled on a CPU, tanh is evaluated in float64
and rounded once to the input's dtype: correctly rounded, so it saturates where eager does
(within one float32 step of 9.011) and equals eager's value but for those few values in 10⁵.
The gradient is eager's formula on the rounded output, ``g (1 − y²)``: zero exactly where
eager's is.

**sigmoid.** Eager CPU ``torch.sigmoid`` is not batch-independent: its vectorised loop
(Sleef's exp) and its scalar loop (``std::exp``, for a tensor's last few elements) differ in
the last bit for ~4% of inputs, so a seed's σ(M̂) depended on where its elements fell in
the ``[S, ...]`` tensor; ``sigmoid_backward`` likewise. Here σ(x) = 1 / (1 + exp(−x)) with
torch's exp (MKL's, the same numbers in every position) and the gradient is
``(g (1 − y)) y``, basic operations exactly rounded in either loop. It saturates where
``torch.sigmoid`` does (1 from 16.64, 0 below −88.72), compiled and eager alike.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _tanh_forward(x: Tensor) -> Tensor:
    if torch.compiler.is_compiling() and x.device.type == "cpu" and x.dtype != torch.float64:
        return torch.tanh(x.double()).to(x.dtype)
    return torch.tanh(x)


class _Tanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = _tanh_forward(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(g, y)


class _Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = 1 / (1 + torch.exp(-x))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return g * (1 - y) * y


def tanh(x: Tensor) -> Tensor:
    """``torch.tanh``, compiled or not: the same (correctly rounded) values and saturation."""
    return _Tanh.apply(x)


def sigmoid(x: Tensor) -> Tensor:
    """σ(x), batch-independent forward and gradient (``torch.sigmoid`` to an ulp)."""
    return _Sigmoid.apply(x)
