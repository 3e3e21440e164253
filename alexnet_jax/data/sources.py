"""Random-access sources of labelled images: a tfds dataset, an image folder, the built-in procedural set.

A source has `len()` and `source[i]` → {'image': (H, W, 3) uint8, 'label': int}, and answers the two questions the
pipeline asks of it: `resize`, the shorter side its images are resized to before the random crop (None: they come
at the crop size and pass unaugmented), and `statistics`, its pixel statistics if it knows them (None: the pipeline
measures them, statistics.measure). Grain reads sources by index from threads or worker processes, so they hold
paths, not open files.
A source raises one of UNREADABLE for an image that cannot be decoded: decode.Decoder then takes the next readable
one, with a warning, and counts it (summed beside each training batch into the metrics). Every image file is read
by `decode` (training, prepare, the API): turned upright by its EXIF orientation, then made RGB by `rgb`.
"""

import dataclasses
import functools
import io
import logging
import os
import stat

import numpy as np
import PIL
from PIL import ExifTags, Image, ImageOps

from alexnet_jax.data import procedural
from alexnet_jax.data.statistics import IMAGENET, Statistics

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")
# A decompression bomb (more pixels than PIL's MAX_IMAGE_PIXELS) is unreadable like a corrupt file; PIL only warns
# below twice the limit, and its warning, where promoted to an error, is one too.
UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning)
# Modes that reach RGB through another: PIL has no La → RGB, and turns a palette image with transparency given per
# entry into RGB only with a warning (into RGBA without one; the alpha is then dropped, as an RGBA image's is).
RGB_VIA = {"La": "LA", "P": "RGBA"}
# tfds datasets whose pixel statistics are published: the rest are measured on their training images.
TFDS_STATISTICS = {"imagenet2012": IMAGENET}


class DataError(ValueError):
  """A dataset that cannot be read as configured; the message says what to do."""


def decode(data: bytes | str, min_size: int = 0) -> np.ndarray:
  """(H, W, 3) uint8 from encoded bytes or a path. JPEGs are decoded at the smallest power-of-two reduction that
  keeps the shorter side ≥ min_size (PIL's draft mode): a 4000-pixel photo decodes 4–16× faster for the same
  crop. Turned upright (`upright`), then pixels as `rgb` makes them."""
  with Image.open(data if isinstance(data, str) else io.BytesIO(data)) as image:
    if min_size:
      image.draft("RGB", (min_size, min_size))
    return rgb(upright(image))


def upright(image: Image.Image) -> Image.Image:
  """`image` turned as its EXIF orientation says it is viewed (a camera stores a portrait shot sideways, tagged):
  the one place that reads the tag, so that a file has the same pixels in training, prepare and the API."""
  if image.getexif().get(ExifTags.Base.Orientation, 1) == 1:
    return image  # exif_transpose would copy it
  return ImageOps.exif_transpose(image)


def rgb(image: Image.Image) -> np.ndarray:
  """(H, W, 3) uint8 of a PIL image of any mode: grey, palette, CMYK, YCbCr, HSV, RGBA and 16-bit images become
  8-bit RGB; 32-bit integer or float images (PIL's modes I and F: a 16-bit PGM, a float TIFF), whose range PIL does
  not know, modes PIL cannot convert and images without pixels (0 wide or high) are refused with a ValueError."""
  if 0 in image.size:
    raise ValueError(f"a {image.width}×{image.height} image: it has no pixels")
  if image.mode.startswith("I;16"):  # 16-bit grey (converting to RGB would clip at 255 instead)
    return as_rgb(to_uint8(np.asarray(image)))
  if image.mode in ("I", "F"):
    raise ValueError(f"{'32-bit integer' if image.mode == 'I' else 'floating-point'} pixels (PIL mode "
                     f"{image.mode}) of unknown range: store the image with 8 or 16 bits per channel")
  if image.mode == "HSV" and not _hsv_converts():
    raise ValueError(f"PIL {PIL.__version__} cannot convert HSV images to RGB: convert them with a newer Pillow")
  if image.mode in RGB_VIA:
    image = image.convert(RGB_VIA[image.mode])
  return np.asarray(image.convert("RGB"))


@functools.cache
def _hsv_converts() -> bool:
  """Whether this Pillow converts HSV to RGB: one that cannot refuses, or copies the bytes (hue as red)."""
  try:
    return Image.new("HSV", (1, 1), (85, 255, 255)).convert("RGB").getpixel((0, 0)) == (0, 255, 0)
  except ValueError:
    return False


