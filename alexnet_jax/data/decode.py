"""Decoding on the host's CPU, into fixed-size batches: every example becomes an S×S uint8 image (S = dataset.resize,
the paper's 256; the crop size for sets that come at it), written straight into its row of one preallocated
(N, S, S, 3) batch by a pool of threads.

A source's examples are {'jpeg': bytes, 'label': int} (a store of S×S JPEGs) or {'image': (H, W, 3) uint8,
'label': int} (tfds, image folders, the procedural set: sources.py). An S×S JPEG in YCbCr or grey is decoded by
libjpeg-turbo through simplejpeg, which releases the GIL, so threads of one process decode in parallel. Anything
else goes through PIL and augment.resize_center_crop (the paper's storage, on the fly). An example that neither can
read is replaced by the next readable one (i+1, i+2, …, wrapping) with a warning, and counted; the substitute
depends only on i, so a batch stays a pure function of its indices.

fast_decode (config.dataset.fast_decode): libjpeg-turbo's fast integer DCT and chroma upsampling, little if any
faster (docs/BENCHMARKS.md) and off pixels by about a level of 255 (tens where the chroma is busy): FAST_MEAN_ERROR
and FAST_MAX_ERROR state the tolerance. Off, the default, simplejpeg decodes exactly PIL's pixels, so a JPEG gets
the same pixels whichever path it takes. Only PIL's path turns a JPEG by its EXIF orientation (sources.upright).
"""

import concurrent.futures
import logging

import numpy as np
import simplejpeg

from alexnet_jax.data import augment, rings, sources
from alexnet_jax.data.sources import UNREADABLE, DataError, decode

# The stated cost of fast_decode, |fast − PIL| in levels of 0..255, with room over the worst seen on busy-chroma JPEGs.
FAST_MEAN_ERROR, FAST_MAX_ERROR = 6, 64
SIMPLEJPEG_COLORSPACES = ("YCbCr", "Gray")  # what libjpeg-turbo turns into RGB as PIL does; CMYK and YCCK go to PIL


