"""Training batches on the mesh: the batch contract, which rows each device and process receives, and the objects that
put a host batch on the devices (HostPut) or have the devices decode it (DevicePut).

A batch's rows are split over some of the mesh's axes and replicated over the others (`BatchLayout`): the placement plan
says which (network.placement: the 'data' axis for towers that each read their data shard's whole batch, as the
paper's GPUs each received the whole batch; 'data' and 'model' for data-parallel first layers). The host sends each
device the rows it holds, and a process reads the rows its devices hold (`BatchLayout.process_rows`), so that the global
batch is the one a single process would read.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from alexnet_jax.data import nvdecode


def check_batch(batch: dict, size: int, image_size: int) -> None:
  """Raises one ValueError if a training batch breaks the contract (pipeline.py) for stored images of side `size`
  and crops of `image_size`: offsets out of range would be clamped on the device, silently. A batch for the
  devices to decode (decoder 'gpu') carries JPEGs instead of images, and one under the device cache only the
  decoded rows (data/cache.py): their draws and labels are checked."""
  n = len(batch["label"]) if "label" in batch else 0
  expected = dict(image=((n, size, size, 3), "uint8"), offset=((n, 2), "int32"), flip=((n,), "bool"),
                  shift=((n, 3), "float32"), label=((n,), "int32"))
  keys = list(batch)
  if "jpeg" in batch or "decoded" in batch:
    del expected["image"]
    keys = [k for k in keys if k in expected]
  got = {k: (np.shape(batch[k]), np.asarray(batch[k]).dtype.name) for k in keys}
  if got != expected:
    raise ValueError(f"expected a batch of {_described(expected)}; got {_described(got)}")
  if n and (batch["offset"].min() < 0 or batch["offset"].max() > size - image_size):
    raise ValueError(f"crop offsets must lie in [0, {size - image_size}] ({size}-pixel images, {image_size}-pixel "
                     f"crops), got {batch['offset'].min()}..{batch['offset'].max()}")


def _described(spec: dict) -> str:
  return ", ".join(f"{k} {shape} {dtype}" for k, (shape, dtype) in spec.items())


def random_batch(n: int, image_size: int, num_classes: int, seed: int = 0, size: int | None = None) -> dict:
  """A training batch of random pixels, crops, flips and labels, for benchmarks and tests of the step alone: images
  of side `size` (default image_size: the crops are the whole images) and no colour shift."""
  rng = np.random.default_rng(seed)
  size = size or image_size
  return dict(image=rng.integers(0, 256, (n, size, size, 3), np.uint8),
              offset=rng.integers(0, size - image_size + 1, (n, 2)).astype(np.int32),
              flip=rng.random(n) < 0.5, shift=np.zeros((n, 3), np.float32),
              label=rng.integers(0, num_classes, n).astype(np.int32))


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """A batch's rows split over the mesh axes `axes` (major first) and replicated over the others."""

  mesh: jax.sharding.Mesh
  axes: tuple[str, ...]

  def sharding(self, ndim: int) -> NamedSharding:
    return NamedSharding(self.mesh, P(self.axes, *(None,) * (ndim - 1)))

  @property
  def blocks(self) -> int:
    """The blocks a batch's rows are split into: one per position along the axes."""
    return math.prod(self.mesh.shape[a] for a in self.axes)

  def process_rows(self, n: int) -> slice:
    """The rows of an n-row batch that this process's devices hold: the share it reads. One process holds them
    all; under several, each its devices' block, which must be one consecutive block."""
    held = self.sharding(1).addressable_devices_indices_map((n,)).values()
    blocks = sorted({(s.start or 0, n if s.stop is None else s.stop) for s, in held})
    if not blocks or any(a[1] != b[0] for a, b in zip(blocks, blocks[1:])):
      raise ValueError(f"process {jax.process_index()}'s devices hold rows {blocks} of the batch, not one "
                       "consecutive block: order the mesh's devices by process")
    return slice(blocks[0][0], blocks[-1][1])

  def put(self, batch: dict) -> dict:
    """Places this process's share of a batch on the mesh: its pixels alone, its small arrays (a few bytes a row:
    crops, flips, shifts, labels) as the int32 columns of one array that the devices split again. A put's cost to the
    host hardly depends on its size, and the small arrays' puts one by one held the feed's thread longer than the
    pixels' (docs/BENCHMARKS.md, the tiered cache's rows)."""
    arrays = {k: np.asarray(v) for k, v in batch.items()}
    small = {k: v for k, v in arrays.items() if k != "image" and v.ndim and v.dtype.name in PACKED}
    if len(small) < 2 or len({len(v) for v in arrays.values() if v.ndim}) != 1:  # nothing to save, or ragged rows
      small = {}
    placed = {k: jax.make_array_from_process_local_data(self.sharding(v.ndim), v)
              for k, v in arrays.items() if k not in small}
    if small:
      spec = tuple((k, v.dtype.name, v.shape[1:]) for k, v in small.items())
      columns = np.concatenate([v.reshape(len(v), -1).astype(np.int32) if v.dtype == bool
                                else v.reshape(len(v), -1).view(np.int32) for v in small.values()], axis=1)
      placed.update(_unpacked(self, spec)(jax.make_array_from_process_local_data(self.sharding(2), columns)))
    return {k: placed[k] for k in batch}


