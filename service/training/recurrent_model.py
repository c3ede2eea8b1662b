"""A seed-batched recurrent model: a read-out (every layer but the last, applied to each
step's input) and a recurrent cell (the last layer), unrolled over the sequence for all S
seeds at once (`service.units.recurrent`)."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from service.config import RunConfig
from service.tasks import SequenceTask
from service.training.batched_model import BatchedModel
from service.units.base import ForwardContext, Unit
from service.units.recurrent import cell_input_width, is_stateful, unroll, z_regularizer
from service.units.registry import build_unit, get_unit


class RecurrentModel(BatchedModel):
    """``units[:-1]`` read each step's input ``x_t`` into ``z_t``; ``units[-1]`` is the cell."""

    def __init__(self, units: Sequence[Unit], start_state: float) -> None:
        super().__init__(units)
        self.start_state = start_state

    @property
    def cell(self) -> Unit:
        return self.units[-1]

    def read(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        """The read-out of ``x [S, N, I]`` → ``z [S, N, k]``."""
        for unit in self.units[:-1]:
            x = unit(x, ctx)
        return x

    def initial_state(self, batch: int, device: torch.device) -> Any:
        if is_stateful(self.cell):
            return self.cell.initial_state(batch, device)
        return torch.full((self.num_seeds, batch, self.cell.out_features), self.start_state, device=device)

    def run(self, z: Tensor, state: Any = None, ctx: ForwardContext | None = None
            ) -> tuple[Tensor, Any, Tensor | None]:
        """The cell over ``z [S, B, L, k]``: ``(y [S, B, L, out], last state, input sum)``."""
        if state is None:
            state = self.initial_state(z.shape[1], z.device)
        return unroll(self.cell, z, state, ctx)

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        """``x [S, B, L, I]`` → every step's output ``[S, B, L, out]``."""
        return self.forward_with_inputs(x, ctx)[0]

    def forward_with_inputs(self, x: Tensor, ctx: ForwardContext | None = None
                            ) -> tuple[Tensor, Tensor | None]:
        """Outputs and the cell's mean input per seed ``[S, in]`` (None: stateful cell)."""
        s, b, length, width = x.shape
        z = self.read(x.reshape(s, b * length, width), ctx).view(s, b, length, -1)
        y, _, total = self.run(z, None, ctx)
        mean = None if total is None else total.mean(1) / length
        return y, mean

    def z_regularizer(self, input_mean: Tensor | None) -> Tensor:
        if input_mean is None:
            return self._zeros_like_seeds()
        return z_regularizer(self.cell, input_mean)

    def sparsity_error(self) -> Tensor:
        """Over the layers with arithmetic weights: not an MLP read-out (images) nor an
        ``lstm`` cell; NaN when none has any (the aggregate then leaves it out)."""
        units = [u for u in self.units if u.name != "mlp" and u.weight_matrices()]
        if not units:
            return torch.full((self.num_seeds,), float("nan"), device=next(self.parameters()).device)
        return torch.stack([u.sparsity_error() for u in units]).amax(0)

    def _zeros_like_seeds(self) -> Tensor:
        p = next(self.parameters())
        return torch.zeros(self.num_seeds, device=p.device)


def build_recurrent_model(config: RunConfig, num_seeds: int | None = None) -> RecurrentModel:
    """Read-out widths ``I → hidden … → step_width``; the cell ``cat(z, h) → out`` (``z → out``
    for a stateful cell such as ``lstm``)."""
    task = config.task
    assert isinstance(task, SequenceTask)
    layers = config.layers()
    num_seeds = config.seeds if num_seeds is None else num_seeds
    step_width = task.step_width if len(layers) > 1 else task.input_size  # no read-out: z_t = x_t
    widths = [task.input_size] + [config.model.hidden_size] * (len(layers) - 2) + [step_width]
    units = [
        build_unit(layer.unit, widths[i], widths[i + 1], num_seeds, layer.options, layer.init)
        for i, layer in enumerate(layers[:-1])
    ]
    cell = layers[-1]
    stateful = is_stateful(get_unit(cell.unit))
    width = cell_input_width(cell.unit, step_width, task.output_size, stateful)
    units.append(build_unit(cell.unit, width, task.output_size, num_seeds, cell.options, cell.init))
    for i, unit in enumerate(units):
        unit.noise_stream = i
    return RecurrentModel(units, task.start_state)
