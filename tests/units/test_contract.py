"""The contract every registered unit (and every NALU variant) must keep."""

from __future__ import annotations

import pickle

import pytest
import torch
from pydantic import ValidationError

from service.seeding import InitStream
from service.units import (
    ForwardContext,
    UnknownUnitError,
    build_unit,
    get_unit,
    unit_names,
)
from service.units.base import Unit
from service.units.init import INIT_NAMES

IN, OUT, BATCH = 3, 2, 8
SEEDS = [5, 17, 2]

NALU_VARIANTS: list[dict] = [
    {},
    {"weights": "independent"},
    {"gate": "bias", "gate_bias_init": 1.0},
    {"gate": "input_independent", "weights": "independent"},
    {"gate": "temperature"},
    {"gate": "temperature", "tau_schedule": "exponential", "weights": "independent"},
    {"gate": "gumbel"},
    {"gate": "gumbel", "tau_schedule": "exponential", "weights": "independent"},
    {"gate": "bias", "tau_schedule": "linear", "tau_t0": 2, "tau_t1": 10},
    {"log": "safe"},
    {"log": "relu", "weights": "independent"},
    {"mul_unit": "nmu", "weights": "independent"},
    {"mul_unit": "nmu", "weights": "independent", "gate": "gumbel"},
    {"add_unit": "nau", "mul_unit": "nmu"},  # the gated NAU/NMU (NAU paper)
    {"add_unit": "nau", "weights": "independent", "gate": "bias", "log": "safe"},
    {"sign_correction": True},
    {"sign_correction": True, "weights": "independent", "log": "safe"},
]
MLP_VARIANTS: list[dict] = [{"activation": "prelu", "hidden_sizes": [4, 4]}, {"activation": "none"}]

CASES = (
    [pytest.param(name, {}, id=name) for name in unit_names()]
    + [pytest.param("nalu", o, id="nalu-" + "-".join(f"{k}={v}" for k, v in o.items()))
       for o in NALU_VARIANTS[1:]]
    + [pytest.param("mlp", o, id="mlp-" + o["activation"]) for o in MLP_VARIANTS]
)

UNSUPPORTED_EXACT = {
    ("lstm", "add"): "gates saturate: an LSTM sums only approximately",
    ("lstm", "mul"): "gates saturate: an LSTM sums only approximately",
    ("linear", "mul"): "z = Wx is linear",
    ("reg_linear", "mul"): "z = Wx is linear",
    ("nau", "mul"): "z = Wx is linear",
    ("nac_add", "mul"): "z = Wx is linear",
    ("nmu", "add"): "a product, not a sum",
    ("nac_mul", "add"): "exp(W log x) is a product of powers",
    ("npu", "add"): "a product of powers",
    ("real_npu", "add"): "a product of powers",
    ("mlp", "add"): "activations make an MLP only approximate on a bounded range",
    ("mlp", "mul"): "activations make an MLP only approximate on a bounded range",
}
EXACT_W = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])


def generators(seeds: list[int]) -> list[InitStream]:
    return [InitStream(0, "init", 1000 + s) for s in seeds]


def context(seeds: list[int], step: int = 7) -> ForwardContext:
    """Noise keys follow the seed, not its batch position."""
    return ForwardContext(step=torch.tensor(step), noise_keys=torch.tensor(seeds) + 101)


def make(name: str, options: dict, seeds: list[int] = SEEDS, init: str = "default") -> Unit:
    unit = build_unit(name, IN, OUT, len(seeds), options, init)
    unit.reset_parameters(generators(seeds))
    return unit


def inputs(n_seeds: int, low: float = 1.0, high: float = 2.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(n_seeds, BATCH, IN, generator=g)


def params_of(unit: Unit) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in unit.named_parameters()}


@pytest.mark.parametrize("name, options", CASES)
def test_shapes_and_finite_gradients(name: str, options: dict) -> None:
    unit = make(name, options)
    x = inputs(len(SEEDS)).requires_grad_(True)
    z = unit(x, context(SEEDS))
    assert z.shape == (len(SEEDS), BATCH, OUT)
    for per_seed in (unit.regularizer(), unit.oob_penalty(), unit.sparsity_error()):
        assert per_seed.shape == (len(SEEDS),)
        assert torch.isfinite(per_seed).all()
    loss = z.square().mean() + unit.regularizer().sum() + unit.oob_penalty().sum()
    loss.backward()
    grads = [p.grad for p in unit.parameters() if p.grad is not None]
    assert grads, "no parameter received a gradient"
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.isfinite(x.grad).all()
    for w in unit.weight_matrices().values():
        assert w.shape[0] == len(SEEDS)


