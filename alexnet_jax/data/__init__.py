"""Datasets (tfds, image folders, stores of fixed-size JPEGs, the built-in procedural set) and the Grain pipeline that
decodes them to fixed-size batches and draws their augmentation; device_augment.py applies it on the device.

The pipeline's names are imported on first use: a module that needs only `statistics` or `sources` (a run's
run.json, a script refusing its arguments) loads neither Grain nor JAX."""

import importlib

_HOMES = {"Dataset": "pipeline", "eval_batches": "pipeline", "get_dataset": "pipeline", "iterate": "pipeline",
          "train_batches": "pipeline", "DataError": "sources", "input_feed": "input"}
__all__ = sorted(_HOMES)


def __getattr__(name):
  if name in _HOMES:
    return getattr(importlib.import_module(f"alexnet_jax.data.{_HOMES[name]}"), name)
  raise AttributeError(f"module 'alexnet_jax.data' has no attribute {name!r}")


def __dir__():
  return sorted((*globals(), *_HOMES))
