"""A seed-batched model: a stack of units applied in order, every method per seed."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor, nn

from service.seeding.init_stream import InitStream
from service.units.base import ForwardContext, Unit

if TYPE_CHECKING:
    from service.training.seed_settings import SeedSettings


class BatchedModel(nn.Module):
    """Units applied in order; every method returns per-seed values ``[S]``."""

    def __init__(self, units: Sequence[Unit]) -> None:
        super().__init__()
        self.units = nn.ModuleList(units)
        self.num_seeds = units[0].num_seeds

    def forward(self, x: Tensor, ctx: ForwardContext | None = None, start: int = 0) -> Tensor:
        """The units from ``start`` on (``x``: the output of unit ``start − 1``, or the input)."""
        for i, unit in enumerate(self.units):
            if i >= start:
                x = unit(x, ctx)
        return x

    def regularizer(self) -> Tensor:
        """Σ over layers of each layer's (mean) sparsity regulariser, added layer by layer
        (a sum of ``stack(...)`` over layers adds in another order for one seed than for
        many)."""
        return functools.reduce(torch.add, [u.regularizer() for u in self.units])

    def oob_penalty(self) -> Tensor:
        return functools.reduce(torch.add, [u.oob_penalty() for u in self.units])

    def sparsity_error(self) -> Tensor:
        return torch.stack([u.sparsity_error() for u in self.units]).amax(0)

    def clamp_(self) -> None:
        for unit in self.units:
            unit.clamp_()

    def reset_parameters(self, generators: Sequence[InitStream],
                         seeds: Sequence[int] | None = None) -> None:
        """Re-draw the parameters of batch positions ``seeds`` (all by default); layer by
        layer from each seed's own initialisation stream, so a seed's draw ignores its
        batch mates."""
        for unit in self.units:
            unit.reset_parameters(generators, seeds)

    def set_seed_variants(self, settings: "SeedSettings") -> None:
        """Each layer's per-seed options and initialisations from the run's members."""
        for i, unit in enumerate(self.units):
            unit.set_seed_variants(*settings.layer_variants(i))

    def weight_matrices(self) -> dict[str, Tensor]:
        """Every layer's effective weights ``[S, out, in]``, keyed ``layer{i}.{name}``."""
        out: dict[str, Tensor] = {}
        for i, unit in enumerate(self.units):
            for name, w in unit.weight_matrices().items():
                out[f"layer{i}.{unit.name}.{name}"] = w
        return out
