"""The input pipeline: Grain over random-access sources (sources.py), with the paper's augmentation (augment.py).

Why Grain over `tfds.data_source` rather than tf.data: it needs no TensorFlow (a 600 MB install that pins its own
numpy and protobuf beside jax), every transformation is numpy/PIL code that a reader can step through, and its
`MapDataset` is indexable — `train_batches(...)[step]` is the batch of training step `step`, a pure function of
(seed, step) however many threads or processes compute it. That makes order deterministic and resume exact: the
iterator's state, saved with each checkpoint, is the index of the next batch.

A batch is a dict of numpy arrays: 'image' (N, H, W, 3) uint8 crops ((N, 10, H, W, 3) for 10-crop evaluation);
'shift' (N, 3) float32, each image's PCA colour shift in [0, 1] units (zero for evaluation); 'label' (N,) int32;
'skipped' (N,) int32, unreadable images passed over; evaluation batches add 'mask' (N,) bool, False on the padding
that fills the last batch. The device adds the shift and normalises with the dataset's mean and std
(train.model_input): a uint8 batch is a quarter of the bytes to send, and the host's cores are left to decode.
Images are NHWC at this boundary, the convention every image source uses; the model turns them into CHWN.
"""

import dataclasses
from collections.abc import Iterator

import grain
from absl import flags
import numpy as np

from alexnet_jax.data import augment, procedural, sources

# Pixel statistics of ImageNet's training set ([0, 1] units), the values used since the torchvision models.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
STATS_EXAMPLES = 1000  # how many training images estimate mean, std and PCA basis for other datasets


@dataclasses.dataclass(frozen=True)
class Dataset:
  """Two random-access splits and what the transforms need: sizes, statistics, augmentation."""

  name: str
  num_classes: int
  train: sources.SkipUnreadable
  eval: sources.SkipUnreadable
  image_size: int
  resize: int  # shorter side before cropping; 0: images come at image_size (the procedural set)
  mean: np.ndarray
  std: np.ndarray
  eigval: np.ndarray
  eigvec: np.ndarray
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
    normalisation). Sets that come at image_size (resize 0, the procedural set) pass unchanged."""
    image, shift = example["image"], np.zeros(3, np.float32)
    if self.resize:
      image = augment.random_crop_flip(augment.resize_shorter(image, self.resize), self.image_size, rng)
      shift = augment.pca_shift(rng, self.eigval, self.eigvec, self.pca_sigma)
    return dict(image=np.ascontiguousarray(image), shift=shift, label=np.int32(example["label"]),
                skipped=np.int32(example["skipped"]))

  def eval_example(self, example: dict, crops: int) -> dict:
    image = augment.resize_shorter(example["image"], self.resize) if self.resize else example["image"]
    image = augment.center_crop(image, self.image_size) if crops == 1 else augment.ten_crops(image, self.image_size)
    return dict(image=np.ascontiguousarray(image), shift=np.zeros(3, np.float32), label=np.int32(example["label"]),
                skipped=np.int32(example["skipped"]))


def train_batches(dataset: Dataset, batch_size: int, process_index: int = 0, process_count: int = 1):
  """A grain.MapDataset whose element `step` is this process's share of the global batch of training step `step`.

  Each epoch is a fresh permutation of the training set (seeded by the config's seed and the epoch), and each
  example's crop, flip and colour noise are drawn from its position in the endless stream; processes take
  consecutive slices of every global batch.
  """
  if batch_size % process_count:
    raise ValueError(f"batch_size {batch_size} is not divisible by the {process_count} processes")
  examples = (grain.MapDataset.source(dataset.train).seed(dataset.seed).shuffle().repeat()
              .random_map(dataset.train_example))
  return examples.batch(batch_size // process_count)[process_index::process_count]


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


def image_statistics(source, n: int = STATS_EXAMPLES, seed: int = 0):
  """(mean, std, PCA eigenvalues, eigenvectors) of the RGB pixels of n training images in [0, 1], picked by a
  seeded permutation: the same on every run, so a resumed run normalises exactly as before."""
  picks = np.random.default_rng(seed).permutation(len(source))[:n]
  pixels = np.concatenate([_pixels(source[int(i)]["image"]) for i in picks])
  eigval, eigvec = augment.pca_basis(pixels)
  return pixels.mean(0).astype(np.float32), pixels.std(0).astype(np.float32), eigval, eigvec


def _pixels(image: np.ndarray, most: int = 4096) -> np.ndarray:
  """At most `most` evenly spaced pixels of one uint8 image, (P, 3) float64 in [0, 1]."""
  flat = image.reshape(-1, 3)
  return flat[:: max(1, len(flat) // most)].astype(np.float64) / 255


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
  (train, test), num_classes = sources.tfds_sources(d.name, d.data_dir, (d.train_split, d.eval_split))
  return train, test, num_classes


def get_dataset(config) -> Dataset:
  """The dataset that config.dataset names: 'procedural', 'folder' (an image folder at data_dir) or any tfds
  image-classification dataset. Raises sources.DataError with a one-line remedy if it cannot be read."""
  d = config.dataset
  train, test, num_classes = _splits(config)
  if d.num_classes and d.num_classes != num_classes:
    raise sources.DataError(f"config.dataset.num_classes={d.num_classes} but {d.name!r} has {num_classes} classes; "
                            f"set it to {num_classes}, or 0 to take it from the data")
  train, test = (_first(s, n) for s, n in ((train, d.num_train_examples), (test, d.num_eval_examples)))
  train, test = sources.SkipUnreadable(train), sources.SkipUnreadable(test)
  if d.name == "imagenet2012":
    stats = IMAGENET_MEAN, IMAGENET_STD, augment.IMAGENET_EIGVAL, augment.IMAGENET_EIGVEC
  else:
    stats = image_statistics(train, seed=config.seed)
  resize = 0 if d.name == "procedural" else d.resize
  return Dataset(d.name, num_classes, train, test, config.image_size, resize, *stats, d.pca_sigma, config.seed)


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