class Decoder:
  """`source`'s examples as size×size uint8 images: a batch at a time (batch), with `threads` threads, or one by one
  ([i]: the statistics and tests)."""

  def __init__(self, source, size: int, fast: bool = False, threads: int = 1, num_classes: int | None = None):
    self.source, self.size, self.fast, self.threads = source, size, fast, threads
    self.num_classes = num_classes  # labels are checked to lie in [0, num_classes) where given
    self._pool = self._new_pool()

  def _new_pool(self):  # its threads start on first use
    return concurrent.futures.ThreadPoolExecutor(self.threads, "decode") if self.threads > 1 else None

  def __getstate__(self):  # a pool does not travel to Grain's worker processes: each makes its own
    return self.__dict__ | dict(_pool=None)

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._pool = self._new_pool()

  def __len__(self):
    return len(self.source)

  def __getitem__(self, i) -> dict:
    """{'image': (size, size, 3) uint8, 'label': int, 'skipped': how many unreadable examples were passed over}."""
    image = np.empty((self.size, self.size, 3), np.uint8)
    label, skipped = self.read_into(int(i), image)
    return dict(image=image, label=label, skipped=skipped)

  def batch(self, indices) -> tuple[np.ndarray, np.ndarray, int]:
    """(images (N, size, size, 3) uint8, labels (N,) int32, unreadable examples passed over) of examples
    `indices`."""
    images, labels, skipped = self.rows(indices)
    return images, labels, int(skipped.sum())

  def rows(self, indices, out=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """batch's images and labels, and per row the unreadable examples passed over (N,) int: a row whose own example
    could not be read holds the next readable one's. The images are decoded into `out` where given (N arrays of
    (size, size, 3) uint8, e.g. rows of a larger batch), which is returned in their place."""
    images = rings.empty((len(indices), self.size, self.size, 3)) if out is None else out
    reads = self._map(self.read_into, [int(i) for i in indices], images)  # a row of `images` is a view into it
    return (images, np.array([label for label, _ in reads], np.int32),
            np.array([skipped for _, skipped in reads], np.int64))

  def jpeg_batch(self, indices, host_rows: np.ndarray) -> tuple[dict, int]:
    """(batch, unreadable examples passed over) for the devices to decode (nvdecode.py): 'jpeg' uint8, the JPEG
    bytes of each example that is an S×S colour JPEG one after another, row r's ending at 'jpeg_end' (N,) int64;
    none for the other rows and for the rows `host_rows`, which the host decodes here ('host_rows' (K,) int32,
    'host_image' (K, S, S, 3) uint8, an unreadable example's substitute among them); 'index' (N,) int64, the
    examples (for a device's failure: the host decodes that one too); 'label'. Flat arrays, not a list of bytes:
    from a worker process they come through shared memory, unpickled by nobody."""
    indices = np.asarray(indices, np.int64)
    examples = self._map(self._read_example, indices.tolist())
    on_host = np.zeros(len(indices), bool)
    on_host[host_rows] = True
    on_host |= [example is None or not self.device_decodable(example) for example in examples]
    rows = np.flatnonzero(on_host).astype(np.int32)
    images = np.empty((len(rows), self.size, self.size, 3), np.uint8)
    reads = self._map(self._decode_read, indices[rows].tolist(), [examples[r] for r in rows], images)
    labels = np.array([-1 if e is None else self._label(int(i), e) for i, e in zip(indices, examples)], np.int32)
    labels[rows] = [label for label, _ in reads]
    jpegs = [b"" if host else e["jpeg"] for e, host in zip(examples, on_host)]
    ends = np.cumsum([len(jpeg) for jpeg in jpegs], dtype=np.int64)
    flat = np.frombuffer(b"".join(jpegs), np.uint8)
    batch = dict(jpeg=flat, jpeg_end=ends, host_rows=rows, host_image=images, index=indices, label=labels)
    return batch, sum(skipped for _, skipped in reads)

  def device_decodable(self, example: dict) -> bool:
    """Whether `example` is a JPEG that nvJPEG decodes to this decoder's pixels: S×S, in colour (YCbCr)."""
    if "jpeg" not in example:
      return False
    try:
      h, w, colorspace, _ = simplejpeg.decode_jpeg_header(example["jpeg"])
    except ValueError:
      return False
    return (h, w) == (self.size, self.size) and colorspace == "YCbCr"

  def _decode_read(self, i: int, example: dict | None, out: np.ndarray) -> tuple[int, int]:
    """read_into for example i already read (None: it could not be): decoded from what was read, not read again;
    one that does not decode goes to read_into, which warns, counts and substitutes."""
    if example is not None:
      try:
        self._decode_into(example, out)
      except DataError:
        raise
      except UNREADABLE:
        return self.read_into(i, out)
      return self._label(i, example), 0
    return self.read_into(i, out)

  def _read_example(self, i: int) -> dict | None:
    try:
      return self.source[i]
    except DataError:  # the dataset's, not the image's
      raise
    except UNREADABLE:
      return None

  def where(self, i: int) -> str:
    """Example i, as messages name it: its file, or its store's shard and record, or its index."""
    return sources.where(self.source, i)

  def _label(self, i: int, example: dict) -> int:
    """Example i's label, checked to be a class: a label outside them would train on wrong targets, silently."""
    label = int(example["label"])
    if self.num_classes is not None and not 0 <= label < self.num_classes:
      raise DataError(f"image {self.where(i)} has label {label}, not one of the {self.num_classes} classes "
                      f"[0, {self.num_classes - 1}]: the dataset is corrupt or written for other classes")
    return label

  def _map(self, fn, *args) -> list:
    return list(self._pool.map(fn, *args) if self._pool else map(fn, *args))

  def read_into(self, i: int, out: np.ndarray) -> tuple[int, int]:
    """(label, unreadable examples passed over) of example i decoded into `out`, or of the next readable one."""
    n = len(self.source)
    for skipped in range(n):
      j = (i + skipped) % n
      try:
        example = self.source[j]
        self._decode_into(example, out)
      except DataError:  # the dataset's, not the image's
        raise
      except UNREADABLE as e:
        logging.warning("skipping unreadable image %s: %s", self.where(j), e)
        continue
      return self._label(j, example), skipped
    raise DataError(f"none of the {n} images of this split can be read")

  def _decode_into(self, example: dict, out: np.ndarray) -> None:
    if "image" in example:
      out[...] = augment.resize_center_crop(example["image"], self.size)
      return
    data = example["jpeg"]
    try:
      h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
      if (h, w) == (self.size, self.size) and colorspace in SIMPLEJPEG_COLORSPACES:
        simplejpeg.decode_jpeg(data, "RGB", fastdct=self.fast, fastupsample=self.fast, buffer=out)
        return
    except ValueError:  # not a JPEG, or one libjpeg-turbo calls damaged: PIL reads it or names the fault
      pass
    out[...] = augment.resize_center_crop(decode(data, self.size), self.size)
