"""The fast paths of the units agree with the plain torch formulas they replace: the native
linear kernel, the two-input NMU (native and torch) and the sparsity regulariser's backward."""

from __future__ import annotations

import pytest
import torch

from service.seeding import InitStream
from service.units import build_unit, kernels
from service.units.base import mean_distance_to_bounds
from service.units.linear import linear_forward
from service.units.nmu import _Product2, nmu_forward


def _matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.matmul(w, x.transpose(-1, -2)).transpose(-1, -2)


def _prod_nmu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (w.unsqueeze(1) * (x.unsqueeze(2) - 1) + 1).prod(-1)


def _grads(f, x, w, g):
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    z = f(x, w)
    return (z.detach(), *torch.autograd.grad(z, (x, w), g))


@pytest.mark.parametrize("S, B, I, O", [(3, 130, 100, 2), (7, 13, 37, 3), (5, 9, 2, 1), (2, 3, 8, 16), (2, 5, 1, 1),
                                        (4, 4, 17, 5), (3, 6, 9, 4)])
def test_linear_matches_matmul(S, B, I, O):
    g = torch.Generator().manual_seed(S * 100 + I)
    x = torch.rand(S, B, I, generator=g) * 4 - 2
    w = torch.rand(S, O, I, generator=g) * 2 - 1
    up = torch.rand(S, B, O, generator=g)
    got, expected = _grads(linear_forward, x, w, up), _grads(_matmul, x, w, up)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # an evaluation set shared by every seed (stride 0) and rows with a stride
    shared = torch.rand(B, I, generator=g).expand(S, B, I)
    torch.testing.assert_close(linear_forward(shared, w), _matmul(shared, w), rtol=1e-5, atol=1e-5)
    strided = torch.rand(S, B, 2 * I, generator=g)[..., ::2]
    torch.testing.assert_close(linear_forward(strided, w), _matmul(strided, w), rtol=1e-5, atol=1e-5)


def test_linear_uses_the_kernel_where_it_can():
    if not kernels.native_available():
        pytest.skip("no native kernel here")
    x, w = torch.rand(2, 4, 10), torch.rand(2, 2, 10)
    assert kernels.usable(x, w)
    assert not kernels.usable(x.double(), w.double())
    assert not kernels.usable(x, torch.rand(2, kernels.MAX_OUT + 1, 10))
    assert not kernels.usable(x, torch.rand(2, 10, 2).transpose(1, 2))  # w not contiguous


def test_linear_rows_of_one_seed_do_not_depend_on_the_batch():
    x, w = torch.rand(9, 33, 100), torch.rand(9, 2, 100)
    together = linear_forward(x, w)
    assert torch.equal(linear_forward(x[4:5], w[4:5]), together[4:5])


