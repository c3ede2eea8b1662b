"""LSTM baseline cell (Hochreiter & Schmidhuber 1997), seed-batched: every seed has its
own weights ``[S, ...]`` and the gates of all seeds are one batched matmul per step
(`service.units.kernels.seed_products`: on a GPU a seed's products whatever its batch mates;
`add_bias`: a bias gradient summed over the rows in a fixed order).

``i, f, g, o = split(W_ih z_t + W_hh h_{t−1} + b)``; ``c_t = σ(f) c_{t−1} + σ(i) tanh(g)``;
``h_t = σ(o) tanh(c_t)``; output ``y_t = W_out h_t + b_out``. Init as torch's ``nn.LSTM``
and ``nn.Linear``: U[−1/√H, 1/√H]. It keeps its own state (h, c), so as a recurrent cell it
reads ``z_t`` only; used alone (`forward`) it is one step from the zero state.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from service.seeding.init_stream import InitStream
from service.units.base import ForwardContext, Unit
from service.units.kernels import add_bias, seed_products
from service.units.options import LSTMOptions
from service.units.registry import register


@register
class LSTM(Unit):
    """``lstm``: a recurrent baseline that interpolates but does not extrapolate."""

    name = "lstm"
    Options = LSTMOptions
    options: LSTMOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        hidden = self.options.hidden_size
        self.w_ih = self.seed_parameter(4 * hidden, self.in_features)
        self.w_hh = self.seed_parameter(4 * hidden, hidden)
        self.bias = self.seed_parameter(4 * hidden)
        self.w_out = self.seed_parameter(self.out_features, hidden)
        self.b_out = self.seed_parameter(self.out_features)

    def init_seed_(self, k: int, generator: InitStream) -> None:
        bound = 1.0 / math.sqrt(self.options.hidden_size)
        for p in (self.w_ih, self.w_hh, self.w_out):
            self.fill_weight_(p.data[k], generator, lambda w, g: g.uniform_(w, -bound, bound))
        for p in (self.bias, self.b_out):
            generator.uniform_(p.data[k], -bound, bound)

    def initial_state(self, batch: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
        zeros = torch.zeros(self.num_seeds, batch, self.options.hidden_size, device=device)
        return zeros, zeros.clone()

    def prepare(self, z: Tensor) -> Tensor:
        """The input part of the gates for every step at once: ``[S, B, L, 4H]``."""
        s, b, length, k = z.shape
        pre = add_bias(seed_products(z.reshape(s, b * length, k), self.w_ih.transpose(1, 2)), self.bias)
        return pre.view(s, b, length, -1)

    def step(self, pre: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        h, c = state
        gates = pre + seed_products(h, self.w_hh.transpose(1, 2))
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        y = add_bias(seed_products(h, self.w_out.transpose(1, 2)), self.b_out)
        return y, (h, c)

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        pre = self.prepare(x.unsqueeze(2))[:, :, 0]
        y, _ = self.step(pre, self.initial_state(x.shape[1], x.device))
        return y
