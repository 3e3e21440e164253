"""Datasets (tfds, image folders, the built-in procedural set) and the Grain pipeline that augments and batches them."""

from alexnet_jax.data.pipeline import Dataset, eval_batches, get_dataset, iterate, train_batches
from alexnet_jax.data.sources import DataError

__all__ = ["DataError", "Dataset", "eval_batches", "get_dataset", "iterate", "train_batches"]
