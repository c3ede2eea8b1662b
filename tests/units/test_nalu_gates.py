"""NALU gate temperature schedules, Gumbel noise, and compile-friendliness of the step."""

from __future__ import annotations

import math

import pytest
import torch

from service.seeding import InitStream
from service.units import ForwardContext, build_unit, unit_names
from service.units.nalu import NALU


def nalu(options: dict, seeds: tuple[int, ...] = (0, 1)) -> NALU:
    unit = build_unit("nalu", 3, 2, len(seeds), options)
    unit.reset_parameters([InitStream(0, "init", s) for s in seeds])
    return unit  # type: ignore[return-value]


def ctx(step: int, keys: tuple[int, ...] = (11, 12)) -> ForwardContext:
    return ForwardContext(step=torch.tensor(step), noise_keys=torch.tensor(keys))


def test_linear_temperature_schedule() -> None:
    unit = nalu({"gate": "temperature", "tau_start": 0.2, "tau_end": 1.0,
                 "tau_t0": 100, "tau_t1": 300})
    values = [float(unit.gate_sharpness(torch.tensor(t))) for t in (0, 100, 200, 300, 10_000)]
    assert values == pytest.approx([0.2, 0.2, 0.6, 1.0, 1.0])


def test_exponential_temperature_divides_the_pre_activation() -> None:
    unit = nalu({"gate": "gumbel", "tau_schedule": "exponential", "tau_rate": 1e-5, "tau_min": 0.5})
    for t in (0, 10_000, 10**7):
        expected = 1.0 / max(0.5, math.exp(-1e-5 * t))
        assert float(unit.gate_sharpness(torch.tensor(t))) == pytest.approx(expected, rel=1e-6)


def test_temperature_enters_the_gate() -> None:
    unit = nalu({"gate": "temperature", "tau_t0": 0, "tau_t1": 10})
    x = torch.rand(2, 4, 3) + 1
    g0 = unit.gate_value(x, ctx(0))
    g_end = unit.gate_value(x, ctx(10))
    pre = x @ unit.gate_weight.transpose(-1, -2)
    torch.testing.assert_close(g0, torch.sigmoid(0.2 * pre))
    torch.testing.assert_close(g_end, torch.sigmoid(pre))
    torch.testing.assert_close(unit.gate_value(x, None), g0)  # no context: step 0


def test_gumbel_noise_only_in_training_and_deterministic() -> None:
    unit = nalu({"gate": "gumbel"})
    x = torch.rand(2, 16, 3) + 1
    clean = unit.gate_value(x, None)
    noisy = unit.gate_value(x, ctx(5))
    assert not torch.allclose(noisy, clean)
    torch.testing.assert_close(unit.gate_value(x, ctx(5)), noisy)
    assert not torch.allclose(unit.gate_value(x, ctx(6)), noisy)
    unit.noise_stream = 1
    assert not torch.allclose(unit.gate_value(x, ctx(5)), noisy)
    unit.eval()
    torch.testing.assert_close(unit.gate_value(x, ctx(5)), clean)


def test_gumbel_noise_is_logistic() -> None:
    unit = nalu({"gate": "gumbel"}, seeds=(0,))
    with torch.no_grad():
        unit.gate_weight.zero_()
    x = torch.ones(1, 20_000, 3)
    noise = torch.logit(unit.gate_value(x, ctx(3, keys=(7,))).detach().double())
    assert float(noise.mean()) == pytest.approx(0.0, abs=0.05)
    assert float(noise.var()) == pytest.approx(math.pi**2 / 3, rel=0.05)


def test_gumbel_training_without_noise_keys_is_an_error() -> None:
    unit = nalu({"gate": "gumbel"})
    with pytest.raises(ValueError, match="noise_keys"):
        unit(torch.rand(2, 4, 3) + 1, ForwardContext(step=torch.tensor(0)))


@pytest.mark.parametrize(
    "name, options",
    [("nmu", {}), ("npu", {}), ("inalu", {}),
     ("nalu", {"gate": "gumbel", "tau_schedule": "exponential", "weights": "independent",
               "sign_correction": True}),
     ("nalu", {"gate": "temperature", "mul_unit": "nmu", "weights": "independent"}),
     ("nalu", {"gate": "bias", "add_unit": "nau", "mul_unit": "nmu"})],
)
def test_step_traces_as_one_graph_for_every_step(name: str, options: dict) -> None:
    """forward + regulariser trace with fullgraph (no .item(), no data-dependent Python) and
    a new step value does not re-trace (the schedule is computed from the step tensor)."""
    assert name in unit_names()
    torch._dynamo.reset()
    unit = build_unit(name, 3, 2, 2, options)
    unit.reset_parameters([InitStream(0, "init", s) for s in (0, 1)])
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    def step(x: torch.Tensor, context: ForwardContext) -> torch.Tensor:
        z = unit(x, context)
        return z.square().mean() + unit.regularizer().sum() + unit.oob_penalty().sum()

    compiled = torch.compile(step, backend=backend, fullgraph=True)
    x = torch.rand(2, 4, 3) + 1
    for t in (0, 1, 12_345):
        loss = compiled(x, ctx(t))
        torch.testing.assert_close(loss, step(x, ctx(t)))
        loss.backward()
    assert len(frames) == 1
