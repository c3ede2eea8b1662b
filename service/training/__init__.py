"""Seed-batched training: one computation trains every seed of a configuration."""

from service.training.checkpoint import TrainerCheckpoint
from service.training.recurrent import RecurrentTrainer  # registers a recurrent task's trainer
from service.training.trainer import EvalReport, Trainer, train

__all__ = ["EvalReport", "RecurrentTrainer", "Trainer", "TrainerCheckpoint", "train"]
