"""Philox4x32-10 and the stream layout of `service.seeding`: known answers, the C and torch
paths against an independent pure-Python reference, and seed ids that never share a stream.

numpy's ``numpy.random.Philox`` is the 4x64 variant (64-bit words, 128-bit key), so it
cannot pin 4x32 outputs; the known answers are Random123's published ``kat_vectors``
for philox4x32 with 10 rounds."""

from __future__ import annotations

import random

import pytest
import torch

from service.seeding import SEED_ID_LIMIT, generator as rng, philox, stream_key, stream_keys

MASK = 0xFFFF_FFFF

# Random123 kat_vectors: (c0, c1, c2, c3), (k0, k1) -> (r0, r1, r2, r3)
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK, MASK, MASK, MASK), (MASK, MASK), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def reference(ctr: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """Philox4x32-10 from its definition, in Python integers."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
        k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
    return c0, c1, c2, c3


def _signed64(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def torch_block(ctr, key) -> tuple[int, ...]:
    keys = torch.tensor([[key[0], key[1], ctr[1]]])
    counter = torch.tensor(_signed64(ctr[2] | ctr[3] << 32))
    return tuple(philox.blocks(keys, counter, 1, first=ctr[0])[0, 0].tolist())


def native_block(ctr, key) -> tuple[int, ...]:
    out = torch.empty(4, dtype=torch.int32)
    keys = torch.tensor([key[0], key[1], ctr[1]], dtype=torch.int64)
    rng._lib_state["lib"].nalu_philox_raw(out.data_ptr(), keys.data_ptr(), _signed64(ctr[2] | ctr[3] << 32), ctr[0], 1)
    return tuple(v & MASK for v in out.tolist())


def _native():
    if not rng.native_available():
        pytest.skip("no native kernel here")


@pytest.mark.parametrize("ctr, key, expected", KAT)
def test_known_answers(ctr, key, expected):
    assert reference(ctr, key) == expected
    assert torch_block(ctr, key) == expected


@pytest.mark.parametrize("ctr, key, expected", KAT)
def test_known_answers_native(ctr, key, expected):
    _native()
    assert native_block(ctr, key) == expected


def test_paths_equal_reference_on_random_inputs():
    r = random.Random(12)
    for _ in range(200):
        ctr = (r.getrandbits(29), r.getrandbits(32), r.getrandbits(32), r.getrandbits(32))
        key = (r.getrandbits(32), r.getrandbits(32))
        expected = reference(ctr, key)
        assert torch_block(ctr, key) == expected
        if rng.native_available():
            assert native_block(ctr, key) == expected


def test_layout_of_a_call():
    """Element i of a call is word i % 4 of block (c0 = i // 4, c1 = seed id, c2/c3 = the
    counter's low/high halves) under the stream's key; float = (word >> 8) * 2**-24."""
    keys = stream_keys(7, "data", [0, 2463, MASK])
    counter = (5 << 32) + 1234
    u = rng.uniform(keys, counter, (11,))
    for row, (k0, k1, seed) in zip(u, keys.tolist()):
        words = [w for b in range(3) for w in reference((b, seed, counter & MASK, counter >> 32), (k0, k1))]
        assert row.tolist() == [(w >> 8) * 2.0**-24 for w in words[:11]]


def test_seed_ids_never_share_a_stream():
    """Master 0: ids 2463 and 6128 had equal 31-bit keys before; ids differing only in bit
    31 collapsed too. The seed id is a counter word now, so their blocks differ."""
    ids = [2463, 6128, 5, 5 + (1 << 31), 0, MASK]
    keys = stream_keys(0, "data", ids)
    assert len({tuple(k[:2]) for k in keys.tolist()}) == 1  # one key per (master, stream)
    u = rng.uniform(keys, 0, (64,))
    assert len({tuple(r.tolist()) for r in u}) == len(ids)
    # 10,000 seed ids: first blocks all distinct (Philox is a bijection of the counter)
    many = stream_keys(0, "data", range(10_000))
    first = philox.blocks(many, torch.tensor(0), 1)[:, 0]
    assert torch.unique(first, dim=0).shape[0] == 10_000
    for s in ids:
        assert torch.equal(rng.uniform(stream_keys(0, "data", [s]), 3, (9,))[0],
                           rng.uniform(keys, 3, (9,))[ids.index(s)])


def test_stream_keys_depend_on_master_and_name_only():
    assert stream_key(0, "data") != stream_key(1, "data") != stream_key(0, "noise")
    k0, k1 = stream_key(0, "data")
    assert 0 <= k0 <= MASK and 0 <= k1 <= MASK
    assert stream_keys(0, "data", [3, 4]).tolist() == [[k0, k1, 3], [k0, k1, 4]]
    assert stream_keys(0, "data", []).shape == (0, 3)
    with pytest.raises(ValueError):
        stream_keys(0, "data", [SEED_ID_LIMIT])
    with pytest.raises(ValueError):
        stream_keys(0, "data", [-1])


def test_mulhilo_is_exact():
    r = random.Random(3)
    xs = [0, 1, MASK, 1 << 31, *(r.getrandbits(32) for _ in range(1000))]
    for m in (philox.M0, philox.M1, MASK):
        hi, lo = philox.mulhilo(torch.tensor(xs), m)
        assert hi.tolist() == [(m * x) >> 32 for x in xs]
        assert lo.tolist() == [(m * x) & MASK for x in xs]


def test_one_dimensional_keys_are_seed_ids_under_key_zero():
    assert torch.equal(rng.uniform(torch.tensor([4, 9]), 2, (5,)),
                       rng.uniform(torch.tensor([[0, 0, 4], [0, 0, 9]]), 2, (5,)))
    with pytest.raises(ValueError):
        rng.uniform(torch.zeros(3, 2, dtype=torch.int64), 0, (4,))
