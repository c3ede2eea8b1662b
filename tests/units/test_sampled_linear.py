"""`sample_linear` (the batch drawn and the first layer applied seed tile by seed tile) gives
bit for bit what `sample` then `linear` give: the batch, its operand sums, the layer's
output and its weight gradient, for any tile and seed count, eager and compiled."""

from __future__ import annotations

import pytest
import torch

from service.seeding import generator as rng
from service.seeding import stream_keys
from service.units import kernels, sampled_linear


def _native_or_skip():
    if not sampled_linear.available():
        pytest.skip("no native kernels here")


def _apart(keys, step, shape, intervals, runs, w):
    x, sums = rng.sample(keys, step, shape, intervals, runs)
    return x, sums, kernels.linear(x, w)


def _with_grad(f, w, g, *args):
    w = w.detach().clone().requires_grad_(True)
    x, sums, z = f(*args, w)
    return x, sums, z.detach(), torch.autograd.grad(z, w, g)[0]


@pytest.mark.parametrize("tile_bytes", [1, 1 << 14, 1 << 18, 1 << 30])
@pytest.mark.parametrize("S, B, I, O, intervals, runs", [
    (7, 128, 100, 2, ((1.0, 2.0),), ((0, 50), (25, 75))),
    (13, 16, 37, 1, ((-2.0, -1.0), (1.0, 2.0)), ((3, 9),)),
    (1, 5, 8, 4, ((0.0, 1.0),), ()),
    (4, 9, 2, 3, ((-3.0, 3.0),), ((0, 2),)),
])
def test_one_pass_is_the_draw_then_the_layer(monkeypatch, tile_bytes, S, B, I, O, intervals, runs):
    _native_or_skip()
    monkeypatch.setattr(sampled_linear, "TILE_BYTES", tile_bytes)
    keys = stream_keys(11, "data", list(range(5, 5 + S)))
    gen = torch.Generator().manual_seed(S * 100 + I)
    w = torch.rand(S, O, I, generator=gen) * 2 - 1
    g = torch.randn(S, B, O, generator=gen)
    for step in (0, 1234):
        counter = torch.tensor(step)
        fused = _with_grad(sampled_linear.sample_linear, w, g, keys, counter, (B, I), intervals, runs)
        apart = _with_grad(_apart, w, g, keys, counter, (B, I), intervals, runs)
        for a, b in zip(fused, apart):
            assert torch.equal(a, b)
    # a seed's numbers are its own: the same seed alone
    alone = _with_grad(sampled_linear.sample_linear, w[2:3] if S > 2 else w[:1], g[2:3] if S > 2 else g[:1],
                       keys[2:3] if S > 2 else keys[:1], torch.tensor(7), (B, I), intervals, runs)
    among = _with_grad(sampled_linear.sample_linear, w, g, keys, torch.tensor(7), (B, I), intervals, runs)
    k = 2 if S > 2 else 0
    for a, b in zip(alone, among):
        assert torch.equal(a[0], b[k])


def test_the_batch_buffers_are_filled_and_a_wide_layer_takes_the_two_steps():
    _native_or_skip()
    keys = stream_keys(3, "data", [0, 1, 2])
    buffers = (torch.empty(3, 6, 10), torch.empty(3, 6, 1))
    w = torch.rand(3, 2, 10)
    x, sums, z = sampled_linear.sample_linear(keys, 4, (6, 10), ((1.0, 2.0),), ((0, 5),), w, out=buffers)
    assert x.data_ptr() == buffers[0].data_ptr() and sums.data_ptr() == buffers[1].data_ptr()
    assert torch.equal(z, kernels.linear(*rng.sample(keys, 4, (6, 10), ((1.0, 2.0),), ((0, 5),))[:1], w))
    wide = torch.rand(3, kernels.MAX_OUT + 1, 10)
    assert not sampled_linear.usable(keys, wide, (6, 10), ((1.0, 2.0),))
    x, sums, z = sampled_linear.sample_linear(keys, 4, (6, 10), ((1.0, 2.0),), ((0, 5),), wide)
    assert torch.equal(z, kernels.linear(x, wide))


@pytest.mark.slow
def test_compiled_it_gives_the_eager_bits():
    _native_or_skip()
    keys = stream_keys(5, "data", list(range(6)))
    w0 = torch.rand(6, 2, 100) * 2 - 1
    shape, intervals, runs = (32, 100), ((1.0, 2.0),), ((0, 50), (25, 75))

    g = torch.randn(6, 32, 2, generator=torch.Generator().manual_seed(1))

    def step(w, counter):  # the layer's gradient for a given upstream one (no reduction of inductor's)
        x, sums, z = sampled_linear.sample_linear(keys, counter, shape, intervals, runs, w)
        return x, sums, z, torch.autograd.grad(z, w, g)[0]

    compiled = torch.compile(step, dynamic=False)
    for t in (0, 3):
        counter = torch.tensor(t)
        eager = step(w0.clone().requires_grad_(True), counter)
        graph = compiled(w0.clone().requires_grad_(True), counter)
        for a, b in zip(eager, graph):
            assert torch.equal(a, b)