@pytest.mark.parametrize("S, B, O", [(3, 5, 1), (4, 7, 3), (2, 128, 1)])
def test_two_input_nmu_matches_prod(S, B, O):
    g = torch.Generator().manual_seed(S + B + O)
    x = torch.rand(S, B, 2, generator=g) * 6 - 3
    w = torch.rand(S, O, 2, generator=g)
    up = torch.rand(S, B, O, generator=g)
    expected = _grads(_prod_nmu, x, w, up)
    for f in (nmu_forward, _Product2.apply):
        got = _grads(f, x, w, up)
        assert torch.equal(got[0], expected[0])  # the same multiplications forward
        for a, b in zip(got[1:], expected[1:]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    for xs in (torch.rand(B, 2, generator=g).expand(S, B, 2), torch.rand(S, 2, B, generator=g).transpose(1, 2)):
        assert torch.equal(nmu_forward(xs, w), _prod_nmu(xs, w))


def test_two_input_nmu_gradcheck():
    x = torch.rand(2, 3, 2, dtype=torch.double, requires_grad=True)
    w = torch.rand(2, 2, 2, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(_Product2.apply, (x, w))
    assert torch.autograd.gradcheck(nmu_forward, (x, w))


def test_nmu_unit_with_two_inputs_keeps_seeds_apart():
    unit = build_unit("nmu", 2, 1, 3)
    unit.reset_parameters([InitStream(0, "init", s) for s in range(3)])
    x = torch.rand(3, 8, 2) + 1
    z = unit(x)
    z[1].sum().backward()
    assert torch.equal(unit.weight.grad[[0, 2]], torch.zeros(2, 1, 2))
    assert unit.weight.grad[1].abs().sum() > 0


def test_mean_distance_to_bounds_has_the_autograd_gradient_of_its_formula():
    # the reference code's form min(|a|, |1 − a|) (NAU: a = |W|; NMU: a = W), bounds included
    w = torch.cat([torch.rand(5, 3, 7) * 3 - 1.5,
                   torch.tensor([0.5, -0.5, 0.0, 1.0, -1.0, 0.25, 0.75]).expand(1, 3, 7)])
    up = torch.rand(6)
    for dtype in (torch.float32, torch.float64):
        for transform in (torch.abs, lambda t: t):
            a = w.to(dtype).requires_grad_(True)
            b = w.to(dtype).requires_grad_(True)
            fast = mean_distance_to_bounds(transform(a))
            plain = torch.minimum(transform(b).abs(), (1 - transform(b)).abs()).flatten(1).mean(1)
            assert torch.equal(fast, plain)
            assert torch.equal(torch.autograd.grad(fast, a, up.to(dtype))[0],
                               torch.autograd.grad(plain, b, up.to(dtype))[0])


@pytest.mark.parametrize("unit_name, weights, expected", [
    # NAU: 0 at W = 0, ±1 (abs'(0) = 0 on the |1 − |W|| side) and at the tie |W| = 1/2
    ("nau", [1.0, -1.0, 0.0, 0.5, -0.5, 0.25, -0.25, 0.75], [0, 0, 0, 0, 0, 1, -1, -1]),
    # NMU: 0 at W = 0, 1 and at the tie W = 1/2
    ("nmu", [0.0, 1.0, 0.5, 0.25, 0.75, 0.0, 1.0, 0.5], [0, 0, 0, 1, -1, 0, 0, 0]),
])
def test_sparsity_regularizer_gradient_at_the_clamp_bounds(unit_name, weights, expected):
    """The regulariser never pushes a weight on its clamp bound outward: d R / d W is 0 at
    |W| = 1 (NAU) and W ∈ {0, 1} (NMU), ±1/n inside, as the reference's expression gives."""
    unit = build_unit(unit_name, 8, 1, 1)
    with torch.no_grad():
        unit.weight.copy_(torch.tensor(weights).view(1, 1, 8))
    (grad,) = torch.autograd.grad(unit.regularizer().sum(), unit.weight)
    assert torch.equal(grad.flatten(), torch.tensor(expected, dtype=torch.float32) / 8)
    w = torch.tensor(weights, requires_grad=True)
    a = w.abs() if unit_name == "nau" else w
    reference = torch.min(a.abs(), (1 - a).abs()).mean()  # the reference code's expression
    (ref_grad,) = torch.autograd.grad(reference, w)
    assert torch.equal(grad.flatten(), ref_grad)


def test_per_row_and_add_bias_sum_their_gradients_over_the_rows():
    """What a GPU takes for a parameter broadcast over the batch rows (`kernels.per_row`,
    `kernels.add_bias`): the broadcast forward, and the gradient summed over the rows in
    `row_sum`'s fixed order, equal to the plain sum up to rounding."""
    g = torch.Generator().manual_seed(0)
    p = torch.randn(3, 2, 4, generator=g, requires_grad=True)
    out = kernels._PerRow.apply(p, 5)
    assert out.shape == (3, 5, 2, 4) and torch.equal(out[:, 3], p.detach())
    up = torch.randn(3, 5, 2, 4, generator=g)
    (grad,) = torch.autograd.grad(out, p, up)
    torch.testing.assert_close(grad, up.sum(1), rtol=1e-6, atol=1e-6)
    b = torch.randn(3, 6, generator=g, requires_grad=True)
    h = torch.randn(3, 5, 6, generator=g)
    up = torch.randn(3, 5, 6, generator=g)
    (gb,) = torch.autograd.grad(kernels.add_bias(h, b), b, up)
    torch.testing.assert_close(gb, up.sum(1), rtol=1e-6, atol=1e-6)
    one = kernels.row_sum(up[1:2])
    assert torch.equal(kernels.row_sum(up)[1:2], one)  # a seed's sum from its own rows
