"""The package from Python: configs by name, training, and a trained run you can classify images with.

  import alexnet_jax
  config = alexnet_jax.get_config("demo")           # configs/demo.py
  alexnet_jax.train(config, "runs/demo")            # as scripts/train.py does
  model = alexnet_jax.load("runs/demo")             # the run's newest checkpoint, on one device
  model.predict(images)                             # (N, classes) probabilities, a row per image (model.classes)
  model.top(images, k=5)                            # [[(class, probability), …] per image]
  model.evaluate(crops=10)                          # top-1, top-5 and loss on the run's evaluation split

`load` needs nothing but the run's directory. `images` is an image file or folder, a PIL image, a uint8 or uint16
array of one image or an NHWC batch, or a list or iterator of these (docs/python.md has the rules). Every image goes
the way training stored its images (upright, shorter side resized to S, the central S×S), then is cropped on the
device, so a file, its PIL image and its pixels score the same. An unreadable file alone raises a ValueError; in a
folder or a list it is skipped with a warning and keeps its place (`predict` gives it a row of NaN, `top` None).
"""

import collections.abc
import functools
import importlib
import importlib.resources
import itertools
import numbers
import os
import warnings

import jax
import ml_collections
import numpy as np
from PIL import Image

from alexnet_jax.config import apply_process_settings
from alexnet_jax.data import augment, get_dataset, sources
from alexnet_jax.training import evaluation, loop, restore, run
from alexnet_jax.training.train import CROPS, class_log_probs, eval_step

IMAGE_SUFFIXES = sources.IMAGE_SUFFIXES
CHANNELS = (1, 3, 4)  # the last axis of an image array: grey, RGB, RGBA
PACKAGE = os.path.dirname(os.path.abspath(__file__))  # warnings name the caller's line, not one in here


def config_names() -> tuple[str, ...]:
  files = importlib.resources.files("alexnet_jax.configs").iterdir()
  return tuple(sorted(f.name[:-3] for f in files if f.name.endswith(".py") and not f.name.startswith("_")))


def get_config(name: str) -> ml_collections.ConfigDict:
  """The config of configs/<name>.py (e.g. 'demo', 'alexnet_2gpu'; installed as alexnet_jax.configs), as
  --config configs/<name>.py gives it."""
  if name not in config_names():
    raise ValueError(f"no config {name!r}; the configs are {', '.join(config_names())}")
  return importlib.import_module(f"alexnet_jax.configs.{name}").get_config()