def to_uint8(image: np.ndarray) -> np.ndarray:
  """8-bit pixels from 8- or 16-bit ones: 16-bit values keep their top byte (32768 → 128, 65535 → 255), as PIL
  reduces 16-bit RGB PNGs; other types (signed, 32-bit, float), whose range is not known, raise a ValueError."""
  image = np.asarray(image)
  if image.dtype == np.uint8:
    return image
  if image.dtype.kind == "u" and image.dtype.itemsize == 2:
    return (image >> 8).astype(np.uint8)
  raise ValueError(f"{image.dtype} pixels of unknown range: store the images with 8 or 16 bits per channel")


def as_rgb(image: np.ndarray) -> np.ndarray:
  """Grey (H, W) or (H, W, 1) and RGBA images as (H, W, 3)."""
  image = np.asarray(image)
  if image.ndim == 2:
    image = image[..., None]
  if image.shape[-1] == 1:
    return np.repeat(image, 3, axis=-1)
  return image[..., :3]


def split_folder(root: str, split: str, key: str = "", other: str = "") -> str:
  """root/<split>, or the DataError that tells a missing root from a missing split (missing_split)."""
  if not os.path.isdir(root):
    raise DataError(f"no such directory: {root}" if root else "no data directory: set --config.dataset.data_dir")
  folder, held = os.path.join(root, split), _subdirs(root)
  if not held:
    raise DataError(f"{root} holds no split folders: expected {folder}/<class>/<image>.jpg")
  if not os.path.isdir(folder):
    raise missing_split(root, split, held, key, other)
  return folder


def missing_split(where: str, split: str, held: list[str], key: str = "", other: str = "") -> DataError:
  """The error for a split that `where` lacks, listing those it holds (a split's name is more often guessed wrong,
  val for validation, than its root). With `key`, the config key that named it, and the value to set it to where
  one split is left once `other`, the run's other split, is set aside."""
  said = f"no split {split!r} in {where} (it holds: {', '.join(held) or 'none'})"
  offered = [h for h in held if h != other]
  if not key:
    return DataError(said)
  if not offered:
    return DataError(f"{said}: add a split of its own and name it with --config.{key}")
  return DataError(f"{said}: set --config.{key}" + (f"={offered[0]}" if len(offered) == 1 else " to one of them"))


class ImageFolder:
  """root/<split>/<class>/<image>: classes are the sorted directory names of root/<train_split>."""

  statistics = None

  def __init__(self, root: str, split: str, classes: tuple[str, ...], resize: int):
    folder = split_folder(root, split)
    unknown = sorted(set(_subdirs(folder)) - set(classes))
    if unknown:
      raise DataError(f"{folder} has classes that the training split lacks: {', '.join(unknown[:5])}")
    self.files, self.labels, empty = [], [], []
    for label, name in enumerate(classes):
      class_dir = os.path.join(folder, name)
      names = sorted(os.listdir(class_dir)) if os.path.isdir(class_dir) else []
      images = [os.path.join(class_dir, f) for f in names if f.lower().endswith(IMAGE_SUFFIXES)]
      # Only regular files: reading a FIFO or a device named like an image would wait forever.
      odd = [f for f in images if not _regular(f)]
      for f in odd:
        logging.warning("skipping %s: not a regular file", f)
      images = [f for f in images if f not in odd]
      if os.path.isdir(class_dir) and not images:  # a split may lack a class, but not hold it empty
        empty.append(name)
      self.files += images
      self.labels += [label] * len(images)
    if empty:
      raise DataError(f"{folder} has class folders without images ({', '.join(IMAGE_SUFFIXES)}): "
                      f"{', '.join(empty[:5])}{' …' if len(empty) > 5 else ''}; add images or remove them")
    if not self.files:
      raise DataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {folder}/<class>/")
    self.resize = resize

  def __len__(self):
    return len(self.files)

  def __getitem__(self, i):
    return dict(image=decode(self.files[i], self.resize), label=self.labels[i])

  def where(self, i: int) -> str:
    return self.files[i]


def where(source, i: int) -> str:
  """Example i of `source`, as messages name it: its file, or its store's shard and record (the source's own
  `where`), else its index."""
  named = getattr(source, "where", None)
  return named(i) if named else f"#{i}"


def _regular(path: str) -> bool:
  try:
    return stat.S_ISREG(os.stat(path).st_mode)
  except OSError:
    return False


def _subdirs(folder: str) -> list[str]:
  return sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))