PACKED = ("bool", "int32", "float32")  # the dtypes a batch's small arrays may travel in as int32 columns


@functools.cache
def _unpacked(rows: BatchLayout, spec: tuple):
  """jit(int32 columns → the small arrays `spec` ((key, dtype, shape of a row), …) says they hold), each device on
  its own rows."""
  def unpack(columns):
    arrays, start = {}, 0
    for key, dtype, shape in spec:
      width = math.prod(shape)
      part = columns[:, start:start + width].reshape(-1, *shape)
      arrays[key] = part != 0 if dtype == "bool" else jax.lax.bitcast_convert_type(part, jnp.dtype(dtype))
      start += width
    return arrays

  return jax.jit(unpack, out_shardings={key: rows.sharding(1 + len(shape)) for key, _, shape in spec})


class HostPut:
  """put([host batch]) → finish, finish() → [(device batch, images skipped on the device: none)], as data.feed.Feed
  takes them: the host's images and draws placed on the mesh, a batch a put (`group`)."""

  group = 1  # the batches a put takes

  def __init__(self, rows: BatchLayout, size: int, image_size: int):
    self.rows, self.size, self.image_size = rows, size, image_size
    self.seconds = {}  # where a put's time went beyond the feed's own split: nowhere else here

  def put(self, batches: list[dict]):
    batch, = batches
    check_batch(batch, self.size, self.image_size)
    on_device = self.rows.put(batch)
    return lambda: [(on_device, 0)]

  def close(self) -> None:
    pass


class DevicePut(HostPut):
  """put([host batch of JPEGs]) → finish, as HostPut: the devices' decoding processes (nvdecode.py) decode each
  device's rows; finish collects them with the draws and labels placed beside them. close() stops the processes;
  `seconds` says where the decoding's time went."""

  def __init__(self, rows: BatchLayout, size: int, image_size: int, batch_size: int, host, backends: str):
    super().__init__(rows, size, image_size)
    process_rows = rows.process_rows(batch_size)
    self.share = process_rows.stop - process_rows.start
    self.decoder = nvdecode.DeviceDecoder(rows.sharding(4), batch_size, host, nvdecode.THREADS, backends)
    self.seconds = self.decoder.seconds

  def put(self, batches: list[dict]):
    batch, = batches
    check_batch(batch, self.size, self.image_size)
    if len(batch["label"]) != self.share:
      raise ValueError(f"expected {self.share} images in this process's batch, got {len(batch['label'])}")
    decoded = self.decoder.start(batch)

    def finish():
      images, labels, skipped = decoded()
      rest = dict(offset=batch["offset"], flip=batch["flip"], shift=batch["shift"], label=labels)
      return [(dict(image=images, **self.rows.put(rest)), skipped)]

    return finish

  def close(self) -> None:
    self.decoder.close()
