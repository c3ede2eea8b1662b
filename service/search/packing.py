"""Which searched parameters may differ between the trials of one pack.

With ``pack: K`` a sweep trains up to K trials as one seed-batched computation
(`service.training.packing.PackedTrainer`). Those trials must share their structure, so
they share the value of every parameter that could change it; only *packable*
parameters differ: continuous ones (not categorical) whose every target is a continuous
setting the trainer can hold per seed (`packable_path`: learning rate, betas, λ_max,
schedule times, gate temperatures and bias, ...), and whose ``when`` names no other
packable parameter (so whether it exists is the same for every member).
"""

from __future__ import annotations

from service.search.space import CategoricalParam, SearchSpace


def packable_params(space: SearchSpace) -> set[str]:
    """Names of the parameters that may take another value in each member of a pack."""
    from service.pack_structure import packable_path

    candidates = {name for name, p in space.params.items()
                  if not isinstance(p, CategoricalParam) and all(packable_path(t) for t in p.targets(name))}
    return {name for name in candidates if not set(space.params[name].when) & candidates}


def pack_problems(space: SearchSpace) -> list[tuple[str, str]]:
    """``(key, message)`` for a ``pack`` this space cannot use (checked after the run
    configs themselves are known to build)."""
    if space.pack == 1:
        return []
    from service.pack_structure import packable
    from service.search.assign import run_configs
    from service.search.targets import searched_values

    if space.sampler.type == "grid":
        return [("pack", ("a grid sampler sets categorical parameters only, so the trials of a pack could not "
                          "differ; use sampler: tpe or random, or pack: 1"))]
    if not packable_params(space):
        return [("pack", ("no searched parameter may differ within a pack: that needs a loguniform, uniform or "
                          "int parameter whose targets are all continuous settings (train.optimizer.lr, "
                          "train.regularizer.lambda_max, model.layers.N.options.tau_start, ...); or use pack: 1"))]
    for name, config in run_configs(space, searched_values(space)).items():
        if not packable(config):
            return [("pack", f"task {name!r} is recurrent, and recurrent tasks train alone; use pack: 1")]
    return []
