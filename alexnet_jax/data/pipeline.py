"""The input pipeline: Grain over random-access sources (sources.py), decoded on the CPU to the paper's fixed-size
images (decode.py); the device crops, flips and shifts them (device_augment.py) by the draws made here (augment.py).

Grain over `tfds.data_source` rather than tf.data: no TensorFlow install, numpy/PIL code a reader can step through,
and an indexable `MapDataset`: `train_batches(...)[step]` is a pure function of (seed, step), so order is
deterministic and resume exact (a checkpoint saves the next batch's index). docs/data.md has the whole pipeline.
The batch contract (S = dataset.resize, 256 as the paper stored ImageNet; the crop size for the procedural set),
NHWC at this boundary (train.logits_fn transposes to the kernels' CHWN):
  training: 'image' (N, S, S, 3) uint8; 'offset' (N, 2) int32, each crop's (top, left) in [0, S - image_size];
    'flip' (N,) bool; 'shift' (N, 3) float32, the PCA colour shift; 'label' (N,) int32; as (batch, skipped), the
    count of unreadable images passed over staying on the host.
  evaluation: 'image', 'label', 'mask' (N,) bool (False on the last batch's padding and on unreadable rows) and
    'unreadable' (their count, for the host).
The draws come from (seed, step); the host only decodes and sends S×S uint8, or the JPEG bytes where the devices
decode (decode.Decoder.jpeg_batch), or under a cache only the rows it does not hold (cache.py).
"""

import dataclasses
import functools
import os
import sys
from collections.abc import Iterator

import grain
import numpy as np
from absl import flags

from alexnet_jax.data import augment, cache, decode, nvdecode, procedural, rings, sources, store
from alexnet_jax.data.statistics import Statistics, measure
from alexnet_jax.data.workers import exit_with

MIN_SHM_BYTES = 4096  # arrays from worker processes that come through shared memory rather than a pipe
BATCHES_AHEAD = 2  # batches under way at once: each is decoded by the dataset's thread pool, two keep it busy


