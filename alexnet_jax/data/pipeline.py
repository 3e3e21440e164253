"""Batches for training and evaluation: deterministic by step, prefetched on a host thread.

A batch is a dict of numpy arrays: 'image' (N, H, W, 3) float32, normalised; 'label' (N,) int32; evaluation batches
add 'mask' (N,) bool, False on the padding that fills the last batch. Images are NHWC at this boundary, the
convention every image source uses; the model turns them into CHWN on the device.
"""

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

from alexnet_jax.data import procedural


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A source of examples by index: `read(split, indices)` → (images NHWC float32 in [0, 1], labels)."""

  name: str
  num_classes: int
  num_train: int
  num_eval: int
  read: Callable[[str, np.ndarray], tuple[np.ndarray, np.ndarray]]
  mean: np.ndarray
  std: np.ndarray

  def _batch(self, split, indices, n_valid=None):
    images, labels = self.read(split, indices)
    batch = dict(image=(images - self.mean) / self.std, label=labels.astype(np.int32))
    if n_valid is not None:
      batch["mask"] = np.arange(len(labels)) < n_valid
    return batch

  def train_batch(self, step: int, batch_size: int) -> dict:
    """The batch of training step `step`: examples step·B … step·B + B − 1, wrapping around the training set,
    so a run resumed at any step reads exactly what an uninterrupted run reads."""
    return self._batch("train", (step * batch_size + np.arange(batch_size)) % self.num_train)

  def eval_batches(self, batch_size: int) -> Iterator[dict]:
    for start in range(0, self.num_eval, batch_size):
      n = min(batch_size, self.num_eval - start)
      # Padding repeats the last example and is masked out of every metric.
      yield self._batch("test", np.minimum(start + np.arange(batch_size), self.num_eval - 1), n)


def prefetch(make: Callable[[int], dict], start: int, stop: int, depth: int = 2) -> Iterator[dict]:
  """make(start), make(start + 1), … make(stop − 1), each computed on a worker thread ahead of its use."""
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    pending = [pool.submit(make, i) for i in range(start, min(start + depth, stop))]
    for i in range(start, stop):
      batch = pending.pop(0).result()
      if i + depth < stop:
        pending.append(pool.submit(make, i + depth))
      yield batch


def _procedural(config) -> Dataset:
  if config.dataset.num_classes != procedural.NUM_CLASSES:
    raise ValueError(f"the procedural dataset has {procedural.NUM_CLASSES} classes; set "
                     f"config.dataset.num_classes={procedural.NUM_CLASSES}")

  def read(split, indices):
    # Indices are runs of consecutive examples (one run, two where a batch wraps): read each run at once.
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    parts = [procedural.generate(config.seed, split, int(run[0]), len(run), config.image_size)
             for run in np.split(indices, breaks)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

  return Dataset("procedural", procedural.NUM_CLASSES, config.dataset.num_train_examples,
                 config.dataset.num_eval_examples, read, procedural.MEAN, procedural.STD)


DATASETS = {"procedural": _procedural}


def get_dataset(config) -> Dataset:
  if config.dataset.name not in DATASETS:
    raise ValueError(f"unknown dataset {config.dataset.name!r}; choose one of {', '.join(sorted(DATASETS))}")
  return DATASETS[config.dataset.name](config)
