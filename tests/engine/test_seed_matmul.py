"""`seed_mm`, the units' products on a GPU: right, and a seed's numbers (forward and
gradients) the same whatever its batch mates. In Triton's interpreter on the CPU (see
conftest), on CUDA when torch sees a GPU."""

import pytest
import torch

pytest.importorskip("triton", reason="seed_mm is a Triton kernel")

from service.units.seed_matmul import seed_mm  # noqa: E402

SHAPES = [(1, 1, 1), (5, 3, 7), (70, 40, 100), (17, 1, 33), (128, 2, 100)]  # (M, N, K)


def _operands(device: str, seeds: int, m: int, n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(seeds, m, k, generator=g)
    b = torch.randn(seeds, k, n, generator=g)
    return a.to(device).requires_grad_(), b.to(device).requires_grad_()


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_products_and_gradients_are_those_of_bmm(device: str, m: int, n: int, k: int) -> None:
    a, b = _operands(device, 3, m, n, k)
    out = seed_mm(a, b)
    ref = torch.bmm(a.double(), b.double())
    assert out.dtype == torch.float32 and out.shape == (3, m, n)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    g = torch.randn(3, m, n, generator=torch.Generator().manual_seed(1)).to(device)
    ga, gb = torch.autograd.grad(out, (a, b), g)
    torch.testing.assert_close(ga.double(), g.double() @ b.double().transpose(1, 2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gb.double(), a.double().transpose(1, 2) @ g.double(), rtol=1e-5, atol=1e-5)


def test_strided_and_shared_operands(device: str) -> None:
    """Transposed views (the units pass ``wᵀ``) and one matrix shared by every seed
    (stride 0) read right."""
    a, w = _operands(device, 4, 9, 6, 11)
    shared = torch.randn(11, 6).to(device)
    for b in (w.detach().transpose(1, 2).contiguous().transpose(1, 2), shared.expand(4, 11, 6)):
        torch.testing.assert_close(seed_mm(a.detach(), b), torch.bmm(a.detach(), b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,n,k", SHAPES[1:])
def test_a_seed_is_computed_from_its_own_operands_alone(device: str, m: int, n: int, k: int) -> None:
    seeds, me = 6, 4
    a, b = _operands(device, seeds, m, n, k)
    g = torch.randn(seeds, m, n, generator=torch.Generator().manual_seed(2)).to(device)
    out = seed_mm(a, b)
    ga, gb = torch.autograd.grad(out, (a, b), g)
    a1, b1 = a.detach()[me:me + 1].clone().requires_grad_(), b.detach()[me:me + 1].clone().requires_grad_()
    out1 = seed_mm(a1, b1)
    ga1, gb1 = torch.autograd.grad(out1, (a1, b1), g[me:me + 1])
    assert torch.equal(out[me:me + 1], out1)
    assert torch.equal(ga[me:me + 1], ga1) and torch.equal(gb[me:me + 1], gb1)


def test_compiled_steps_keep_it_whole(device: str) -> None:
    """Under ``torch.compile`` the operator stays one opaque call (its fake and backward
    registered): the same bits as eager, forward and gradients."""
    def loss(a, b, c):
        return (torch.ops.nalu_sweep.seed_mm(a, b) * c).sum()

    a, b = _operands(device, 3, 20, 5, 9)
    c = torch.randn(3, 20, 5, generator=torch.Generator().manual_seed(3)).to(device)
    eager = torch.autograd.grad(loss(a, b, c), (a, b))
    compiled = torch.autograd.grad(torch.compile(loss, dynamic=False)(a, b, c), (a, b))
    assert all(torch.equal(x, y) for x, y in zip(eager, compiled))