@dataclasses.dataclass(frozen=True)
class Dataset:
  """Two random-access splits decoded to S×S images, and what the augmentation needs, as their source told it or
  as measured: sizes, statistics."""

  name: str
  classes: tuple[str, ...]  # the class names, by label
  train: decode.Decoder
  eval: decode.Decoder
  image_size: int
  resize: int | None  # the stored images' side S; None: images come at image_size and pass unaugmented
  statistics: Statistics
  pca_sigma: float
  seed: int
  decoder: str = "cpu"  # who decodes training images: the host ('cpu') or the devices ('gpu', nvdecode.py)
  host_share: float = 0.0  # with 'gpu', the share of each batch that the host decodes beside the devices
  flip: bool = True  # training crops mirrored at random (config.dataset.flip)

  @property
  def num_classes(self) -> int:
    return len(self.classes)

  @property
  def num_train(self) -> int:
    return len(self.train)

  @property
  def num_eval(self) -> int:
    return len(self.eval)

  @property
  def size(self) -> int:
    """S, the side of the images that the host sends."""
    return self.train.size

  def draw(self, indices: np.ndarray, rng: np.random.Generator) -> dict:
    """A global batch of training examples `indices` with their augmentation as the paper's recipe draws it: random
    crops and flips, and PCA colour shifts; none for sets that come at image_size (resize None). One draw per batch,
    whatever the number of processes that share it: a process's rows are the same in a run of one process or many."""
    n = len(indices)
    if self.resize is None:
      return dict(index=indices, offset=np.zeros((n, 2), np.int32), flip=np.zeros(n, bool),
                  shift=np.zeros((n, 3), np.float32))
    offset, flip = augment.crop_flip_draws(n, self.size, self.size, self.image_size, rng)
    flip &= self.flip  # drawn either way, so that the crops and colour shifts do not depend on it
    shift = augment.pca_shifts(n, rng, self.statistics.eigval, self.statistics.eigvec, self.pca_sigma)
    return dict(index=indices, offset=offset, flip=flip, shift=shift)

  def train_batch(self, draws: dict) -> tuple[dict, int]:
    """(batch, skipped) of a batch of draws: their images decoded on the host ('cpu'), or left as JPEGs for the
    devices to decode ('gpu': nvdecode.py), in the contract's order of keys."""
    rest = dict(offset=draws["offset"], flip=draws["flip"], shift=draws["shift"])
    if self.decoder == "gpu":
      batch, skipped = self.train.jpeg_batch(draws["index"], host_rows(len(draws["index"]), self.host_share))
      return dict(batch, **rest), skipped
    images, labels, skipped = self.train.batch(draws["index"])
    return dict(image=images, **rest, label=labels), skipped

  def cached_train_batch(self, draws: dict, places: np.ndarray, k: int, block: int) -> tuple[dict, int]:
    """(batch, skipped) of a batch of draws under a cache (cache.py's layout): only the rows `places`
    marks (≥ 0) decoded, each into its block's rows of 'image' (blocks of `block` rows, K = `k` images each)."""
    decode = np.flatnonzero(places >= 0)
    images = rings.empty((len(places) // block * k, self.size, self.size, 3))
    into = decode // block * k + places[decode]
    images[np.setdiff1d(np.arange(len(images)), into)] = 0  # the blocks' padding
    into = [images[r] for r in into]
    _, decoded_labels, skipped = self.train.rows(draws["index"][decode], out=into)
    labels = np.full(len(places), -1, np.int32)
    labels[decode] = decoded_labels
    batch = dict(image=images, decoded=places, index=draws["index"].astype(np.int32), offset=draws["offset"],
                 flip=draws["flip"], shift=draws["shift"], label=labels)
    return batch, int(skipped.sum())

  def eval_batch(self, indices: np.ndarray, size: int, rows: slice = slice(None)) -> dict:
    """Rows `rows` of examples `indices` padded to `size` by repeating the last, the padding masked out, and so is
    a row whose example could not be read (it holds the next readable one, which counts in its own row):
    'unreadable' counts those."""
    padded = np.concatenate([indices, np.repeat(indices[-1:], size - len(indices))])
    images, labels, skipped = self.eval.rows(padded[rows])
    real = (np.arange(size) < len(indices))[rows]
    return dict(image=images, label=labels, mask=real & (skipped == 0), unreadable=np.sum(real & (skipped > 0)))


def train_batches(dataset: Dataset, batch_size: int, process_index: int = 0, process_count: int = 1,
                  rows: slice | None = None, cached: cache.Schedule | None = None):
  """A grain.MapDataset whose element `step` is (batch, skipped): this process's share of the global batch of
  training step `step`, and how many unreadable images its examples passed over.

  Each epoch is a fresh permutation of the training set (seeded by the config's seed and the epoch); the crops,
  flips and colour noise of a global batch are drawn from (seed, step); processes take consecutive slices of
  every global batch: the process_index-th of process_count, or `rows` (the rows its devices hold,
  data.device_batches.BatchLayout.process_rows). Under a cache's schedule `cached`, the rows it holds (in either
  tier) are not decoded (cache.py's batch layout).
  """
  if rows is None:
    if batch_size % process_count:
      raise ValueError(f"batch_size {batch_size} is not divisible by the {process_count} processes")
    share = batch_size // process_count
    rows = slice(process_index * share, (process_index + 1) * share)
  # Endless in practice; a count all the same, as grain's length of an endless dataset in batches of 1 overflows.
  epochs = sys.maxsize // (2 * dataset.num_train)
  draws = grain.MapDataset.range(dataset.num_train).seed(dataset.seed).shuffle().repeat(epochs).batch(batch_size)
  return draws.random_map(dataset.draw).map_with_index(functools.partial(_process_share, dataset, rows, cached))


def _process_share(dataset: Dataset, rows: slice, cached: cache.Schedule | None, step: int,
                   draws: dict) -> tuple[dict, int]:
  share = {k: v[rows] for k, v in draws.items()}
  if cached is None or not cached.slots:
    batch, skipped = dataset.train_batch(share)
    return rings.sent(batch), skipped
  places, k = cache.layout(cached, step, draws["index"], rows)
  batch, skipped = dataset.cached_train_batch(share, places, k, cached.batch_size // cached.blocks)
  if cached.tiered:  # from the global batch: a process's own rows cannot tell what the others send
    batch["sent"] = cache.sent_per_block(cached, step, draws["index"])
  return rings.sent(batch), skipped


def host_rows(n: int, share: float) -> np.ndarray:
  """The rows of an n-image batch that the host decodes when the devices decode the rest: `share` of them, spread
  evenly, so that every device's block gets its part."""
  return np.flatnonzero(np.diff(np.floor(np.arange(n + 1) * share)) > 0).astype(np.int32)


def iterate(batches, start: int, workers: int):
  """batches[start], batches[start + 1], …, built ahead in this process, or in `workers` > 0 worker processes (the
  dataset's threads decode in each). Elements are indexed, so the position to resume from is just `start`, whatever
  the number of threads or workers before and after."""
  if workers and not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()  # Grain's workers read absl flags: outside an absl app, take their defaults
  ds = batches[start:].to_iter_dataset(_ahead())
  if not workers:
    return iter(ds)
  # Arrays of a page or more travel through shared memory, the rest through the worker's pipe: a block per tiny array
  # costs more than a copy, and a worker stopped between making its blocks and handing them over leaves them behind
  # (Grain issue #398). But a batch larger than the pipe holds (64 KiB) must not take it: a worker stopped while
  # writing one waits at its exit for a reader that is gone, until Grain kills it 25 s later, worker after worker.
  ds = grain.experimental.WithOptionsIterDataset(ds, grain.experimental.DatasetOptions(min_shm_size=MIN_SHM_BYTES))
  reader = rings.Reader()
  workers_start = functools.partial(_worker_start, os.getpid(), reader.tag)
  received = iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers), worker_init_fn=workers_start))
  return _Received(received, reader)


