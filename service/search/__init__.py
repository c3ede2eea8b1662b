"""Search spaces: the YAML schema and its checks, the assignment of searched values to run
configs, and the Optuna define-by-run sampling of a space. Optuna only — no Ray here; the
sweep that runs trials is `service.sweep`."""

from service.search.loading import load_space, parse_space
from service.search.space import SearchSpace, SearchSpaceError

__all__ = ["SearchSpace", "SearchSpaceError", "load_space", "parse_space"]
