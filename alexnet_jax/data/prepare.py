"""Writing the paper's store (store.py) from a tfds dataset or an image folder, for scripts/prepare_data.py.

Krizhevsky et al. rescaled each image to a shorter side of 256 and kept its central 256×256 patch. Here each image is
read by its source class (sources.py: folders decode with PIL, JPEGs in draft mode at the smallest power-of-two
reduction that keeps the shorter side ≥ size; grey, CMYK, RGBA and 16-bit images become 8-bit RGB), resized to a
shorter side of `size` with augment.resize_shorter (PIL bilinear, which filters over the whole footprint when it
shrinks), centre-cropped to size×size and encoded by PIL as a JPEG of `quality` with fixed settings (JPEG_OPTIONS),
so the same input gives the same bytes. Images that cannot be decoded are left out and listed in the manifest.

Worker processes write whole shards, each from its own range of source indices, so the files do not depend on how
many there are; a rerun keeps the complete shards of an interrupted one (those whose bytes match their part's
digest) and writes the rest. Every file goes inside the store: a split's name must be a plain file name.
"""

import concurrent.futures
import hashlib
import io
import json
import multiprocessing
import os

import numpy as np
from PIL import Image
from tqdm import tqdm

from alexnet_jax.data import augment, sources, store
from alexnet_jax.data.sources import UNREADABLE, DataError
from alexnet_jax.data.workers import exit_with

JPEG_OPTIONS = dict(subsampling="4:2:0", progressive=False, optimize=True)  # baseline, optimised Huffman tables
RESIZE = ("PIL bilinear to the shorter side (augment.resize_shorter), then the central square; a folder's JPEGs "
          "are decoded in PIL's draft mode at the smallest power-of-two reduction that keeps the shorter side ≥ size")
SHARD_SIZE = 1024
SPAWN = multiprocessing.get_context("spawn")  # not fork: a caller that imported JAX has threads a fork would copy


def square_jpeg(image: np.ndarray, size: int, quality: int) -> bytes:
  """The central size×size patch of (H, W, 3) uint8 resized to shorter side `size`, as JPEG bytes."""
  square = augment.center_crop(augment.resize_shorter(image, size), size)
  buffer = io.BytesIO()
  Image.fromarray(np.ascontiguousarray(square)).save(buffer, "JPEG", quality=quality, **JPEG_OPTIONS)
  return buffer.getvalue()


def folder_sources(root: str, splits: list[str], size: int) -> tuple[dict, list[str], dict]:
  """({split: source}, class names, source description) of root/<split>/<class>/<image>. Classes are those of the
  first split; by default the splits are train and every other directory of root."""
  check_split_names(splits)
  if not os.path.isdir(root):
    raise DataError(f"no image folder at {root}")
  dirs = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
  splits = splits or ["train"] + [d for d in dirs if d != "train"]
  classes = sources.folder_classes(root, splits[0])
  return ({split: sources.ImageFolder(root, split, classes, size) for split in splits}, list(classes),
          dict(folder=os.path.abspath(root)))


def tfds_sources(name: str, data_dir: str, splits: list[str], size: int) -> tuple[dict, list[str], dict]:
  """As folder_sources, for a tfds dataset prepared as array_record in data_dir. By default the splits are train
  and validation, or test where the dataset has no validation split."""
  import tensorflow_datasets as tfds  # noqa: PLC0415  (slow import, only for tfds datasets)

  check_split_names(splits)
  sources.tfds_sources(name, data_dir, (), size)  # DataError unless name is a tfds image classification dataset
  info = tfds.builder(name, data_dir=data_dir or None, file_format="array_record").info
  splits = splits or ["train", "validation" if "validation" in info.splits else "test"]
  found, _ = sources.tfds_sources(name, data_dir, tuple(splits), size)
  return dict(zip(splits, found)), list(info.features["label"].names), dict(tfds=name, version=str(info.version))


def check_split_names(splits) -> None:
  """DataError unless every split name is a plain file name: the store names its files after its splits, and a name
  such as '../outside' would put them outside it."""
  for split in splits:
    if not isinstance(split, str) or split in ("", ".", "..") or "/" in split or "\0" in split:
      raise DataError(f"split name {split!r} is not a plain file name (one without '/', not empty, '.' or '..'): "
                      "the store names its files after its splits")


def store_settings(source: dict, classes: list[str], size: int, quality: int, shard_size: int = SHARD_SIZE) -> dict:
  """Everything that the store's bytes depend on besides the images: the manifest's keys but 'splits'."""
  if not 8 <= size <= 4096 or not 1 <= quality <= 100 or shard_size < 1:
    raise DataError(f"size must be in 8..4096, quality in 1..100 and shard_size ≥ 1, got size {size}, quality "
                    f"{quality}, shard_size {shard_size}")
  settings = dict(format=store.FORMAT, version=store.VERSION, source=source, size=size, quality=quality,
                  jpeg=JPEG_OPTIONS, resize=RESIZE, shard_size=shard_size, classes=classes,
                  num_classes=len(classes))
  return json.loads(json.dumps(settings))  # as a manifest reads back