CONSTRAINED = {"nau", "nmu", "npu", "real_npu"}


@pytest.mark.parametrize("name, options", CASES)
def test_clamp_restores_constraints(name: str, options: dict) -> None:
    unit = make(name, options)
    with torch.no_grad():
        for p in unit.parameters():
            p.uniform_(-3.0, 3.0, generator=torch.Generator().manual_seed(3))
    constrained = (name in CONSTRAINED or options.get("mul_unit") == "nmu"
                   or options.get("add_unit") == "nau")
    if constrained:
        assert (unit.oob_penalty() > 0).all()
    unit.clamp_()
    assert torch.equal(unit.oob_penalty(), torch.zeros(len(SEEDS)))
    if name == "nau" or options.get("add_unit") == "nau":
        w = unit.weight if name == "nau" else unit.nau_weight
        assert w.abs().max() <= 1
    if name == "nmu" or options.get("mul_unit") == "nmu":
        w = unit.weight if name == "nmu" else unit.mul_weight
        assert w.min() >= 0 and w.max() <= 1
    if name in ("npu", "real_npu"):
        assert unit.gate.min() >= 0 and unit.gate.max() <= 1


@pytest.mark.parametrize("name, options", CASES)
def test_state_dict_and_pickle_round_trip(name: str, options: dict) -> None:
    unit = make(name, options)
    x, ctx = inputs(len(SEEDS)), context(SEEDS)
    expected = unit(x, ctx)
    fresh = make(name, options, seeds=[90, 91, 92])
    fresh.load_state_dict(unit.state_dict())
    assert torch.equal(fresh(x, ctx), expected)
    restored = pickle.loads(pickle.dumps(unit))
    assert torch.equal(restored(x, ctx), expected)
    assert restored.options == unit.options


@pytest.mark.parametrize("name, options", CASES)
def test_seeds_are_independent(name: str, options: dict) -> None:
    unit = make(name, options)
    x, ctx = inputs(len(SEEDS)), context(SEEDS)
    before = unit(x, ctx).detach()
    j = 1
    with torch.no_grad():
        for p in unit.parameters():
            p[j] += 0.1 + 0.05 * torch.rand(p[j].shape, generator=torch.Generator().manual_seed(4))
    after = unit(x, ctx).detach()
    others = [k for k in range(len(SEEDS)) if k != j]
    assert torch.equal(after[others], before[others])
    assert not torch.equal(after[j], before[j])

    k = 2
    not_k = [i for i in range(len(SEEDS)) if i != k]
    z = unit(x, ctx)
    (z[k].square().mean() + unit.regularizer()[k] + unit.oob_penalty()[k]).backward()
    for pname, p in unit.named_parameters():
        if p.grad is not None:
            assert torch.equal(p.grad[not_k], torch.zeros_like(p.grad[not_k])), pname


@pytest.mark.parametrize("name, options", CASES)
def test_seed_init_and_output_do_not_depend_on_batch(name: str, options: dict) -> None:
    alone = make(name, options, seeds=[SEEDS[2]])
    batched = make(name, options, seeds=SEEDS + [40])
    for pname, p in alone.named_parameters():
        assert torch.equal(dict(batched.named_parameters())[pname][2], p[0]), pname
    x = inputs(len(SEEDS) + 1)
    z_batched = batched(x, context(SEEDS + [40]))
    z_alone = alone(x[2:3], context([SEEDS[2]]))
    torch.testing.assert_close(z_alone[0], z_batched[2], rtol=1e-6, atol=1e-6)


INIT_SPECS = [n for n in INIT_NAMES if n != "uniform"] + ["uniform(-0.3, 0.4)"]


@pytest.mark.parametrize("init", INIT_SPECS)
@pytest.mark.parametrize("name", unit_names())
def test_every_init_spec_works_on_every_unit(name: str, init: str) -> None:
    unit = make(name, {}, init=init)
    assert all(torch.isfinite(p).all() for p in unit.parameters())
    z = unit(inputs(len(SEEDS)), context(SEEDS))
    assert z.shape == (len(SEEDS), BATCH, OUT)
    main = {"linear": "weight", "reg_linear": "weight", "nau": "weight", "nmu": "weight",
            "nac_add": "w_hat", "nac_mul": "w_hat", "npu": "w_re", "real_npu": "w_re",
            "nalu": "add_w_hat", "inalu": "mul_m_hat", "mlp": "weights.0", "lstm": "w_ih"}
    w = dict(unit.named_parameters())[main[name]]
    if init == "zeros":
        assert torch.equal(w, torch.zeros_like(w))
    elif init == "ones":
        assert torch.equal(w, torch.ones_like(w))
    elif init.startswith("uniform"):
        assert w.min() >= -0.3 and w.max() <= 0.4