def _worker_start(parent: int, rings_tag: str, index: int, count: int) -> None:
  """Grain's worker_init_fn: a worker ends with the process that started it (workers.exit_with) and decodes its
  batches' images into a ring of its own (rings.py)."""
  del index, count
  rings.serve(rings_tag)
  exit_with(parent, before_exit=rings.leave)


class _Received:
  """Grain's iterator over the worker processes, each batch's images opened where they lie in the worker's ring."""

  def __init__(self, iterator, reader: rings.Reader):
    self.iterator, self.reader = iterator, reader

  def __iter__(self):
    return self

  def __next__(self) -> tuple[dict, int]:
    batch, skipped = next(self.iterator)
    return self.reader.received(batch), skipped

  def close(self) -> None:
    getattr(self.iterator, "close", lambda: None)()
    self.reader.close()


def _ahead() -> grain.ReadOptions:
  return grain.ReadOptions(num_threads=BATCHES_AHEAD, prefetch_buffer_size=BATCHES_AHEAD)


def eval_batches(dataset: Dataset, batch_size: int, rows: slice = slice(None)) -> Iterator[dict]:
  """The evaluation split in order, S×S images (the device crops them); the last batch is padded by repeating its
  last example and the padding is masked out. Of each batch, only `rows` (this process's:
  data.device_batches.BatchLayout.process_rows)."""
  batches = grain.MapDataset.range(dataset.num_eval).batch(batch_size)
  batches = batches.map(lambda i: dataset.eval_batch(i, batch_size, rows))
  yield from batches.to_iter_dataset(_ahead())


