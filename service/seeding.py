"""One master seed; every other seed is derived from it by name.

A training seed is identified by its *seed id* (an integer), never by its position in a
batch, so seed 5 draws the same initialisation and the same data whether it is trained
alone or beside 999 others.
"""

from __future__ import annotations

import hashlib

import torch


def derive_seed(master_seed: int, *path: str | int) -> int:
    """A 63-bit seed for the stream named by ``path`` (e.g. ``("init", 5)``)."""
    text = "/".join([str(int(master_seed)), *map(str, path)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def generator_for(master_seed: int, *path: str | int) -> torch.Generator:
    """A CPU generator seeded for the named stream (initialisation, evaluation sets)."""
    return torch.Generator().manual_seed(derive_seed(master_seed, *path))


def stream_keys(master_seed: int, stream: str, seed_ids: list[int]) -> torch.Tensor:
    """Per-seed 31-bit keys ``[S]`` (int64) for the counter-based generators in `service.rng`."""
    return torch.tensor(
        [derive_seed(master_seed, stream, s) & 0x7FFF_FFFF for s in seed_ids], dtype=torch.int64
    )
