"""Seed-batched training: one computation trains every seed of a configuration."""

from service.training.checkpoint import TrainerCheckpoint
from service.training.trainer import EvalReport, Trainer, train

__all__ = ["EvalReport", "Trainer", "TrainerCheckpoint", "train"]
