"""Which torch device a run trains on, and whether its step is compiled there."""

from __future__ import annotations

import torch

from service.config import RunConfig

CPU_COMPILE_FROM_STEPS = 20_000
"""``compile: auto`` on a CPU compiles runs of at least this many steps. Compiling costs
~10 s cold and saves ~0.8 ms per step plus ~5 µs per seed (one thread, NAU → NMU, 100
inputs): from 20,000 steps it pays for one seed and twice over for 100. The number of
seeds is deliberately not part of the decision: compiled and eager steps round
differently, so a seed must not change mode with its batch mates (a seed is a seed)."""


def resolve_device(name: str) -> torch.device:
    """``cpu``, or ``cuda:<index>`` (in a Ray trial ``cuda:0``, its GPU: Ray sets CUDA_VISIBLE_DEVICES)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch sees no CUDA device; use --device cpu or auto")
    return torch.device("cuda", torch.cuda.current_device()) if name == "cuda" else torch.device(name)


def compile_pays_off(device: torch.device, steps: int, recurrent: bool = False, native_step: bool = False) -> bool:
    """``compile: auto``'s decision: always on a GPU; on a CPU for runs of at least
    `CPU_COMPILE_FROM_STEPS` steps, never for a recurrent task (its eager step is a few
    small operations per position) nor for a run the native CPU step covers
    (``native_step``: `service.training.cpu_step.covers`; it trains the eager step's bits,
    with or without its kernels). Nothing else enters it (not the seeds, not packing)."""
    return device.type == "cuda" or (not recurrent and not native_step and steps >= CPU_COMPILE_FROM_STEPS)


def compile_mode(config: RunConfig) -> str:
    """``"compiled"`` or ``"eager"``: the mode a run of ``config`` trains in (before any
    fallback to eager when compiling fails; `RunResult.compiled` records the outcome)."""
    if config.compile != "auto":
        return "compiled" if config.compile == "on" else "eager"
    from service.training import cpu_step  # its kernels' modules import this one's package

    recurrent = getattr(config.task, "recurrent", False)
    device = resolve_device(config.device)
    native_step = cpu_step.covers(config, device)
    return "compiled" if compile_pays_off(device, config.train.steps, recurrent, native_step) else "eager"
