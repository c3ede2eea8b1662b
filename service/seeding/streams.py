"""One master seed; every other seed is derived from it by name.

A training seed is identified by its *seed id* (an integer), never by its position in a
batch, so seed 5 draws the same initialisation and the same data whether it is trained
alone or beside 999 others.

Stream keys of the counter-based generator (`service.seeding.generator`)
--------------------------------------------------------------------------
A seed's stream is named by (master seed, stream name, seed id) and given to the generator
as one row ``(k0, k1, seed_id)`` of an int64 ``[S, 3]`` tensor (each entry in [0, 2**32)):

* ``(k0, k1)``, the 64-bit Philox key, is a BLAKE2b hash of (master seed, stream name)
  (low and high 32-bit halves), shared by all the seeds of a run;
* the seed id itself is counter word ``c1``.

The other counter words are the call counter (``c2``, ``c3``: usually the step) and the
block index (``c0``). Philox is a bijection of the 128-bit counter for a fixed key, so two
seed ids below 2**32 never share a stream, by construction; two stream names (or master
seeds) differ in their key unless their 64-bit hashes collide (~2**-64).

Initial weights (`service.seeding.init_stream`)
------------------------------------------------
Streams ``"init"`` and ``"reinit/<n>"`` under the same scheme: a seed's initial weights
come from the same generator as its data, under a key of their own.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


SEED_ID_LIMIT = 1 << 32
"""Seed ids are 32-bit counter words: 0 <= id < 2**32."""


def derive_seed(master_seed: int, *path: str | int) -> int:
    """A 63-bit seed for the stream named by ``path`` (e.g. ``("init", 5)``)."""
    text = "/".join([str(int(master_seed)), *map(str, path)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def generator_for(master_seed: int, *path: str | int) -> torch.Generator:
    """A CPU generator seeded for the named stream (evaluation sets, thresholds: one per
    task, not one per training seed; those use `InitStream` and `stream_keys`)."""
    import torch

    return torch.Generator().manual_seed(derive_seed(master_seed, *path))


def stream_key(master_seed: int, stream: str) -> tuple[int, int]:
    """The 64-bit Philox key ``(k0, k1)`` of the stream ``stream`` under ``master_seed``."""
    text = f"philox4x32/{int(master_seed)}/{stream}"
    key = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return key & 0xFFFF_FFFF, key >> 32


def stream_keys(master_seed: int, stream: str, seed_ids: list[int]) -> torch.Tensor:
    """Per-seed stream keys ``[S, 3]`` (int64 rows ``(k0, k1, seed_id)``) for the generator in
    `service.seeding.generator`; distinct seed ids give distinct streams."""
    import torch

    k0, k1 = stream_key(master_seed, stream)
    rows = []
    for s in seed_ids:
        s = int(s)
        if not 0 <= s < SEED_ID_LIMIT:
            raise ValueError(f"seed id {s} is outside [0, 2**32)")
        rows.append((k0, k1, s))
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 3)
