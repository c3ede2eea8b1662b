"""Which torch device a run trains on."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """``cpu``, or ``cuda:<index>`` (in a Ray trial ``cuda:0``, its GPU: Ray sets CUDA_VISIBLE_DEVICES)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch sees no CUDA device; use --device cpu or auto")
    return torch.device("cuda", torch.cuda.current_device()) if name == "cuda" else torch.device(name)
