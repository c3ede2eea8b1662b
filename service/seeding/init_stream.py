"""Initial weights from Philox streams of their own.

A seed's initial weights are drawn from the same counter-based generator as its data
(`service.seeding.generator`, Philox4x32-10), under a stream of their own: the key is the
64-bit hash of (master seed, ``"init"``) and the seed id is counter word ``c1``, exactly as
for the ``"data"`` and ``"noise"`` streams (`service.seeding.streams`). A re-initialised
seed draws from ``"reinit/<n>"`` (its n-th re-draw). So, by construction:

* two seed ids below 2**32 never draw the same numbers (Philox is a bijection of the
  counter under one key), and no seed's initialisation is any seed's data;
* a seed's weights depend only on (master seed, stream, seed id): not on its batch mates,
  its position in a pack, the device or the compile mode.

Each fill of a weight tensor is one generator call at the next call counter (``c2, c3``:
0, 1, 2, ...), so the k-th tensor a unit fills for a seed is always the same numbers.
Draws are made on the host (a unit's parameters are swapped for host copies while it is
initialised), through the C kernel or the torch-ops Philox, which give the same bits; the
mapping of a uniform number onto ``[a, b)`` or a normal one is float64 arithmetic on the
host, rounded once to the weight's dtype. The weights a GPU run starts from are therefore
the CPU run's, bit for bit.
"""

from __future__ import annotations

import math

import torch

from service.seeding import generator as rng
from service.seeding.streams import stream_keys

__all__ = ["InitStream"]


class InitStream:
    """Seed ``seed_id``'s initialisation stream ``stream`` (``"init"``, ``"reinit/2"``)
    under ``master_seed``: `uniform_` and `normal_` fill a tensor from the next call."""

    def __init__(self, master_seed: int, stream: str, seed_id: int) -> None:
        self.keys = stream_keys(master_seed, stream, [seed_id])  # [1, 3], checks the id
        self.master_seed, self.stream, self.seed_id = int(master_seed), stream, int(seed_id)
        self.calls = 0

    def __repr__(self) -> str:
        return f"InitStream({self.master_seed}, {self.stream!r}, {self.seed_id})"

    def _uniform(self, n: int) -> torch.Tensor:
        """The next call's ``n`` U[0, 1) numbers (24 random bits each), as float64."""
        u = rng.uniform(self.keys, self.calls, (n,))[0]
        self.calls += 1
        return u.to(torch.float64)

    def uniform_(self, w: torch.Tensor, a: float, b: float) -> torch.Tensor:
        """Fill ``w`` in place with U[a, b): ``a + (b − a)·u`` in float64, rounded to ``w``."""
        u = self._uniform(w.numel())
        return w.copy_((u * (float(b) - float(a)) + float(a)).view(w.shape))

    def normal_(self, w: torch.Tensor, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
        """Fill ``w`` in place with N(mean, std²) by Box–Muller on one call's 2n numbers:
        ``sqrt(−2 ln(1 − u₁))·cos(2π u₂)`` (``1 − u₁`` is in (0, 1], so the log is finite)."""
        n = w.numel()
        u = self._uniform(2 * n)
        z = torch.sqrt(-2.0 * torch.log1p(-u[:n])) * torch.cos((2.0 * math.pi) * u[n:])
        return w.copy_((z * float(std) + float(mean)).view(w.shape))
