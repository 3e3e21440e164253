"""The input pipeline: Grain over random-access sources (sources.py), with the paper's augmentation (augment.py).

Why Grain over `tfds.data_source` rather than tf.data: it needs no TensorFlow (a 600 MB install that pins its own
numpy and protobuf beside jax), every transformation is numpy/PIL code that a reader can step through, and its
`MapDataset` is indexable — `train_batches(...)[step]` is the batch of training step `step`, a pure function of
(seed, step) however many threads or processes compute it. That makes order deterministic and resume exact: the
iterator's state, saved with each checkpoint, is the index of the next batch.

A batch is a dict of numpy arrays, all of which go to the device: 'image' (N, H, W, 3) uint8 crops ((N, 10, H, W, 3)
for 10-crop evaluation); 'shift' (N, 3) float32, each image's PCA colour shift in [0, 1] units (zero for
evaluation); 'label' (N,) int32; evaluation batches add 'mask' (N,) bool, False on the padding that fills the last
batch. Training batches come as (batch, skipped): the number of unreadable images passed over is for the host's
metrics and stays off the device. The device adds the shift and normalises with the dataset's mean and std
(train.model_input): a uint8 batch is a quarter of the bytes to send, and the host's cores are left to decode.
Images are NHWC at this boundary, the convention every image source uses; train.logits_fn transposes them to CHWN,
the layout of the kernels.
"""

import dataclasses
from collections.abc import Iterator

import grain
from absl import flags
import numpy as np

from alexnet_jax.data import augment, procedural, sources
from alexnet_jax.data.statistics import Statistics, measure


@dataclasses.dataclass(frozen=True)
class Dataset:
  """Two random-access splits and what the transforms need, as their source told it or as measured: sizes,
  statistics, augmentation."""

  name: str
  num_classes: int
  train: sources.SkipUnreadable
  eval: sources.SkipUnreadable
  image_size: int
  resize: int | None  # shorter side before cropping; None: images come at image_size and pass unaugmented
  statistics: Statistics
  pca_sigma: float
  seed: int

  @property
  def num_train(self) -> int:
    return len(self.train)

  @property
  def num_eval(self) -> int:
    return len(self.eval)

  def train_example(self, example: dict, rng: np.random.Generator) -> dict:
    """The paper's recipe: resize, random crop and flip, and a PCA colour shift (which the device adds, with the
    normalisation). Sets that come at image_size (resize None) pass unchanged."""
    image, shift = example["image"], np.zeros(3, np.float32)
    if self.resize is not None:
      image = augment.random_crop_flip(augment.resize_shorter(image, self.resize), self.image_size, rng)
      shift = augment.pca_shift(rng, self.statistics.eigval, self.statistics.eigvec, self.pca_sigma)
    return dict(image=np.ascontiguousarray(image), shift=shift, label=np.int32(example["label"]),
                skipped=np.int32(example["skipped"]))

  def eval_example(self, example: dict, crops: int) -> dict:
    image = example["image"] if self.resize is None else augment.resize_shorter(example["image"], self.resize)
    image = augment.center_crop(image, self.image_size) if crops == 1 else augment.ten_crops(image, self.image_size)
    return dict(image=np.ascontiguousarray(image), shift=np.zeros(3, np.float32), label=np.int32(example["label"]))


