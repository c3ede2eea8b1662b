"""The counter-based generator in `service.seeding.generator`: purity, distribution,
independence, and bit-for-bit agreement of its implementations (C kernel, torch ops,
compiled). Philox itself (known answers, stream layout): `tests/test_philox.py`."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from service.seeding import generator as rng
from service.native.ordered import lane_sum
from service.seeding import philox, stream_keys
from service.tasks.ranges import Range

ROOT = Path(__file__).resolve().parents[1]
SEED_IDS = [(i * 2654435761 + 12345) & 0xFFFF_FFFF for i in range(100)]
KEYS = stream_keys(0, "data", SEED_IDS)
SHAPE = (128, 100)
COUNTERS = [0, 1, 2, 4_999_999, 5_000_000, (1 << 40) + 17, (3 << 40) + 4_999_999]


def _flat(u: torch.Tensor) -> torch.Tensor:
    return u.reshape(-1).double()


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = _flat(a), _flat(b)
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.square().sum() * b.square().sum()).sqrt())


def _assert_uncorrelated(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    n = a.numel()
    r = _corr(a, b)
    assert abs(r) < 5.0 / math.sqrt(n), f"{what}: correlation {r:.2e} over {n} pairs"


# -- purity -----------------------------------------------------------------------------------
@pytest.mark.parametrize("counter", [0, 5_000_000, (1 << 40) + 3])
def test_row_depends_only_on_its_key(counter):
    full = rng.uniform(KEYS, torch.tensor(counter), SHAPE)
    for k in [0, 1, 50, 99]:
        alone = rng.uniform(KEYS[k:k + 1], torch.tensor(counter), SHAPE)
        assert torch.equal(alone[0], full[k])
    perm = torch.randperm(len(KEYS), generator=torch.Generator().manual_seed(0))
    assert torch.equal(rng.uniform(KEYS[perm], counter, SHAPE), full[perm])
    subset = KEYS[::7]  # a strided view, not contiguous storage
    assert torch.equal(rng.uniform(subset, counter, SHAPE), full[::7])


def test_deterministic_and_counter_forms_agree():
    a = rng.uniform(KEYS, torch.tensor(12345), SHAPE)
    b = rng.uniform(KEYS, torch.tensor(12345), SHAPE)
    c = rng.uniform(KEYS, 12345, SHAPE)
    d = rng.uniform(KEYS.to(torch.int32), torch.tensor(12345, dtype=torch.int64), SHAPE)
    e = rng.uniform(KEYS.t().contiguous().t(), 12345, SHAPE)  # column-major rows
    assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d) and torch.equal(a, e)
    assert not torch.equal(a, rng.uniform(KEYS, 12346, SHAPE))


def test_shape_is_a_view_of_the_flat_stream():
    flat = rng.uniform(KEYS, 9, (128 * 100,))
    assert torch.equal(rng.uniform(KEYS, 9, SHAPE).reshape(100, -1), flat)
    assert torch.equal(rng.uniform(KEYS, 9, (37,)), flat[:, :37])  # a prefix of the same stream
    assert rng.uniform(KEYS, 9, ()).shape == (100,)
    assert rng.uniform(KEYS, 9, (0, 3)).shape == (100, 0, 3)
    assert rng.uniform(KEYS[:0], 9, SHAPE).shape == (0, *SHAPE)


# -- range and distribution -------------------------------------------------------------------
def test_range_dtype_and_24_random_bits():
    u = torch.cat([rng.uniform(KEYS, c, SHAPE).reshape(-1) for c in (0, 5_000_000)])
    assert u.dtype == torch.float32
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    ints = (u.double() * 2**24)
    assert torch.equal(ints, ints.floor())  # on the 2**-24 grid
    bits = (ints.long().unsqueeze(1) >> torch.arange(24)) & 1
    freq = bits.double().mean(0)
    n = u.numel()
    assert (freq - 0.5).abs().max() < 5 * 0.5 / math.sqrt(n), freq  # all 24 bits balanced


@pytest.mark.parametrize("counter", [0, 5_000_000, (2 << 40) + 77])
def test_mean_variance_ks(counter):
    u = _flat(rng.uniform(KEYS, counter, SHAPE))  # 1.28e6 numbers
    n = u.numel()
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(float(u.var()) - 1 / 12) < 5 * math.sqrt(1 / 180 / n)  # var of (u - 1/2)^2 is 1/180
    s, _ = torch.sort(u)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    d = float(torch.maximum(i / n - s, s - (i - 1) / n).max())
    assert d < 1.95 / math.sqrt(n), f"KS D={d:.2e} (p < 0.001 beyond 1.95/sqrt(n))"
    hist = torch.histc(u, bins=256, min=0.0, max=1.0)
    chi2 = float(((hist - n / 256) ** 2 / (n / 256)).sum())
    assert abs(chi2 - 255) < 5 * math.sqrt(2 * 255)


# -- independence -----------------------------------------------------------------------------
@pytest.mark.parametrize("counter", [0, 5_000_000, (1 << 40) + 5_000_000])
def test_no_correlation_between_neighbours(counter):
    u = rng.uniform(KEYS, counter, SHAPE).reshape(100, -1)
    for lag in (1, 2, 100):  # adjacent elements, and the same input of adjacent batch rows
        _assert_uncorrelated(u[:, :-lag], u[:, lag:], f"elements at lag {lag}")
    _assert_uncorrelated(u[:-1], u[1:], "adjacent seeds in a batch")
    next_ids = rng.uniform(stream_keys(0, "data", [s + 1 for s in SEED_IDS]), counter, SHAPE).reshape(100, -1)
    _assert_uncorrelated(u, next_ids, "seed ids s and s + 1")
    seq = rng.uniform(stream_keys(0, "data", range(101)), counter, SHAPE).reshape(101, -1)
    _assert_uncorrelated(seq[:-1], seq[1:], "sequential seed ids 0, 1, 2, ...")
    other_name = rng.uniform(stream_keys(0, "noise", SEED_IDS), counter, SHAPE).reshape(100, -1)
    _assert_uncorrelated(u, other_name, "streams data and noise of one seed")
    next_step = rng.uniform(KEYS, counter + 1, SHAPE).reshape(100, -1)
    _assert_uncorrelated(u, next_step, "steps t and t + 1")
    other_stream = rng.uniform(KEYS, counter + (1 << 40), SHAPE).reshape(100, -1)
    _assert_uncorrelated(u, other_stream, "counter and counter + 2**40")


def test_pairs_fill_the_unit_square():
    u = rng.uniform(KEYS, 5_000_000, SHAPE).reshape(100, -1)
    a, b = u[:, :-1].reshape(-1), u[:, 1:].reshape(-1)
    m = 32
    cell = (a * m).long() * m + (b * m).long()
    hist = torch.bincount(cell, minlength=m * m).double()
    e = a.numel() / (m * m)
    chi2 = float(((hist - e) ** 2 / e).sum())
    dof = m * m - 1
    assert abs(chi2 - dof) < 5 * math.sqrt(2 * dof)


def test_consecutive_steps_are_not_shifted_copies():
    """Rows of nearby steps share no run of values (as shifted streams would)."""
    rows = torch.cat([rng.uniform(KEYS[:4], c, (256,)) for c in range(5_000_000, 5_000_200)])
    heads = {tuple(r[:4].tolist()) for r in rows}
    assert len(heads) == rows.shape[0]
    values = rows.reshape(-1)
    # 204800 values on a 2**24 grid: ~1250 equal pairs by chance; a copied run would add
    # hundreds per shared stream.
    dup = values.numel() - torch.unique(values).numel()
    expected = values.numel() ** 2 / 2 / 2**24
    assert dup < expected + 6 * math.sqrt(expected)


# -- implementations agree --------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 100, 12800, 12807])
def test_cpu_kernel_matches_torch_ops(n):
    if not rng.native_available():
        pytest.skip("no native kernel here")
    for counter in COUNTERS:
        c = torch.tensor(counter)
        native = rng.uniform(KEYS, c, (n,))
        assert torch.equal(native, rng._uniform_torch(KEYS, c, n))
        assert torch.equal(native, philox.uniform(KEYS, c, n))


@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 47, 48, 49, 95, 96, 97, 100, 12807])
def test_every_instruction_set_gives_the_same_bits(n):
    """Portable C, AVX2 and AVX-512 (those this CPU has) draw the same numbers and sums, for
    plain uniforms, one interval (the exact one-multiply path), a union of two, groups cut short
    at every length around the vector forms' 32, 48 and 96 numbers, and rows longer than the
    kernel's 2,048-number chunk (12,807: each row after the first starts inside a Philox block)."""
    if not rng.native_available():
        pytest.skip("no native kernel here")
    lib = rng._lib_state["lib"]
    best = int(lib.nalu_rng_isa())

    def draws():
        out = []
        for c in COUNTERS:
            out.append(rng.uniform(KEYS, c, (n,)))
            out.extend(rng.sample(KEYS, c, (n,), ((-6.0, -2.0), (2.0, 6.0)), ((0, n),)))
            out.extend(rng.sample(KEYS, c, (3, n), ((1.0, 2.0),), ((0, (n + 1) // 2), (n // 3, n))))
        return out

    reference = draws()
    try:
        for level in range(best):
            lib.nalu_rng_force_isa(level)
            assert int(lib.nalu_rng_isa()) == level
            for got, want in zip(draws(), reference):
                assert torch.equal(got, want), rng.ISA_NAMES[level]
    finally:
        lib.nalu_rng_force_portable(0)
    assert int(lib.nalu_rng_isa()) == best


def test_uniform_into():
    out = torch.empty(100, *SHAPE)
    assert rng.uniform_into(out, KEYS, torch.tensor(42)) is out
    assert torch.equal(out, rng.uniform(KEYS, 42, SHAPE))
    strided = torch.empty(100, 100, 128).transpose(1, 2)
    rng.uniform_into(strided, KEYS, 42)
    assert torch.equal(strided, out)
    with pytest.raises(ValueError):
        rng.uniform_into(torch.empty(99, *SHAPE), KEYS, 0)


def _run_isolated(tmp_path: Path, env_extra: dict[str, str], name: str) -> torch.Tensor:
    code = (
        "import torch, warnings\n"
        "from service.seeding import generator as rng\n"
        "keys = torch.tensor(%r, dtype=torch.int64)\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    u = torch.stack([rng.uniform(keys, c, (13, 7)) for c in %r])\n"
        "torch.save({'u': u, 'native': rng.native_available(), 'warned': len(w)}, %r)\n"
    ) % (KEYS[:10].tolist(), COUNTERS, str(tmp_path / f"{name}.pt"))
    env = {**os.environ, "NALU_SWEEP_CACHE": str(tmp_path / "cache"), **env_extra}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=300)
    return torch.load(tmp_path / f"{name}.pt")


@pytest.mark.slow
def test_fallbacks_give_the_same_numbers(tmp_path):
    expected = torch.stack([rng.uniform(KEYS[:10], c, (13, 7)) for c in COUNTERS])
    off = _run_isolated(tmp_path, {"NALU_SWEEP_RNG_NATIVE": "0"}, "off")
    assert not off["native"] and torch.equal(off["u"], expected)
    no_cc = _run_isolated(tmp_path, {"CC": str(tmp_path / "no-such-compiler")}, "no_cc")
    assert not no_cc["native"] and no_cc["warned"] >= 1 and torch.equal(no_cc["u"], expected)
    built = _run_isolated(tmp_path, {}, "built")  # builds into an empty cache
    assert torch.equal(built["u"], expected)
    assert list((tmp_path / "cache").glob("philox-*.so"))


@pytest.mark.slow
def test_compiled_matches_eager():
    torch._dynamo.reset()

    def step_batch(keys, step):
        x = rng.uniform(keys, step, SHAPE) * 2.0 - 1.0
        noise = rng.uniform(keys, step + (1 << 40), (128, 1))
        return x, noise

    def torch_ops(keys, step):
        return rng._uniform_torch(keys, step, 128 * 100).view(-1, *SHAPE)

    compiled = torch.compile(step_batch, fullgraph=True, dynamic=False)
    compiled_ops = torch.compile(torch_ops, fullgraph=True, dynamic=False)
    for counter in [0, 1, 5_000_000]:
        step = torch.tensor(counter)
        x, noise = compiled(KEYS, step)
        ex, en = step_batch(KEYS, step)
        assert torch.equal(x, ex) and torch.equal(noise, en)
        assert torch.equal(compiled_ops(KEYS, step), rng.uniform(KEYS, step, SHAPE))


# -- sample: draw, map onto a range and sum runs in one pass ----------------------------------
RANGES = [((1.0, 2.0),), ((-6.0, -2.0), (2.0, 6.0)), ((0.1, 0.2),), ((-2.0, -1.0), (0.5, 0.75), (3.0, 9.0)),
          tuple((2.0 * k, 2.0 * k + 1.0) for k in range(10))]  # more than the kernel takes: torch


@pytest.mark.parametrize("intervals", RANGES)
@pytest.mark.parametrize("shape, runs", [((128, 100), ((16, 41), (29, 54))), ((7, 13), ((0, 13), (3, 4))),
                                         ((37,), ((0, 9),)), ((5, 3), ())])
def test_sample_is_the_mapped_uniform_with_its_row_sums(intervals, shape, runs):
    for counter in (0, 5_000_000, (1 << 40) + 3):
        x, sums = rng.sample(KEYS, torch.tensor(counter), shape, intervals, runs)
        u = rng.uniform(KEYS, counter, shape)
        assert torch.equal(x, rng.map_to_intervals(u, intervals))
        assert torch.equal(x, Range(intervals=intervals).from_uniform(u))
        assert sums.shape == (100, *shape[:-1], len(runs))
        for j, (a, e) in enumerate(runs):
            assert torch.equal(sums[..., j], lane_sum(x[..., a:e]))  # the one order of every path
            torch.testing.assert_close(sums[..., j], x[..., a:e].sum(-1), rtol=1e-6, atol=1e-5)


def test_sample_lands_in_the_range_by_length():
    x, _ = rng.sample(KEYS, 3, SHAPE, ((-6.0, -2.0), (2.0, 8.0)))
    assert ((x >= -6) & (x < -2) | (x >= 2) & (x < 8)).all()
    share = float((x < 0).double().mean())
    assert abs(share - 0.4) < 0.005  # lengths 4 and 6


def test_sample_fills_buffers_and_torch_path_agrees(monkeypatch):
    runs = ((16, 41), (29, 54))
    out = (torch.empty(100, *SHAPE), torch.empty(100, SHAPE[0], 2))
    x, sums = rng.sample(KEYS, 42, SHAPE, ((1.0, 2.0),), runs, out=out)
    assert x is out[0] and sums is out[1]
    monkeypatch.setattr(rng, "native_available", lambda: False)
    tx, tsums = rng.sample(KEYS, 42, SHAPE, ((1.0, 2.0),), runs, out=out)
    assert tx is not out[0]
    assert torch.equal(tx, x)
    assert torch.equal(tsums, sums)  # bit-for-bit: both add in lane_sum's order


def test_sample_rejects_bad_runs():
    with pytest.raises(ValueError):
        rng.sample(KEYS, 0, SHAPE, ((1.0, 2.0),), ((90, 101),))
    with pytest.raises(ValueError):
        rng.sample(KEYS, 0, SHAPE, ((1.0, 2.0),), ((5, 5),))


@pytest.mark.slow
def test_compiled_sample_matches_eager():
    torch._dynamo.reset()

    def draw(keys, step):
        return rng.sample(keys, step, SHAPE, ((-6.0, -2.0), (2.0, 6.0)), ((16, 41), (29, 54)))

    compiled = torch.compile(draw, fullgraph=True, dynamic=False)
    for counter in (0, 5_000_000):
        step = torch.tensor(counter)
        (x, s), (ex, es) = compiled(KEYS, step), draw(KEYS, step)
        assert torch.equal(x, ex) and torch.equal(s, es)
