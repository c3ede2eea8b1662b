"""nalu-sweep: seed-robust hyperparameter search for neural arithmetic units."""

__version__ = "0.1.0"