def train_batches(dataset: Dataset, batch_size: int, process_index: int = 0, process_count: int = 1):
  """A grain.MapDataset whose element `step` is (batch, skipped): this process's share of the global batch of
  training step `step`, and how many unreadable images its examples passed over.

  Each epoch is a fresh permutation of the training set (seeded by the config's seed and the epoch), and each
  example's crop, flip and colour noise are drawn from its position in the endless stream; processes take
  consecutive slices of every global batch.
  """
  if batch_size % process_count:
    raise ValueError(f"batch_size {batch_size} is not divisible by the {process_count} processes")
  examples = (grain.MapDataset.source(dataset.train).seed(dataset.seed).shuffle().repeat()
              .random_map(dataset.train_example))
  return examples.batch(batch_size // process_count)[process_index::process_count].map(_split_skipped)


def _split_skipped(batch: dict) -> tuple[dict, int]:
  skipped = batch.pop("skipped")
  return batch, int(skipped.sum())


def iterate(batches, start: int, threads: int, workers: int):
  """batches[start], batches[start + 1], …: `threads` compute batches ahead in this process, and `workers` > 0
  adds that many worker processes. Elements are indexed, so the position to resume from is just `start`, whatever
  the number of threads or workers before and after."""
  if workers and not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()  # Grain's workers read absl flags: outside an absl app, take their defaults
  ds = batches[start:].to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads))
  return iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers)) if workers else ds)


def eval_batches(dataset: Dataset, batch_size: int, crops: int = 1, threads: int = 8) -> Iterator[dict]:
  """The evaluation split in order, centre crops (crops=1) or the paper's 10 crops; the last batch is padded by
  repeating its last example and the padding is masked out."""
  if crops not in (1, 10):
    raise ValueError(f"crops must be 1 (centre) or 10 (corners, centre and mirrors), got {crops}")
  examples = grain.MapDataset.source(dataset.eval).map(lambda ex: dataset.eval_example(ex, crops))
  batches = examples.batch(batch_size, batch_fn=lambda xs: _stack_padded(xs, batch_size))
  yield from batches.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads))


def _stack_padded(examples: list[dict], size: int) -> dict:
  padded = examples + [examples[-1]] * (size - len(examples))
  batch = {k: np.stack([ex[k] for ex in padded]) for k in examples[0]}
  return batch | dict(mask=np.arange(size) < len(examples))


def _splits(config):
  """(train source, eval source, number of classes) for config.dataset, unwrapped."""
  d = config.dataset
  if d.name == "procedural":
    n_train, n_eval = d.num_train_examples or 50_000, d.num_eval_examples or 10_000
    return (sources.ProceduralSource(config.seed, "train", config.image_size, n_train),
            sources.ProceduralSource(config.seed, "test", config.image_size, n_eval), procedural.NUM_CLASSES)
  if d.name == "folder":
    classes = sources.folder_classes(d.data_dir, d.train_split)
    return (sources.ImageFolder(d.data_dir, d.train_split, classes, d.resize),
            sources.ImageFolder(d.data_dir, d.eval_split, classes, d.resize), len(classes))
  (train, test), num_classes = sources.tfds_sources(d.name, d.data_dir, (d.train_split, d.eval_split), d.resize)
  return train, test, num_classes


def get_dataset(config) -> Dataset:
  """The dataset that config.dataset names: 'procedural', 'folder' (an image folder at data_dir) or any tfds
  image-classification dataset. Raises sources.DataError with a one-line remedy if it cannot be read."""
  d = config.dataset
  train, test, num_classes = _splits(config)
  if d.num_classes and d.num_classes != num_classes:
    raise sources.DataError(f"config.dataset.num_classes={d.num_classes} but {d.name!r} has {num_classes} classes; "
                            f"set it to {num_classes}, or 0 to take it from the data")
  if train.resize is not None and train.resize < config.image_size:
    raise sources.DataError(f"config.dataset.resize={train.resize} must be ≥ config.image_size={config.image_size} "
                            "(images are resized, then cropped)")
  resize, known = train.resize, train.statistics
  train, test = (_first(s, n) for s, n in ((train, d.num_train_examples), (test, d.num_eval_examples)))
  train, test = sources.SkipUnreadable(train), sources.SkipUnreadable(test)
  stats = measure(train, seed=config.seed) if known is None else known
  return Dataset(d.name, num_classes, train, test, config.image_size, resize, stats, d.pca_sigma, config.seed)


class _First:
  """The first n examples of a source."""

  def __init__(self, source, n):
    self.source, self.n = source, n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    return self.source[i]


def _first(source, n: int):
  return _First(source, n) if 0 < n < len(source) else source
