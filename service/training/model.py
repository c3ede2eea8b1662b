"""The seed-batched model of a `RunConfig`: its units built and chained (a recurrent task's
read-out and cell in `service.training.recurrent_model`)."""

from __future__ import annotations

from service.config import RunConfig
from service.training.batched_model import BatchedModel
from service.training.recurrent_model import build_recurrent_model
from service.units.registry import build_unit

__all__ = ["BatchedModel", "build_model"]


def build_model(config: RunConfig, num_seeds: int | None = None) -> BatchedModel:
    """Layers from the config (or the task's reference model), widths chained through
    ``model.hidden_size``; parameters are zero until `reset_parameters`."""
    if getattr(config.task, "recurrent", False):  # recurrent tasks: read-out + cell
        return build_recurrent_model(config, num_seeds)
    layers = config.layers()
    task = config.task
    num_seeds = config.seeds if num_seeds is None else num_seeds
    widths = [task.input_size] + [config.model.hidden_size] * (len(layers) - 1) + [task.output_size]
    units = [
        build_unit(layer.unit, widths[i], widths[i + 1], num_seeds, layer.options, layer.init)
        for i, layer in enumerate(layers)
    ]
    for i, unit in enumerate(units):
        unit.noise_stream = i  # two noisy (Gumbel-gated) layers never share noise
    return BatchedModel(units)
