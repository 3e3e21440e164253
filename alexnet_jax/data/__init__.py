"""Datasets: the built-in procedural one (no network, no download) and the pipeline that batches them."""

from alexnet_jax.data.pipeline import DATASETS, Dataset, get_dataset

__all__ = ["DATASETS", "Dataset", "get_dataset"]