def train(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains `config` in `workdir` (resuming what is there), as scripts/train.py; returns the final eval metrics.
  config.cpu_devices (the simulated CPU devices) takes effect only before JAX's first computation in the process:
  after it, the devices JAX made are used."""
  try:
    apply_process_settings(config)
  except RuntimeError:  # JAX has computed already: its devices stay
    pass
  return loop.train_and_evaluate(config, workdir)


def load(workdir: str, **overrides) -> "Model":
  """The newest checkpoint of the run in `workdir`, on one device; `overrides` set keys of its config (e.g.
  kernel_backend='xla', eval_batch_size=64; 'dataset.data_dir' as dataset={'data_dir': …})."""
  return Model(workdir, overrides)


def stored(images, size: int) -> np.ndarray:
  """The readable images of `images` (the module's rule) as training stored them: (N, size, size, 3) uint8, each
  at shorter side `size`, its central size×size; a file that cannot be read is left out, with a warning."""
  results = list(read(images, size))
  _warn([why for _, why in results])
  kept = [image for image, why in results if why is None]
  return np.stack(kept) if kept else np.zeros((0, size, size, 3), np.uint8)


def read(images, size: int):
  """(stored image (size, size, 3), None), or (None, (file, why)) for a file that cannot be read, per image of
  `images` in order, read one at a time; a ValueError for a file that is `images` alone."""
  alone = isinstance(images, str | os.PathLike) and not os.path.isdir(images)
  for image in images_of(images):
    try:
      yield augment.resize_center_crop(_pixels(image), size), None
    except sources.UNREADABLE as e:
      if not isinstance(image, str):  # an object in memory: the caller's to fix, not a file to pass over
        raise
      if alone:
        raise ValueError(f"cannot read {image}: {_why(e)}") from None
      yield None, (image, _why(e))


def images_of(images) -> list:
  """The images that `images` holds (the module's rule), in order: file paths, PIL images and checked arrays, still
  to be read; a ValueError or TypeError for what is none of them."""
  if isinstance(images, str | os.PathLike):
    return _files(os.fspath(images))
  if isinstance(images, Image.Image):
    return [images]
  if isinstance(images, list | tuple | collections.abc.Iterator):
    return [image for i, item in enumerate(images) for image in _item(i, item)]
  if hasattr(images, "__array__") or hasattr(images, "__array_interface__"):
    return _arrays(np.asarray(images))
  raise TypeError(f"{type(images).__name__}: images are paths (files, folders), PIL images or arrays, or a list "
                  "of them")


def image_files(folder: str) -> list[str]:
  """The image files (IMAGE_SUFFIXES) in `folder` and its subfolders, sorted by path, folder by folder ('a/x.jpg'
  before 'a-b/y.jpg'): the order of the results for a folder, the API's and scripts/predict.py's."""
  found = [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names
           if name.lower().endswith(IMAGE_SUFFIXES) and os.path.isfile(os.path.join(root, name))]
  return sorted(found, key=lambda path: os.path.relpath(path, folder).split(os.sep))


def _item(i: int, item) -> list:
  try:
    return images_of(item)
  except (TypeError, ValueError) as e:
    raise type(e)(f"item {i}: {e}") from None


def _files(path: str) -> list[str]:
  if os.path.isdir(path):
    found = image_files(path)
    if not found:
      raise ValueError(f"{path}: no images ({', '.join(IMAGE_SUFFIXES)}) in the folder or its subfolders")
    return found
  if os.path.isfile(path):
    return [path]
  raise ValueError(f"{path}: {'not a file or a folder' if os.path.exists(path) else 'no such file or folder'}")


def _arrays(array: np.ndarray) -> list[np.ndarray]:
  """The images of an array: (H, W) and (H, W, C) one, (N, H, W, C) N."""
  channels_last = array.ndim in (3, 4) and array.shape[-1] in CHANNELS and not _channels_first(array.shape)
  one = array.ndim == 2 or (array.ndim == 3 and channels_last)
  if not one and not (array.ndim == 4 and channels_last):
    raise ValueError(_not_images(array.shape))
  if array.dtype not in (np.uint8, np.uint16):
    raise ValueError(f"{array.dtype} pixels: images are uint8 (or uint16) arrays; floats in [0, 1] as "
                     "(x * 255).round().astype(np.uint8)")
  if 0 in (array.shape[:2] if one else array.shape[1:3]):
    raise ValueError(f"a {array.shape} array: its images are empty")
  return [array] if one else list(array)


def _channels_first(shape: tuple) -> bool:
  """Whether an array of images has them (C, H, W): a channel count before a side longer than 4. Read as (H, W, C),
  a (3, H, W) array whose W is 1, 3 or 4 would be an image of 3 rows, a strip that no camera makes."""
  return len(shape) in (3, 4) and shape[-3] in CHANNELS and shape[-2] > 4


def _not_images(shape: tuple) -> str:
  given = f"a {len(shape)}-dimensional array {shape}"
  if len(shape) == 3 and _channels_first(shape):
    return f"{given} looks channels-first (C, H, W): pass (H, W, C), e.g. np.transpose(image, (1, 2, 0))"
  if len(shape) == 4 and shape[1] in CHANNELS:
    return f"{given} looks channels-first (N, C, H, W): pass (N, H, W, C), e.g. np.transpose(images, (0, 2, 3, 1))"
  return f"{given}: an image is (H, W) grey or (H, W, C), a batch (N, H, W, C), with C 1, 3 or 4"


def _pixels(image) -> np.ndarray:
  """(H, W, 3) uint8 of a file (read as training reads it, whole: no draft decode) or a PIL image, upright by its
  EXIF orientation, or of a checked array."""
  if isinstance(image, np.ndarray):
    return sources.as_rgb(sources.to_uint8(image))
  if isinstance(image, str):
    return sources.decode(image)
  return sources.rgb(sources.upright(image))


def check_top(k) -> int:
  """k, the classes to name per image (Model.top's k, scripts/predict.py's --top), or the ValueError that refuses
  it: a whole number ≥ 1; one above the number of classes names them all."""
  if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
    raise ValueError(f"k must be a whole number ≥ 1 (the classes to name per image), not {k!r}")
  return int(k)


def _why(e: Exception) -> str:
  if isinstance(e, Image.UnidentifiedImageError):  # its message repeats the path
    return "not an image that PIL can read"
  return (str(e).splitlines() or [type(e).__name__])[0]


def _warn(skipped) -> None:
  for file, why in filter(None, skipped):
    warnings.warn(f"skipped {file}: {why}", skip_file_prefixes=(PACKAGE,))


class Model:
  """A trained run: its classes, and its network's predictions on images (the module's rule)."""

  def __init__(self, workdir: str, overrides: dict):
    config = run.read(workdir).config
    config.mesh.model, config.mesh.data = 1, 1
    config.update(overrides)
    self.run, self.setup, self.state = restore.restore_newest(workdir, config)
    self.workdir = workdir
    self._scores = jax.jit(lambda params, images, crops: class_log_probs(self.setup, params, images, crops),
                           static_argnums=2)

  @property
  def classes(self) -> tuple[str, ...]:
    return self.run.classes

  @property
  def step(self) -> int:
    return int(self.state.step)

  def stored(self, images) -> np.ndarray:
    """The readable images as training stored them: (N, S, S, 3) uint8, each resized to shorter side S and cut to
    its central S×S; a file that cannot be read is left out, with a warning."""
    return stored(images, self.run.size)

  def predict(self, images, crops: int = 1) -> np.ndarray:
    """Class probabilities (N, classes), a row per image in order, of its centre crop or the mean of its 5 or 10;
    a row of NaN for a file that cannot be read (skipped with a warning)."""
    return self._predict(images, crops)[0]

  def top(self, images, k: int = 5, crops: int = 1) -> list[list[tuple[str, float]] | None]:
    """The k likeliest classes of each image in order, with their probabilities (k ≥ 1; all of them where k is more
    than the classes); None for a file that cannot be read (skipped with a warning)."""
    k = check_top(k)
    probs, skipped = self._predict(images, crops)
    return [None if why else [(self.classes[c], float(p[c])) for c in np.argsort(-p, kind="stable")[:k]]
            for p, why in zip(probs, skipped)]

  def _predict(self, images, crops: int) -> tuple[np.ndarray, list]:
    """(probabilities (N, classes), NaN where skipped; None or (file, why) per image), a batch read at a time."""
    if crops not in CROPS:
      raise ValueError(f"crops must be 1 (the centre crop), 5 (corners and centre) or 10 (and their mirrors), not "
                       f"{crops!r}")
    parts, skipped = [], []
    for chunk in itertools.batched(read(images, self.run.size), self.run.config.eval_batch_size):
      probs = np.full((len(chunk), len(self.classes)), np.nan, np.float32)
      kept = [i for i, (_, why) in enumerate(chunk) if why is None]
      if kept:
        probs[kept] = self._probabilities(np.stack([chunk[i][0] for i in kept]), crops)
      parts.append(probs)
      skipped += [why for _, why in chunk]
    _warn(skipped)
    return (np.concatenate(parts) if parts else np.zeros((0, len(self.classes)), np.float32)), skipped

  def _probabilities(self, stored: np.ndarray, crops: int) -> np.ndarray:
    """Of at most a batch of stored images, padded to the whole batch: one compiled program for every call."""
    padded = np.concatenate([stored, np.repeat(stored[-1:], self.run.config.eval_batch_size - len(stored), 0)])
    return np.exp(np.asarray(self._scores(self.state.params, padded, crops)))[:len(stored)]

  def evaluate(self, crops: int = 1) -> dict:
    """Top-1, top-5, loss and count on the run's evaluation split (config.dataset.data_dir, where it lies now, may
    be given to load)."""
    config = self.run.config
    dataset = get_dataset(config, statistics=self.run.statistics)
    p_eval_step = jax.jit(functools.partial(eval_step, setup=self.setup), static_argnames="crops")
    return evaluation.evaluate(self.state, dataset, config, p_eval_step, self.setup.batch_layout, crops)
