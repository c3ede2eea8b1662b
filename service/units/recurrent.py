"""Units as recurrent cells (NALU paper §4.2, NAU paper §4.2).

Any registered unit mapping ``[S, B, in] → [S, B, out]`` is a cell:
``h_t = unit(cat(z_t, h_{t−1}))``, from ``h_0 = 0`` (sum) or ``1`` (product). A unit with
its own recurrent state (the `lstm` baseline) provides ``initial_state``/``step`` instead
and sees ``z_t`` only.

The R_z regulariser of the NAU paper keeps a cell's inputs where the unit is exact and
well-conditioned: with ``z̄_i`` the mean of the cell's input ``i`` over the batch and the
time steps of one training step (per seed),

* NAU: ``R_z = mean_{o,i} (1 − |W_oi|) · z̄_i²`` — an input that is not fully used (or
  fully removed: |W| < 1) is pulled towards 0, where a partly-used input costs nothing;
* NMU: ``R_z = mean_{o,i} (1 − W_oi) · (1 − z̄_i)²`` — an input the unit does not use is
  pulled towards 1, the neutral element of the product.

Both reach the read-out through ``z̄`` and the cell through ``W``. Other units give 0.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from service.units.base import Unit

Z_REGULARIZED = ("nau", "nmu")


def is_stateful(cell: Unit) -> bool:
    """True for a cell with its own recurrent state (``initial_state``/``step``)."""
    return hasattr(cell, "initial_state") and hasattr(cell, "step")


def cell_input_width(cell_name: str, step_width: int, out_width: int, stateful: bool) -> int:
    """What the cell reads each step: ``z_t`` (stateful cells) or ``cat(z_t, h_{t−1})``."""
    return step_width if stateful else step_width + out_width


def z_regularizer(cell: Unit, input_mean: Tensor) -> Tensor:
    """``R_z`` per seed ``[S]`` of ``cell`` for its mean inputs ``input_mean [S, in]``."""
    weight = getattr(cell, "weight", None)
    if cell.name not in Z_REGULARIZED or weight is None:
        return torch.zeros(input_mean.shape[0], device=input_mean.device)
    z = input_mean.unsqueeze(1)  # [S, 1, in] against W [S, out, in]
    if cell.name == "nau":
        return ((1 - weight.abs()) * z.square()).flatten(1).mean(1)
    return ((1 - weight) * (1 - z).square()).flatten(1).mean(1)


def unroll(cell: Unit, z: Tensor, state: Any, ctx: Any = None) -> tuple[Tensor, Any, Tensor | None]:
    """Run ``cell`` over ``z [S, B, L, k]`` from ``state``: returns the outputs
    ``[S, B, L, out]``, the state after the last step, and the sum over steps of the cell's
    inputs ``[S, B, in]`` (None for a stateful cell; R_z needs it)."""
    outputs = []
    if is_stateful(cell):
        pre = cell.prepare(z)
        for t in range(z.shape[2]):
            y, state = cell.step(pre[:, :, t], state)
            outputs.append(y)
        return torch.stack(outputs, 2), state, None
    h = state
    total = None
    for t in range(z.shape[2]):
        inp = torch.cat((z[:, :, t], h), -1)
        total = inp if total is None else total + inp
        h = cell(inp, ctx)
        outputs.append(h)
    return torch.stack(outputs, 2), h, total
