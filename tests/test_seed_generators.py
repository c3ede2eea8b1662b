"""Per-seed torch generators (initialisation, re-initialisation) never share a state
within a stream (`service.seeding.seed_generator`)."""

from __future__ import annotations

import random

import pytest
import torch

from service.config import RunConfig
from service.seeding import derive_seed, permute32, seed_generator
from service.training.trainer import Trainer

MASK = 0xFFFF_FFFF


def _xorshift_inverse(y: int, shift: int) -> int:
    x = y
    for _ in range(32 // shift + 1):
        x = y ^ (x >> shift)
    return x & MASK


def _unpermute32(y: int) -> int:
    y = _xorshift_inverse(y, 16)
    y = (y * pow(0x846CA68B, -1, 1 << 32)) & MASK
    y = _xorshift_inverse(y, 15)
    y = (y * pow(0x7FEB352D, -1, 1 << 32)) & MASK
    return _xorshift_inverse(y, 16)


def test_permute32_is_a_bijection() -> None:
    rng = random.Random(7)
    for x in [0, 1, MASK, 1 << 31] + [rng.getrandbits(32) for _ in range(20_000)]:
        y = permute32(x)
        assert 0 <= y <= MASK and _unpermute32(y) == x


def test_torch_reads_only_32_bits_of_a_seed() -> None:
    """Why a 64-bit hash is not enough: seeds equal in their low 32 bits give one stream."""
    a = torch.rand(4, generator=torch.Generator().manual_seed(12345))
    b = torch.rand(4, generator=torch.Generator().manual_seed(12345 + (1 << 32)))
    assert torch.equal(a, b)


def _low_half_collision(master: int, limit: int = 400_000) -> tuple[int, int]:
    seen: dict[int, int] = {}
    for s in range(limit):
        low = derive_seed(master, "init", s) & MASK
        if low in seen:
            return seen[low], s
        seen[low] = s
    raise AssertionError("no collision of the low halves found")  # ~1e-4 for 400,000 ids


def test_two_seeds_whose_hashes_collide_still_start_apart() -> None:
    """Seed ids whose 64-bit hashes share their low half (the old seeding gave them the
    same initial weights) get different generator states."""
    a, b = _low_half_collision(master=0)
    old_a = torch.rand(8, generator=torch.Generator().manual_seed(derive_seed(0, "init", a)))
    old_b = torch.rand(8, generator=torch.Generator().manual_seed(derive_seed(0, "init", b)))
    assert torch.equal(old_a, old_b)  # the defect, reproduced
    new_a = torch.rand(8, generator=seed_generator(0, "init", a))
    new_b = torch.rand(8, generator=seed_generator(0, "init", b))
    assert not torch.equal(new_a, new_b)


def test_streams_and_masters_differ_and_ids_are_checked() -> None:
    first = [torch.rand(1, generator=g).item() for g in (
        seed_generator(0, "init", 5), seed_generator(1, "init", 5), seed_generator(0, "reinit/1", 5))]
    assert len(set(first)) == 3
    for bad in (-1, 1 << 32):
        with pytest.raises(ValueError, match="outside"):
            seed_generator(0, "init", bad)


def test_trainer_initialises_each_seed_from_its_own_generator(monkeypatch) -> None:
    """The trainer draws seed id s's initial weights from `seed_generator(master, "init", s)`,
    whatever the other seeds: seed 3's weights alone equal its weights among seeds 0..5."""
    from service.training import trainer as trainer_module

    asked: list[tuple[int, str, int]] = []

    def recording(master: int, stream: str, seed_id: int) -> torch.Generator:
        asked.append((master, stream, seed_id))
        return seed_generator(master, stream, seed_id)

    monkeypatch.setattr(trainer_module, "seed_generator", recording)
    cfg = RunConfig.model_validate({"task": {"kind": "arithmetic", "operation": "add"},
                                    "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
                                    "seeds": 6, "compile": "off", "train": {"steps": 1}})
    among = Trainer(cfg)
    alone = Trainer(RunConfig.model_validate({**cfg.model_dump(), "seeds": 1, "seed_offset": 3}))
    assert alone.seed_ids == [3]
    assert asked == [(0, "init", s) for s in range(6)] + [(0, "init", 3)]
    for (name, p_among), (_, p_alone) in zip(among.model.named_parameters(), alone.model.named_parameters()):
        assert torch.equal(p_among.data[3], p_alone.data[0]), name