def folder_classes(root: str, train_split: str) -> tuple[str, ...]:
  folder = split_folder(root, train_split)
  classes = tuple(_subdirs(folder))
  if not classes:
    raise DataError(f"{folder} holds no class folders: expected {folder}/<class>/<image>.jpg")
  if len(classes) == 1:  # every label the same: training would reach top-1 1.0 and learn nothing
    raise DataError(f"{folder} holds one class folder, {classes[0]}: a classifier needs ≥ 2 classes, a folder of "
                    "images for each")
  return classes


def image_folders(root: str, train_split: str, eval_split: str, resize: int) -> tuple[ImageFolder, ImageFolder, tuple]:
  """(training source, evaluation source, class names) of root/<split>/<class>/<image> for the splits that
  config.dataset.train_split and eval_split name; a split that is not there is reported with the key to set."""
  for key, split, other in (("train_split", train_split, eval_split), ("eval_split", eval_split, train_split)):
    split_folder(root, split, f"dataset.{key}", other)
  classes = folder_classes(root, train_split)
  return ImageFolder(root, train_split, classes, resize), ImageFolder(root, eval_split, classes, resize), classes


def tfds_sources(name: str, data_dir: str, splits: tuple[str, ...], resize: int) -> tuple[list, tuple[str, ...]]:
  """([random-access source per split], class names) of a tfds dataset prepared as array_record in data_dir."""
  try:
    import tensorflow_datasets as tfds  # noqa: PLC0415  (slow import, only for tfds datasets)
  except ModuleNotFoundError:
    raise DataError(f"config.dataset.name={name!r} is read through tensorflow-datasets: pip install -e '.[tfds]', "
                    "or prepare a store (make prepare) and train on it with --config.dataset.name=store") from None
  try:
    builder = tfds.builder(name, data_dir=data_dir or None, file_format="array_record")
  except tfds.core.registered.DatasetNotFoundError:
    raise DataError(f"tensorflow-datasets has no dataset {name!r} (see https://www.tensorflow.org/datasets/catalog)"
                    ) from None
  label = builder.info.features["label"] if "label" in builder.info.features else None
  if label is None or not hasattr(label, "num_classes") or "image" not in builder.info.features:
    raise DataError(f"tfds dataset {name!r} is not an image classification dataset with 'image' and 'label'")
  known = TFDS_STATISTICS.get(name)
  names = tuple(label.names) if getattr(label, "names", None) else tuple(map(str, range(label.num_classes)))
  return [_Tfds(_data_source(builder, name, data_dir, split), resize, known) for split in splits], names


def _data_source(builder, name: str, data_dir: str, split: str):
  try:
    source = builder.as_data_source(split)
    len(source)  # the source opens its files lazily: fail here, not in a worker
  except (AssertionError, FileNotFoundError, KeyError, NotImplementedError, RuntimeError, ValueError) as e:
    if builder.is_prepared():
      raise DataError(f"tfds dataset {name!r} has no split {split!r} ({str(e).splitlines()[0][:200]}); "
                      f"it has {', '.join(builder.info.splits)}") from None
    where = data_dir or "~/tensorflow_datasets"
    manual = " --manual_dir=<folder with the ILSVRC2012 tar files>" if name.startswith("imagenet") else ""
    raise DataError(f"tfds dataset {name!r} is not prepared as array_record in {where}; prepare it once with: "
                    f"make prepare ARGS='--name={name} --data_dir={where}{manual}'") from None
  return source


class _Tfds:
  """Keeps only image and label of a tfds example (ids and file names would not batch)."""

  def __init__(self, source, resize: int, statistics: Statistics | None):
    self.source, self.resize, self.statistics = source, resize, statistics

  def __len__(self):
    return len(self.source)

  def __getitem__(self, i):
    example = self.source[i]
    return dict(image=as_rgb(to_uint8(example["image"])), label=int(example["label"]))


@dataclasses.dataclass(frozen=True)
class ProceduralSource:
  """Images drawn at the crop size: neither resized nor cropped, nor flipped (a mirror turns a 36° grating into a
  144° one, another class)."""

  resize = None
  statistics = procedural.STATISTICS
  seed: int
  split: str
  size: int
  length: int

  def __len__(self):
    return self.length

  def __getitem__(self, i):
    images, labels = procedural.generate(self.seed, self.split, i, 1, self.size)
    return dict(image=np.round(images[0] * 255).astype(np.uint8), label=int(labels[0]))
