"""The engine's state tensors, taken from a `Trainer` and written back into it.

Per seed, in the layout of `service.engine.kernels`: ``l1 [S, 6, 2, IP]`` and ``l2 [S, 6, 2]``
(float32; per layer the raw parameters a (W, or Ŵ of a NAC) and b (M̂ of a NAC, else
unused) and Adam's m and v of each), ``flags [S, 2]`` (alive, diverged_at), ``hyper [S, 8]``
(λ_max, t_start, t_end − t_start, 1 − β1, β2, 1 − β2, ε as the trainer's float32 rows, and
the seed's operation code, `operation_code`),
``opt_steps [S]`` and Adam's per-step factors ``table [G, L, 2]`` with each seed's group.

Adam's factors are `BatchedOptimizer`'s own numbers: ``lr / (1 − β1^t)`` and ``√(1 − β2^t)``
computed in float64 from the same bias-correction table (Python's ``1 − β**t``) and rounded
once to float32; past the table's end both corrections are 1 there as here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from service.engine.coverage import UNIT_CODES, operation_code
from service.training.optimizers import bias_correction_table

if TYPE_CHECKING:
    from service.training.trainer import Trainer

NAC_UNITS = ("nac_add", "nac_mul")


@dataclass
class EngineState:
    keys: Tensor
    l1: Tensor
    l2: Tensor
    flags: Tensor
    hyper: Tensor
    opt_steps: Tensor
    table: Tensor
    group: Tensor


def padded_width(inputs: int) -> int:
    """The kernels' tile width: the next power of two, at least 4."""
    return max(4, 1 << (inputs - 1).bit_length())


def _raw(unit) -> list[Tensor]:
    """The unit's parameters in the engine's order (a, b)."""
    return [unit.w_hat, unit.m_hat] if unit.name in NAC_UNITS else [unit.weight]


def adam_table(trainer: "Trainer") -> tuple[Tensor, Tensor]:
    """(``[G, L, 2]`` float32 factors per optimiser group and step count, ``[S]`` group)."""
    rows = trainer.settings.per_seed(lambda m: m.train.optimizer)
    keys = sorted({(float(c.lr), *map(float, c.betas)) for c in rows})
    tables = []
    for lr, b1, b2 in keys:
        bc = bias_correction_table((b1, b2))  # [2, L] float64
        tables.append(torch.stack([lr / bc[0], bc[1].sqrt()], 1).to(torch.float32))
    width = max(t.shape[0] for t in tables)
    out = torch.empty(len(tables), width, 2, dtype=torch.float32)
    for i, t in enumerate(tables):
        out[i, :t.shape[0]] = t
        out[i, t.shape[0]:] = t[-1]
    index = {k: i for i, k in enumerate(keys)}
    group = torch.tensor([index[(float(c.lr), *map(float, c.betas))] for c in rows], dtype=torch.int64)
    return out, group


def _f32_rows(values: list[float]) -> Tensor:
    return torch.tensor(values, dtype=torch.float64).to(torch.float32)


def from_trainer(trainer: "Trainer") -> EngineState:
    """The engine's copy of ``trainer``'s state (on its device)."""
    dev, S = trainer.device, trainer.num_seeds
    first, second = trainer.model.units
    width = padded_width(trainer.task.input_size)
    I = trainer.task.input_size
    l1 = torch.zeros(S, 6, 2, width, dtype=torch.float32, device=dev)
    l2 = torch.zeros(S, 6, 2, dtype=torch.float32, device=dev)
    state = {id(p): st for p, st in zip(trainer.optimizer.params, trainer.optimizer.state)}
    with torch.no_grad():
        for j, p in enumerate(_raw(first)):
            m, v = state[id(p)]
            l1[:, j, :, :I] = p
            l1[:, 2 + 2 * j, :, :I] = m
            l1[:, 3 + 2 * j, :, :I] = v
        for j, p in enumerate(_raw(second)):
            m, v = state[id(p)]
            l2[:, j] = p[:, 0]
            l2[:, 2 + 2 * j] = m[:, 0]
            l2[:, 3 + 2 * j] = v[:, 0]
    opts = trainer.settings.per_seed(lambda m: m.train.optimizer)
    sched = trainer.schedule
    hyper = torch.stack([
        sched.lambda_max.float().cpu(), sched.t_start.float().cpu(), sched.span.float().cpu(),
        _f32_rows([1 - c.betas[0] for c in opts]), _f32_rows([c.betas[1] for c in opts]),
        _f32_rows([1 - c.betas[1] for c in opts]), _f32_rows([c.eps for c in opts]),
        _f32_rows(trainer.settings.per_seed(lambda m: operation_code(m.task))),
    ], 1)
    table, group = adam_table(trainer)
    flags = torch.stack([trainer.alive.to(torch.int64), trainer.diverged_at], 1)
    return EngineState(
        keys=trainer.data_keys.to(dev, torch.int64).contiguous(), l1=l1, l2=l2,
        flags=flags.to(dev).contiguous(), hyper=hyper.to(dev).contiguous(),
        opt_steps=trainer.optimizer.steps.clone().to(dev), table=table.to(dev), group=group.to(dev),
    )


@torch.no_grad()
def write_back(state: EngineState, trainer: "Trainer", optimizer: bool = True) -> None:
    """Copy the engine's parameters, masks (and with ``optimizer`` Adam's state, step counts
    and running β powers) into ``trainer``, which then continues (or checkpoints) from them."""
    first, second = trainer.model.units
    I = trainer.task.input_size
    opt = trainer.optimizer
    state_of = {id(p): st for p, st in zip(opt.params, opt.state)}
    for j, p in enumerate(_raw(first)):
        p.copy_(state.l1[:, j, :, :I])
        if optimizer:
            m, v = state_of[id(p)]
            m.copy_(state.l1[:, 2 + 2 * j, :, :I])
            v.copy_(state.l1[:, 3 + 2 * j, :, :I])
    for j, p in enumerate(_raw(second)):
        p[:, 0].copy_(state.l2[:, j])
        if optimizer:
            m, v = state_of[id(p)]
            m[:, 0].copy_(state.l2[:, 2 + 2 * j])
            v[:, 0].copy_(state.l2[:, 3 + 2 * j])
    trainer.alive.copy_(state.flags[:, 0] != 0)
    trainer.diverged_at.copy_(state.flags[:, 1])
    if optimizer:
        opt.powers.copy_(advanced_powers(trainer, (state.opt_steps - opt.steps).cpu()))
        opt.steps.copy_(state.opt_steps)


def advanced_powers(trainer: "Trainer", done: Tensor) -> Tensor:
    """The optimiser's running ``[β1^t, β2^t]`` (float64) after each seed's ``done`` more
    steps: the same products, one multiplication a step, as `BatchedOptimizer.step` makes."""
    powers = trainer.optimizer.powers.cpu().clone()
    betas = trainer.settings.per_seed(lambda m: m.train.optimizer.betas)
    cache: dict[tuple, tuple[float, float]] = {}
    for s, n in enumerate(done.tolist()):
        key = (float(powers[0, s]), float(powers[1, s]), *map(float, betas[s]), n)
        if key not in cache:
            p1, p2, b1, b2, _ = key
            for _ in range(n):
                p1, p2 = p1 * b1, p2 * b2
            cache[key] = (p1, p2)
        powers[0, s], powers[1, s] = cache[key]
    return powers.to(trainer.optimizer.powers.device)


def unit_codes(trainer: "Trainer") -> tuple[int, int]:
    return tuple(UNIT_CODES[u.name] for u in trainer.model.units)  # type: ignore[return-value]
