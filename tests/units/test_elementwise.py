"""Compiled equals eager on saturating inputs (issue 12): tanh, sigmoid and exp saturate at
the same points compiled and eager, and a NAC's Ŵ in the band 8.66 ≤ |Ŵ| < 9.01 gets the
same (non-zero) gradient compiled as eager."""

from __future__ import annotations

import pytest
import torch

from service.units import build_unit, elementwise

_ULP_BELOW_1 = 2.0 ** -24  # float32 spacing just below 1


def _band() -> torch.Tensor:
    """±[8.5, 9.2] (where inductor's own tanh already returned ±1) and ±[0, 20]."""
    band = torch.linspace(8.5, 9.2, 7001)
    wide = torch.linspace(0.0, 20.0, 4001)
    x = torch.cat([band, wide])
    return torch.cat([x, -x])


def _large() -> torch.Tensor:
    """Where sigmoid rounds to 1 (16.64) or 0 (−88.72) and exp overflows (88.72) or underflows (−103.97)."""
    return torch.cat([torch.linspace(-120.0, 120.0, 240_001), torch.linspace(16.0, 17.5, 15_001),
                      torch.linspace(-105.0, -103.0, 20_001), torch.linspace(88.0, 89.0, 10_001)])


def _nac_unit(dtype=torch.float32):
    """A NAC+ (4 seeds, 200 → 1) with |Ŵ| spread over 8.5 … 9.2, both signs, σ(M̂) = 1:
    the 2 → 1 layer's reference init reaches 9.47."""
    seeds, n_in = 4, 200
    unit = build_unit("nac_add", n_in, 1, seeds).to(dtype)
    w = torch.linspace(8.5, 9.2, seeds * n_in).view(seeds, 1, n_in) * torch.tensor([1.0, -1.0]).repeat(n_in // 2)
    with torch.no_grad():
        unit.w_hat.copy_(w)
        unit.m_hat.fill_(20.0)
    return unit


def _everything(band, large, unit, x):
    """What the tests compare, as one function (compiled once: compiling is the slow part):
    tanh, sigmoid, exp and one NAC+ step (forward, loss, gradient of Ŵ)."""
    z = unit(x)
    loss = z.square().mean((1, 2)).sum()
    (g,) = torch.autograd.grad(loss, [unit.w_hat])
    return elementwise.tanh(band), elementwise.sigmoid(large), torch.exp(large), z, g


def test_eager_tanh_and_sigmoid_do_not_depend_on_a_values_position():
    """Values and gradients in a long tensor (vectorised loops) equal those of the same
    values one by one (scalar loops): torch.sigmoid and its backward differ there for ~4%."""
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 8
    g = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    for fn in (elementwise.tanh, elementwise.sigmoid):
        xr = x.clone().requires_grad_()
        y = fn(xr)
        (gx,) = torch.autograd.grad(y, xr, g)
        for i in range(0, 4096, 7):
            xi = x[i:i + 1].clone().requires_grad_()
            yi = fn(xi)
            (gi,) = torch.autograd.grad(yi, xi, g[i:i + 1])
            assert torch.equal(yi, y[i:i + 1]) and torch.equal(gi, gx[i:i + 1])
    torch.testing.assert_close(elementwise.sigmoid(x), torch.sigmoid(x), rtol=2.4e-7, atol=0)


@pytest.fixture(scope="module")
def results():
    """(eager, compiled) results of `_everything` and its inputs."""
    torch.manual_seed(0)
    unit = _nac_unit()
    inputs = (_band(), _large(), unit, torch.rand(4, 16, 200) * 0.01)
    eager = _everything(*inputs)
    torch._dynamo.config.trace_autograd_ops = True  # as the trainer sets it
    compiled = torch.compile(_everything, dynamic=False)(*inputs)
    return inputs, eager, compiled


@pytest.mark.slow  # shares one torch.compile (~15–40 s on a loaded CPU)
def test_compiled_tanh_saturates_where_eager_does_and_is_correctly_rounded(results):
    (x, *_), (eager, *_), (compiled, *_) = results
    exact = torch.tanh(x.double())
    assert torch.equal(eager, torch.tanh(x))  # eager is torch's own tanh
    assert torch.equal(compiled, exact.float())  # correctly rounded
    assert (eager.double() - exact).abs().max() <= _ULP_BELOW_1  # eager within an ulp
    # compiled never saturates where eager does not; both saturate from |x| ≈ 9.011
    assert bool((eager.abs() == 1)[compiled.abs() == 1].all())
    for y in (eager, compiled):
        first = x[y == 1].min()
        assert 9.0 < first < 9.02
    # torch's compiled tanh (Sleef) returned 1 from 8.665: the band where Ŵ lost its gradient
    assert bool((compiled[(x > 8.6) & (x < 9.0)].abs() < 1).all())


@pytest.mark.slow  # shares one torch.compile (~15–40 s on a loaded CPU)
def test_compiled_sigmoid_and_exp_saturate_where_eager_does(results):
    _, eager, compiled = results
    for e, c in zip(eager[1:3], compiled[1:3]):
        for value in (0.0, 1.0, float("inf")):
            assert torch.equal(e == value, c == value)


@pytest.mark.slow  # shares one torch.compile (~15–40 s on a loaded CPU)
def test_nac_step_in_the_saturation_band_compiled_equals_eager_and_float64(results):
    """One NAC+ step with |Ŵ| in 8.5 … 9.2: compiled and eager give the same outputs and
    gradients, non-zero below |Ŵ| = 9.01 as in float64 (to the float32 rounding of
    tanh(Ŵ), which the gradient 1 − tanh² inherits), zero where tanh(Ŵ) rounds to 1."""
    (_, _, unit, x), (*_, z_e, g_e), (*_, z_c, g_c) = results
    torch.testing.assert_close(z_c, z_e, rtol=1e-6, atol=0)
    torch.testing.assert_close(g_c, g_e, rtol=0, atol=0)
    ref = _nac_unit(torch.float64)
    z_64 = ref(x.double())
    (g_64,) = torch.autograd.grad(z_64.square().mean((1, 2)).sum(), [ref.w_hat])
    d_weight = g_64 / (1 - torch.tanh(ref.w_hat).square())  # dL/dW (σ(M̂) = 1)
    below = unit.w_hat.abs() < 9.0
    assert bool((g_c[below] != 0).all()) and bool((g_e[below] != 0).all())
    assert bool(((g_c.double() - g_64).abs() <= 2 * _ULP_BELOW_1 * d_weight.abs())[below].all())
    saturated = torch.tanh(unit.w_hat.double()).abs().float() == 1
    assert bool((g_c[saturated] == 0).all()) and bool((g_e[saturated] == 0).all())
