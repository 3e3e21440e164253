"""Datasets (tfds, image folders, stores of fixed-size JPEGs, the built-in procedural set) and the Grain pipeline that
decodes them to fixed-size batches and draws their augmentation; device_augment.py applies it on the device."""

from alexnet_jax.data.pipeline import Dataset, eval_batches, get_dataset, iterate, train_batches
from alexnet_jax.data.sources import DataError

__all__ = ["DataError", "Dataset", "eval_batches", "get_dataset", "iterate", "train_batches"]
