"""Initial weights come from Philox streams of their own, keyed (master seed, "init", seed
id) (`service.seeding.InitStream`): the data streams' generator, so seed ids never share
a stream; a seed's weights are its own alone or among others, and the same on every
device."""

from __future__ import annotations

import pytest
import torch

from service.config import RunConfig
from service.seeding import InitStream, generator as rng, philox, stream_keys
from service.training.trainer import Trainer


def _config(seeds: int, offset: int = 0, layers=None, **extra) -> RunConfig:
    return RunConfig.model_validate({
        "task": {"kind": "small_mul", "eval_samples": 64, "threshold_samples": 1000},
        "model": {"layers": layers or [{"unit": "nau"}, {"unit": "nmu"}]},
        "seeds": seeds, "seed_offset": offset, "compile": "off", "train": {"steps": 1}, **extra})


def _weights(trainer: Trainer) -> torch.Tensor:
    """``[S, P]``: every parameter of each seed, flattened."""
    return torch.cat([p.detach().flatten(1) for p in trainer.model.parameters()], 1)


def test_the_stream_is_philox_under_the_init_key():
    """The k-th fill of a seed is call k of the Philox stream (master, "init", seed id):
    the generator and the key layout of the data streams, under its own key."""
    stream = InitStream(7, "init", 123)
    first, second = torch.empty(3, 5), torch.empty(11)
    stream.uniform_(first, -2.0, 2.0)
    stream.uniform_(second, 0.25, 0.75)
    keys = stream_keys(7, "init", [123])
    u0, u1 = rng.uniform(keys, 0, (15,))[0], rng.uniform(keys, 1, (11,))[0]
    assert torch.equal(first, (u0.double() * 4.0 - 2.0).float().view(3, 5))
    assert torch.equal(second, (u1.double() * 0.5 + 0.25).float())
    # the torch-ops Philox (the CUDA path) gives the same numbers as the CPU kernel
    assert torch.equal(philox.uniform(keys, torch.tensor(0), 15)[0], u0)
    # not the seed's data stream, nor another master's or a re-initialisation's
    for other in (stream_keys(7, "data", [123]), stream_keys(8, "init", [123]), stream_keys(7, "reinit/1", [123])):
        assert not torch.equal(rng.uniform(other, 0, (15,))[0], u0)


def test_uniform_and_normal_fills_have_their_distribution():
    u = InitStream(0, "init", 5).uniform_(torch.empty(200_000), -3.0, 1.0)
    assert float(u.min()) >= -3.0 and float(u.max()) < 1.0
    assert float(u.mean()) == pytest.approx(-1.0, abs=0.02)
    assert float(u.var()) == pytest.approx(16 / 12, rel=0.02)
    z = InitStream(0, "init", 5).normal_(torch.empty(200_000, dtype=torch.float64), 0.5, 2.0)
    assert torch.isfinite(z).all()
    assert float(z.mean()) == pytest.approx(0.5, abs=0.03)
    assert float(z.std()) == pytest.approx(2.0, rel=0.02)
    assert float(((z - 0.5).abs() < 2.0).double().mean()) == pytest.approx(0.6827, abs=0.01)


def test_seed_ids_are_checked():
    for bad in (-1, 1 << 32):
        with pytest.raises(ValueError, match="outside"):
            InitStream(0, "init", bad)


@pytest.mark.parametrize("layers", [
    [{"unit": "nau"}, {"unit": "nmu"}],
    [{"unit": "nalu"}, {"unit": "nalu", "init": "xavier_normal"}],
])
def test_a_seed_starts_from_the_same_weights_alone_and_among_many(layers):
    among = _weights(Trainer(_config(40, layers=layers)))
    for k in (0, 17, 39):
        alone = _weights(Trainer(_config(1, offset=k, layers=layers)))
        assert torch.equal(alone[0], among[k]), k
    later = _weights(Trainer(_config(5, offset=37, layers=layers)))  # seeds 37..41
    assert torch.equal(later[:3], among[37:40])


def test_initial_weights_are_distinct_over_ten_thousand_seed_ids():
    """Seeds 0..9,999 and 2**32 − 1: no two start alike, in any weight tensor (a key that
    dropped bits of the seed id, e.g. ``seed_id & 0xFFF``, makes seeds 0 and 4096 equal)."""
    trainer = Trainer(_config(10_000))
    for name, p in trainer.model.named_parameters():
        rows = p.detach().flatten(1)
        assert torch.unique(rows, dim=0).shape[0] == rows.shape[0], name
    last = Trainer(_config(1, offset=(1 << 32) - 1))
    assert not (_weights(trainer) == _weights(last)).all(1).any()


def test_a_re_initialisation_draws_from_its_own_stream():
    trainer = Trainer(_config(3))
    start = _weights(trainer).clone()
    trainer.reinit_counts[1] = 1
    trainer._reset_positions([1])
    now = _weights(trainer)
    assert torch.equal(now[[0, 2]], start[[0, 2]]) and not torch.equal(now[1], start[1])
    layer = trainer.model.units[0].weight.detach()[1]
    expected = InitStream(0, "reinit/1", 1).uniform_(torch.empty_like(layer), -0.5, 0.5)
    assert torch.equal(layer, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
@pytest.mark.parametrize("layers", [
    [{"unit": "nau"}, {"unit": "nmu"}],
    [{"unit": "nalu"}, {"unit": "nalu", "init": "kaiming_normal"}],
])
def test_initial_weights_are_the_same_on_cpu_and_cuda(layers):
    cpu = _weights(Trainer(_config(8, layers=layers)))
    gpu = _weights(Trainer(_config(8, layers=layers, device="cuda")))
    assert torch.equal(cpu, gpu.cpu())
    keys = stream_keys(0, "init", [3])
    assert torch.equal(philox.uniform(keys.cuda(), torch.tensor(0), 64).cpu(), rng.uniform(keys, 0, (64,)))
