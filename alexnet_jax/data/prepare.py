"""Preparing an image folder once for fast training (scripts/prepare_data.py): a copy with every image's shorter side
resized, as the paper stored ImageNet at 256, so that training decodes small JPEGs and skips the resize."""

import concurrent.futures
import os

from PIL import Image

from alexnet_jax.data import augment
from alexnet_jax.data.sources import IMAGE_SUFFIXES, UNREADABLE, DataError, decode


def resize_file(src: str, dst: str, size: int) -> str | None:
  """Writes src resized to shorter side `size` as a JPEG at dst; the error, if src cannot be read."""
  try:
    image = augment.resize_shorter(decode(src, size), size)
  except UNREADABLE as e:
    return f"{src}: {e}"
  os.makedirs(os.path.dirname(dst), exist_ok=True)
  Image.fromarray(image).save(dst, quality=95)
  return None


def resize_folder(root: str, out: str, size: int, workers: int | None = None) -> tuple[int, list[str]]:
  """(images written, errors) for a copy of root/<split>/<class>/* in out with shorter sides `size`."""
  if not os.path.isdir(root):
    raise DataError(f"no image folder at {root}")
  if os.path.abspath(root) == os.path.abspath(out):
    raise DataError("the resized copy must go to another folder: the originals are kept")
  jobs = []
  for dirpath, _, files in os.walk(root):
    for f in sorted(files):
      if f.lower().endswith(IMAGE_SUFFIXES):
        rel = os.path.relpath(os.path.join(dirpath, f), root)
        jobs.append((os.path.join(root, rel), os.path.join(out, os.path.splitext(rel)[0] + ".jpg")))
  if not jobs:
    raise DataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {root}")
  with concurrent.futures.ProcessPoolExecutor(workers) as pool:
    errors = [e for e in pool.map(resize_file, *zip(*jobs), [size] * len(jobs), chunksize=64) if e]
  return len(jobs) - len(errors), errors
