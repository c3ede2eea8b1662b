"""Multi-layer perceptron: the baseline that interpolates but does not extrapolate.

``in -> hidden_sizes... -> out`` with biases and one activation between layers (none after
the last). Init as torch's ``nn.Linear``: weights and biases U[−1/√fan_in, 1/√fan_in]; a
non-default initialisation replaces the weights' init (biases keep theirs). ``prelu`` has
one learnable slope per seed and hidden layer, initialised to 0.25.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from service.seeding.init_stream import InitStream
from service.units import elementwise
from service.units.base import ExactMode, ForwardContext, Unit
from service.units.kernels import add_bias
from service.units.linear import linear_forward
from service.units.options import MLPOptions
from service.units.registry import register

PRELU_INIT = 0.25

_FIXED = {
    "relu": torch.relu,
    "relu6": F.relu6,
    "sigmoid": elementwise.sigmoid,
    "tanh": elementwise.tanh,
    "leaky_relu": F.leaky_relu,
    "elu": F.elu,
    "selu": F.selu,
    "silu": F.silu,
    "none": lambda h: h,
}


@register
class MLP(Unit):
    """``mlp``. Parameters ``weights[l]`` ``[S, out_l, in_l]``, ``biases[l]`` ``[S, out_l]``
    and, for prelu, ``prelu_slope`` ``[S, len(hidden_sizes)]``. Not exact for any mode."""

    name = "mlp"
    Options = MLPOptions
    options: MLPOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        sizes = [self.in_features, *self.options.hidden_sizes, self.out_features]
        self.weights = nn.ParameterList(
            self.seed_parameter(o, i) for i, o in zip(sizes[:-1], sizes[1:]))
        self.biases = nn.ParameterList(self.seed_parameter(o) for o in sizes[1:])
        self._activation = self.options.activation
        if self._activation == "prelu":
            self.prelu_slope = self.seed_parameter(len(self.options.hidden_sizes))

    def init_seed_(self, k: int, generator: InitStream) -> None:
        for w, b in zip(self.weights, self.biases):
            bound = 1.0 / math.sqrt(w.shape[-1])
            self.fill_weight_(
                w.data[k], generator, lambda t, g: g.uniform_(t, -bound, bound))
            generator.uniform_(b.data[k], -bound, bound)
        if self._activation == "prelu":
            self.prelu_slope.data[k].fill_(PRELU_INIT)

    def _act(self, h: Tensor, layer: int) -> Tensor:
        if self._activation == "prelu":
            slope = self.prelu_slope[:, layer].view(-1, 1, 1)
            return torch.where(h >= 0, h, slope * h)
        return _FIXED[self._activation](h)

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        h = x
        last = len(self.weights) - 1
        for layer, (w, b) in enumerate(zip(self.weights, self.biases)):
            # not baddbmm: for one output column it takes a gemv-like path for one seed and
            # another for many, so a seed's numbers depended on S (linear_forward's native
            # kernel computes every seed from its own data alone)
            h = add_bias(linear_forward(h, w), b)  # its gradient summed in a fixed order
            if layer < last:
                h = self._act(h, layer)
        return h

    def weight_matrices(self) -> dict[str, Tensor]:
        return {f"layer{i}": w for i, w in enumerate(self.weights)}

    def load_exact_(self, weights: Tensor, mode: ExactMode) -> None:
        raise NotImplementedError(
            "an MLP has no exact arithmetic solution: its activations make z = Wx (or a "
            "product) hold only approximately on a bounded range, which is why it fails "
            "to extrapolate")