EXACT_CASES = [
    pytest.param(name, options, mode, id=f"{pid}-{mode}")
    for name, options, pid in (
        [(n, {}, n) for n in unit_names()]
        + [("nalu", o, "nalu-" + "-".join(f"{k}={v}" for k, v in o.items()))
           for o in NALU_VARIANTS[1:]]
    )
    for mode in ("add", "mul")
]


@pytest.mark.parametrize("name, options, mode", EXACT_CASES)
def test_exact_weights_give_zero_error(name: str, options: dict, mode: str) -> None:
    unit = make(name, options)
    if (name, mode) in UNSUPPORTED_EXACT:
        with pytest.raises(NotImplementedError):
            unit.load_exact_(EXACT_W, mode)
        return
    unit.load_exact_(EXACT_W, mode)
    unit.eval()
    for low, high in ((1.0, 2.0), (2.0, 6.0)):
        x = inputs(len(SEEDS), low, high, seed=9)
        target = x @ EXACT_W.T if mode == "add" else torch.exp(torch.log(x) @ EXACT_W.T)
        z = unit(x, context(SEEDS)).detach()
        relative = ((z - target).abs() / target.abs()).max()
        assert relative < 1e-4, (low, high, float(relative))


def test_the_torch_free_catalog_names_every_registered_unit_with_its_options() -> None:
    """Run configs are checked against `service.units.options` (no torch); the units train
    with the registry's classes: the two must name the same units with the same options."""
    from service.units.options import UNIT_OPTIONS

    assert sorted(UNIT_OPTIONS) == unit_names()
    for name in unit_names():
        assert get_unit(name).Options is UNIT_OPTIONS[name], name


def test_unknown_unit_lists_valid_names() -> None:
    with pytest.raises(UnknownUnitError) as info:
        get_unit("nalu2")
    message = str(info.value)
    assert "nalu2" in message
    assert all(name in message for name in unit_names())
    with pytest.raises(UnknownUnitError):
        build_unit("NAU", 2, 1, 1)


@pytest.mark.parametrize(
    "name, options",
    [
        ("nalu", {"gat": "bias"}),
        ("nalu", {"gate": "sigmoid"}),
        ("nalu", {"weights": "shared", "mul_unit": "nmu"}),
        ("nalu", {"weights": "shared", "add_unit": "nau", "mul_unit": "nmu"}),
        ("nalu", {"add_unit": "nac"}),
        ("nalu", {"tau_t0": 10, "tau_t1": 10}),
        ("nalu", {"epsilon": 0.0}),
        ("mlp", {"activation": "swish"}),
        ("mlp", {"hidden_sizes": [8, 0]}),
        ("nau", {"clamp": True}),
        ("inalu", {"omega": -1}),
        ("npu", {"epsilon": -1e-7}),
    ],
)
def test_bad_options_are_validation_errors(name: str, options: dict) -> None:
    with pytest.raises(ValidationError):
        build_unit(name, 2, 1, 1, options)


@pytest.mark.parametrize("name, options, attr, low, high", [
    ("nmu", {}, "weight", 0.0, 1.0),
    ("nau", {}, "weight", -1.0, 1.0),
    ("nalu", {"add_unit": "nau", "mul_unit": "nmu"}, "mul_weight", 0.0, 1.0),
    ("nalu", {"add_unit": "nau", "mul_unit": "nmu"}, "nau_weight", -1.0, 1.0),
    ("npu", {}, "gate", 0.0, 1.0),
])
def test_clamp_is_the_projection_onto_the_papers_bounds(name, options, attr, low, high) -> None:
    """``clamp_`` maps every weight to the nearest point of its box (NMU [0, 1], NAU
    [−1, 1]): weights inside stay, weights outside land exactly on a bound. A bound set
    tighter (e.g. NMU [0, 0.9]) or looser fails here, not only in slow training tests."""
    unit = make(name, options)
    w = getattr(unit, attr)
    with torch.no_grad():
        w.copy_(torch.linspace(-3.0, 3.0, w.numel()).view_as(w))
    before = w.detach().clone()
    assert ((before > low) & (before < high)).any() and (before < low).any() and (before > high).any()
    unit.clamp_()
    assert torch.equal(w.detach(), before.clamp(low, high))