def write_store(root: str, splits: dict, settings: dict, workers: int = 0) -> tuple[dict, int]:
  """Writes, or completes, the store of {split: source} at root with `workers` processes (0: one per core, 1: in
  this process); (its manifest, the number of images written by this call)."""
  check_split_names(splits)
  fingerprint = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
  previous = _previous_splits(root, settings)
  _remove_temporaries(root)
  shards = {split: _shard_count(split, source, settings["shard_size"]) for split, source in splits.items()}
  todo = [(split, k, m) for split, m in shards.items() for k in range(m)
          if not _complete(root, split, k, m, fingerprint)]
  _run(todo, (root, splits, settings, fingerprint), workers)
  manifest = settings | dict(splits=previous | {split: _summary(root, split, m) for split, m in shards.items()})
  store.write_json(os.path.join(root, store.MANIFEST), manifest)
  return manifest, sum(store.read_json(store.part_path(root, *job))["count"] for job in todo)


def _shard_count(split: str, source, shard_size: int) -> int:
  if not len(source):
    raise DataError(f"split {split!r} has no images")
  return -(-len(source) // shard_size)


def _previous_splits(root: str, settings: dict) -> dict:
  """The splits of a finished store at root written with the same settings; DataError if its settings differ."""
  path = os.path.join(root, store.MANIFEST)
  if not os.path.isfile(path):
    return {}
  old = store.read_json(path)
  changed = [_change(k, old.get(k), settings[k]) for k in settings if old.get(k) != settings[k]]
  if changed:
    raise DataError(f"{root} holds a store written with other settings ({'; '.join(changed)}); choose another "
                    f"--store or delete that one")
  return old["splits"]


def _change(key: str, old, new) -> str:
  """A setting that differs, with its two values where they are short: a moved image folder reads as one."""
  said = f"{key} {json.dumps(old)} → {json.dumps(new)}"
  return said if len(said) <= 200 else key


def _remove_temporaries(root: str) -> None:
  """The files that an interrupted run was writing: what it finished has its final name."""
  for folder in (root, os.path.join(root, "parts")):
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
      if name.endswith(".tmp"):
        os.remove(os.path.join(folder, name))


def _complete(root: str, split: str, k: int, shards: int, fingerprint: str) -> bool:
  path = store.part_path(root, split, k, shards)
  if not os.path.isfile(path):
    return False
  part = store.read_json(path)
  if part["settings"] != fingerprint:
    raise DataError(f"{root} holds shards written with other settings ({os.path.basename(path)}); choose another "
                    f"--store or delete that one")
  shard = os.path.join(root, store.shard_name(split, k, shards))
  if store.count_records(shard) != part["count"]:
    return False
  # A shard copied in from another store can hold as many records: its bytes must be those written (parts written
  # before digests have none, and are trusted as before).
  return "digest" not in part or store.shard_digest(shard) == part["digest"]


def _run(todo: list[tuple], job: tuple, workers: int) -> None:
  workers = min(workers or os.cpu_count(), len(todo))
  progress = tqdm(total=len(todo), desc="shards", unit="shard", disable=None)
  if workers <= 1:
    _start(*job)
    for shard in todo:
      _write_shard(*shard)
      progress.update()
    return
  with concurrent.futures.ProcessPoolExecutor(workers, SPAWN, _start_worker, (os.getpid(), *job)) as pool:
    for done in concurrent.futures.as_completed([pool.submit(_write_shard, *shard) for shard in todo]):
      done.result()
      progress.update()


_JOB = {}  # what every shard of the running write_store needs, set once per worker process


def _start(root: str, splits: dict, settings: dict, fingerprint: str) -> None:
  _JOB.update(root=root, splits=splits, settings=settings, fingerprint=fingerprint)


def _start_worker(parent: int, *job) -> None:
  exit_with(parent)
  _start(*job)


def _write_shard(split: str, k: int, shards: int) -> None:
  """Shard k of `split`: its readable images among source indices [k·S, (k + 1)·S), then its part file."""
  root, source, settings = _JOB["root"], _JOB["splits"][split], _JOB["settings"]
  size = settings["shard_size"]
  records, left_out = [], []
  for i in range(k * size, min(len(source), (k + 1) * size)):
    try:
      example = source[i]
    except UNREADABLE as e:
      left_out.append(dict(index=i, error=str(e)))
      continue
    jpeg = square_jpeg(example["image"], settings["size"], settings["quality"])
    records.append(store.encode_record(example["label"], jpeg))
  os.makedirs(root, exist_ok=True)
  digest = store.write_shard(os.path.join(root, store.shard_name(split, k, shards)), records)
  part = dict(settings=_JOB["fingerprint"], count=len(records), digest=digest, left_out=left_out)
  store.write_json(store.part_path(root, split, k, shards), part)


def _summary(root: str, split: str, shards: int) -> dict:
  parts = [store.read_json(store.part_path(root, split, k, shards)) for k in range(shards)]
  paths = [os.path.join(root, store.shard_name(split, k, shards)) for k in range(shards)]
  return dict(count=sum(p["count"] for p in parts), shards=shards, bytes=sum(map(os.path.getsize, paths)),
              digests=[store.shard_digest(path) for path in paths], left_out=[e for p in parts for e in p["left_out"]])
