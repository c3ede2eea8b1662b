"""A compiled step keeps a seed a seed for the layers with a bias: the bias gradient is a
sum over the batch rows, which the compiled step added in an order set by the seed count
(an MLP's first bias: 7.45e-9 apart after 60 steps, one seed alone against the same seed
among 16). `service.units.kernels.add_bias` fixes that order."""

import torch

from service.config import RunConfig
from service.training import Trainer


def _config(seeds: int, seed_offset: int = 0) -> RunConfig:
    return RunConfig.model_validate({
        "task": {"kind": "arithmetic", "operation": "mul", "eval_samples": 500, "threshold_samples": 20_000},
        "model": {"layers": [{"unit": "mlp"}, {"unit": "nmu"}]},
        "train": {"steps": 60, "batch_size": 16, "eval_every": 20},
        "seeds": seeds, "seed_offset": seed_offset, "device": "cpu", "compile": "on"})


def test_a_compiled_mlp_seed_trains_the_same_alone_and_among_sixteen():
    together, alone = Trainer(_config(16)), Trainer(_config(1, 5))
    for _ in range(60):
        together.train_step()
        alone.train_step()
    differing = [name for (name, a), b in zip(together.model.named_parameters(), alone.model.parameters())
                 if not torch.equal(a[5:6], b)]
    assert differing == []
