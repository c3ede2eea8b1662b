"""Hyperparameter search: YAML search spaces, Optuna define-by-run, Ray Tune sweeps.

Imports stay light here (no Ray): `space`, `suggest` and `objective` work with Optuna
alone; `tune_runner` brings in Ray when a sweep actually runs.
"""

from service.search.objective import objective_value
from service.search.space import SearchSpace, SearchSpaceError, load_space, parse_space

__all__ = ["SearchSpace", "SearchSpaceError", "load_space", "objective_value", "parse_space"]