def _splits(config):
  """(train source, eval source, class names) for config.dataset. A source's examples are {'image', 'label'} or,
  from a store of S×S JPEGs, {'jpeg', 'label'} (decode.py reads both): its `resize` is then the store's S."""
  d = config.dataset
  if d.name == "procedural":
    n_train, n_eval = d.num_train_examples or 50_000, d.num_eval_examples or 10_000
    return (sources.ProceduralSource(config.seed, "train", config.image_size, n_train),
            sources.ProceduralSource(config.seed, "test", config.image_size, n_eval), procedural.CLASS_NAMES)
  if d.name == "folder":
    return sources.image_folders(d.data_dir, d.train_split, d.eval_split, d.resize)
  if d.name == "store":
    train, test = store.open_splits(d.data_dir, d.train_split, d.eval_split)
    if train.resize != d.resize:
      raise sources.DataError(f"the store at {d.data_dir} holds {train.resize}×{train.resize} images: set "
                              f"config.dataset.resize={train.resize}")
    return train, test, train.classes
  (train, test), classes = sources.tfds_sources(d.name, d.data_dir, (d.train_split, d.eval_split), d.resize)
  return train, test, classes


def get_dataset(config, statistics: Statistics | None = None) -> Dataset:
  """The dataset that config.dataset names: 'procedural', 'folder' (an image folder at data_dir), 'store' (the
  S×S JPEG store that `make prepare … --store` wrote at data_dir) or any tfds image-classification dataset, with
  `statistics` where they are known (a run's, from its workdir) rather than measured. Raises sources.DataError with
  a one-line remedy if it cannot be read."""
  return make_dataset(config, *_splits(config), statistics=statistics)


def make_dataset(config, train, test, classes: tuple[str, ...], statistics: Statistics | None = None) -> Dataset:
  """The Dataset over two random-access sources (train and evaluation split) as config.dataset sets it up: capped
  in length, decoded to S×S by config.dataset.threads threads, statistics measured unless the source (or the
  caller) knows them."""
  d = config.dataset
  if len(classes) < 2:  # every label the same: top-1 would reach 1.0 and mean nothing
    raise sources.DataError(f"{d.name!r} at {d.data_dir or 'its default place'} has {len(classes)} class "
                            f"({', '.join(classes) or 'none'}): a classifier needs ≥ 2")
  if d.num_classes and d.num_classes != len(classes):
    raise sources.DataError(f"config.dataset.num_classes={d.num_classes} but {d.name!r} has {len(classes)} classes; "
                            f"set it to {len(classes)}, or 0 to take it from the data")
  if train.resize is not None and train.resize < config.image_size:
    raise sources.DataError(f"config.dataset.resize={train.resize} must be ≥ config.image_size={config.image_size} "
                            "(images are resized, then cropped)")
  resize, known = train.resize, statistics or train.statistics
  size = resize or config.image_size
  decoder = _decoder(d.decoder)
  train, test = (decode.Decoder(_first(s, n), size, d.fast_decode, d.threads, len(classes))
                 for s, n in ((train, d.num_train_examples), (test, d.num_eval_examples)))
  stats = measure(train, seed=config.seed) if known is None else known
  return Dataset(d.name, tuple(classes), train, test, config.image_size, resize, stats, d.pca_sigma, config.seed,
                 decoder, d.host_share, d.flip)


def _decoder(choice: str) -> str:
  """config.dataset.decoder with 'auto' resolved to 'cpu': the devices' nvImageCodec fed training no faster than the
  host's libjpeg-turbo within the runs' spread (scripts/dev/bench_end_to_end.py; docs/BENCHMARKS.md), and a GPU that
  trains decodes little beside it, so the host, which every machine has, decodes."""
  if choice == "auto":
    return "cpu"
  if choice == "gpu":
    nvdecode.require()
  return choice


class _First:
  """The first n examples of a source."""

  def __init__(self, source, n):
    self.source, self.n = source, n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    return self.source[i]

  def where(self, i: int) -> str:
    return sources.where(self.source, i)


def _first(source, n: int):
  return _First(source, n) if 0 < n < len(source) else source
