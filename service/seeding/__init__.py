"""Seeds and random streams.

`service.seeding.streams`: seed ids, named seeds and the per-seed stream keys;
`service.seeding.generator`: the counter-based generator (Philox4x32-10) that draws every
seed's data from its stream (C kernel or torch ops, bit-for-bit equal);
`service.seeding.philox`: the torch-ops Philox (fallback and CUDA path);
`service.seeding.init_stream`: each seed's initial weights from a Philox stream of its own."""

from service.seeding.streams import (
    SEED_ID_LIMIT,
    derive_seed,
    generator_for,
    stream_key,
    stream_keys,
)

__all__ = ["SEED_ID_LIMIT", "InitStream", "derive_seed", "generator_for", "stream_key",
           "stream_keys"]


def __getattr__(name: str):
    """`InitStream` on first use: it needs torch, and this package is imported where torch
    is not (a sweep's driver checks search spaces without it)."""
    if name == "InitStream":
        from service.seeding.init_stream import InitStream

        return InitStream
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
