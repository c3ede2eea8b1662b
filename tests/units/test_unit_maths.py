"""Regularisers, initialisations and forwards against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from service.seeding import InitStream
from service.units import build_unit
from service.units.base import Unit
from service.units.nac import nac_init_range, nac_weight, nac_weight_variance
from service.units.nalu import log_transform, product_sign
from service.units.nau import nau_init_range


def unit_with(name: str, weights: dict[str, list], options: dict | None = None) -> Unit:
    """A unit whose named parameters are set to the given per-seed values."""
    first = torch.tensor(next(iter(weights.values())))
    unit = build_unit(name, first.shape[-1], first.shape[-2], first.shape[0], options)
    with torch.no_grad():
        for pname, value in weights.items():
            dict(unit.named_parameters())[pname].copy_(torch.tensor(value))
    return unit


def test_nau_regularizer_oob_and_sparsity_by_hand() -> None:
    unit = unit_with("nau", {"weight": [[[0.2, -0.9], [1.0, 0.5]], [[0.0, -1.0], [1.0, 0.0]]]})
    # min(|w|, 1-|w|): seed 0 -> 0.2, 0.1, 0, 0.5 (mean 0.2); seed 1 -> all 0.
    torch.testing.assert_close(unit.regularizer(), torch.tensor([0.2, 0.0]))
    torch.testing.assert_close(unit.sparsity_error(), torch.tensor([0.5, 0.0]))
    assert torch.equal(unit.oob_penalty(), torch.zeros(2))
    unit = unit_with("nau", {"weight": [[[1.5, -1.25]]]})
    torch.testing.assert_close(unit.oob_penalty(), torch.tensor([(0.5 + 0.25) / 2]))
    unit.clamp_()
    assert torch.equal(unit.weight, torch.tensor([[[1.0, -1.0]]]))


def test_nmu_regularizer_oob_and_forward_by_hand() -> None:
    unit = unit_with("nmu", {"weight": [[[0.2, 0.9], [1.0, 0.5]], [[0.0, 1.0], [1.0, 0.0]]]})
    # min(w, 1-w): seed 0 -> 0.2, 0.1, 0, 0.5 (mean 0.2); seed 1 -> all 0.
    torch.testing.assert_close(unit.regularizer(), torch.tensor([0.2, 0.0]))
    x = torch.tensor([[[3.0, 5.0]], [[3.0, 5.0]]])
    # seed 0: (0.2*3+0.8)(0.9*5+0.1) = 1.4*4.6, (3)(0.5*5+0.5) = 9; seed 1: 5, 3.
    torch.testing.assert_close(unit(x), torch.tensor([[[1.4 * 4.6, 9.0]], [[5.0, 3.0]]]))
    unit = unit_with("nmu", {"weight": [[[-0.5, 1.25]]]})
    torch.testing.assert_close(unit.oob_penalty(), torch.tensor([(0.5 + 0.25) / 2]))


def test_reg_linear_regularizer_by_hand() -> None:
    unit = unit_with("reg_linear", {"weight": [[[0.5, -2.0]]]})
    # w²(1-|w|)²: 0.25*0.25 = 0.0625 and 4*1 = 4 -> mean 2.03125
    torch.testing.assert_close(unit.regularizer(), torch.tensor([2.03125]))


def test_inalu_regularizer_pulls_towards_saturation() -> None:
    unit = build_unit("inalu", 2, 1, 3)
    with torch.no_grad():
        for p in unit.parameters():
            p[0] = 0.0
            p[1] = 10.0
            p[2] = -25.0
    # relu(t - |p|)/t with t = 20: 1 at 0, 0.5 at |p| = 10, 0 beyond 20.
    torch.testing.assert_close(unit.regularizer(), torch.tensor([1.0, 0.5, 0.0]))


def test_npu_l1_regularizer_by_hand() -> None:
    unit = unit_with("npu", {"w_re": [[[0.5, -1.5]]], "w_im": [[[0.0, 2.0]]]})
    torch.testing.assert_close(unit.regularizer(), torch.tensor([1.0]))
    unit = unit_with("real_npu", {"w_re": [[[0.5, -1.5]]]})
    torch.testing.assert_close(unit.regularizer(), torch.tensor([1.0]))


@pytest.mark.parametrize("name", ["npu", "real_npu"])
def test_npu_keeps_the_sign_of_negative_inputs(name: str) -> None:
    unit = build_unit(name, 2, 1, 1)
    unit.load_exact_(torch.tensor([[1.0, 1.0]]), "mul")
    x = torch.tensor([[[-2.0, 3.0], [-2.0, -3.0], [0.5, 4.0]]])
    expected = torch.tensor([[[-6.0], [6.0], [2.0]]])
    torch.testing.assert_close(unit(x), expected, rtol=1e-5, atol=1e-5)


def test_inalu_sign_recovery_and_overflow_clip() -> None:
    unit = build_unit("inalu", 3, 1, 1)
    unit.load_exact_(torch.tensor([[1.0, 1.0, 0.0]]), "mul")
    x = torch.tensor([[[-2.0, 3.0, -7.0], [-2.0, -3.0, 5.0]]])
    torch.testing.assert_close(unit(x), torch.tensor([[[-6.0], [6.0]]]))
    big = torch.tensor([[[1e6, 1e6, 1.0]]])
    torch.testing.assert_close(unit(big), torch.tensor([[[math.exp(20.0)]]]), rtol=1e-5, atol=0)


def test_nac_init_range_solves_the_variance_equation() -> None:
    for fan_in, fan_out in [(2, 1), (4, 2), (100, 2), (2, 100), (1, 1)]:
        r = nac_init_range(fan_in, fan_out)
        fan = max(fan_in + fan_out, 5)
        assert fan * nac_weight_variance(r) == pytest.approx(2.0, rel=1e-9)
        # the closed form against a plain quadrature of the two expectations
        w = torch.linspace(-r, r, 200_001, dtype=torch.float64)
        e_tanh2 = torch.trapezoid(torch.tanh(w) ** 2, w) / (2 * r)
        e_sig2 = torch.trapezoid(torch.sigmoid(w) ** 2, w) / (2 * r)
        assert fan * float(e_tanh2 * e_sig2) == pytest.approx(2.0, rel=1e-6)


def test_nac_default_init_has_the_reference_variance() -> None:
    unit = build_unit("nac_add", 60, 40, 2)
    unit.reset_parameters([InitStream(0, "init", s) for s in (1, 2)])
    r = nac_init_range(60, 40)
    assert unit.w_hat.abs().max() <= r and unit.m_hat.abs().max() <= r
    w = nac_weight(unit.w_hat, unit.m_hat).detach()
    assert 100 * float(w.var()) == pytest.approx(2.0, rel=0.1)


def test_nau_and_nmu_default_inits() -> None:
    assert nau_init_range(2, 1) == 0.5
    assert nau_init_range(100, 2) == pytest.approx(math.sqrt(3) * math.sqrt(2 / 102))
    gens = [InitStream(0, "init", 0)]
    nau = build_unit("nau", 100, 2, 1)
    nau.reset_parameters(gens)
    assert nau.weight.abs().max() <= nau_init_range(100, 2)
    nmu = build_unit("nmu", 100, 2, 1)
    nmu.reset_parameters(gens)
    assert nmu.weight.min() >= 0.25 and nmu.weight.max() <= 0.75


def test_log_transforms_and_product_sign() -> None:
    x = torch.tensor([1.0, 1.5, 4.0])
    for kind in ("safe", "relu"):
        torch.testing.assert_close(log_transform(x, kind, 1e-7), torch.log(x))
    minus3, half = torch.tensor([-3.0]), torch.tensor([0.5])
    torch.testing.assert_close(log_transform(minus3, "safe", 1e-7), torch.log(torch.tensor([5.0])))
    torch.testing.assert_close(log_transform(half, "relu", 1e-7), torch.tensor([0.0]))
    xs = torch.tensor([[[-2.0, 3.0]]])
    assert float(product_sign(xs, torch.tensor([[[1.0, 1.0]]]))) == -1.0
    assert float(product_sign(xs, torch.tensor([[[0.0, 1.0]]]))) == 1.0
    assert float(product_sign(xs, torch.tensor([[[0.5, 1.0]]]))) == 0.0  # half-selected


@pytest.mark.parametrize(
    "activation",
    ["relu", "relu6", "sigmoid", "tanh", "leaky_relu", "elu", "selu", "prelu", "silu", "none"],
)
def test_mlp_activations(activation: str) -> None:
    unit = build_unit("mlp", 1, 1, 2, {"activation": activation, "hidden_sizes": [8, 8]})
    unit.reset_parameters([InitStream(0, "init", s) for s in (0, 1)])
    x = torch.linspace(-5, 5, 11).view(1, 11, 1).expand(2, 11, 1)
    z = unit(x)
    assert z.shape == (2, 11, 1) and torch.isfinite(z).all()
    z.sum().backward()
    if activation == "prelu":
        assert unit.prelu_slope.grad is not None and unit.prelu_slope.grad.abs().sum() > 0
