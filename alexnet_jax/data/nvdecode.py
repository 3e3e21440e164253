"""Decoding on the devices with NVIDIA's nvImageCodec: each device decodes its own rows of a training batch, so the
host sends JPEG bytes (~23 KB an image in the paper's store) instead of pixels (196 KB), and its cores do not decode.

The host's batch comes from decode.Decoder.jpeg_batch: the JPEG of every row that nvJPEG can decode to the host
decoder's pixels (an S×S colour JPEG), the pixels of the rows that the host decoded (config.dataset.host_share of
them, and any other image). On a GPU each device holds SLOTS batch buffers that JAX allocated; nvImageCodec (batched
nvJPEG on the GPU's hardware JPEG engines, with CUDA and CPU fallbacks that it picks) decodes its rows straight into
one of them on a CUDA stream of ours, the host's rows are copied in beside them, and once the stream is done a copy
that JAX owns becomes the device's block of the batch: the buffer is written again only after that copy has run,
so no step can read a buffer while it is rewritten. A row that nvJPEG fails to decode is decoded by the host
decoder, which also substitutes and counts an unreadable image, as it would have on the host.

On CPU devices (tests) the same code decodes with nvImageCodec's libjpeg-turbo backend into host memory: the same
pixels as decode.Decoder's, exactly. On the GPU nvJPEG's IDCT differs from libjpeg-turbo's by at most one level of
255 (mean 4e-6 over 256 store images; 2026-11-30, H200), so a batch is a pure function of (seed, step) for each
decoder, and the two decoders' batches differ by that much.
"""

import concurrent.futures
import contextlib
import ctypes
import functools
import glob
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from alexnet_jax.data import decode
from alexnet_jax.data.sources import DataError

SLOTS = 3  # batch buffers per device: one being decoded into while steps read the copies of the others


@functools.cache
def nvimgcodec():
  """The nvimgcodec module, or None where it does not import. It tells stderr at import that it found no nvJPEG2000
  or nvTIFF libraries, whose formats we never decode: that is silenced."""
  with _quiet_stderr():
    try:
      from nvidia import nvimgcodec as module  # noqa: PLC0415
    except ImportError:
      return None
  return module


def require():
  """The nvimgcodec module; a DataError saying what to install where it does not import."""
  module = nvimgcodec()
  if module is None:
    raise DataError("config.dataset.decoder='gpu' needs nvImageCodec: pip install nvidia-nvimgcodec-cu13 "
                    "nvidia-nvjpeg")
  return module


@contextlib.contextmanager
def _quiet_stderr():
  sys.stderr.flush()
  saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  os.dup2(null, 2)
  try:
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(null)


class DeviceDecoder:
  """Turns the host's JPEG batches into image arrays (N, S, S, 3) uint8 placed as `sharding` says, each device
  decoding its block; `host` (the dataset's decode.Decoder) decodes what a device could not."""

  def __init__(self, sharding: NamedSharding, batch_size: int, host: decode.Decoder, threads: int):
    nv = require()
    self.sharding, self.host = sharding, host
    self.shape = (batch_size, host.size, host.size, 3)
    blocks = {device: range(*index[0].indices(batch_size))
              for device, index in sharding.addressable_devices_indices_map(self.shape).items()}
    first = min(rows.start for rows in blocks.values())  # this process's rows start there
    self.devices = [_Device(nv, device, slice(rows.start - first, rows.stop - first), host.size, threads)
                    for device, rows in blocks.items()]
    self._pool = concurrent.futures.ThreadPoolExecutor(len(self.devices), "nvdecode")

  def __call__(self, batch: dict) -> tuple[jax.Array, np.ndarray, int]:
    """(images, labels, unreadable images passed over) of a batch that decode.Decoder.jpeg_batch made."""
    labels = batch["label"].copy()
    jpegs = np.split(batch["jpeg"], batch["jpeg_end"][:-1])  # row r's bytes, a view of the flat array
    done = list(self._pool.map(functools.partial(self._block, batch, jpegs, labels), self.devices))
    images = jax.make_array_from_single_device_arrays(self.shape, self.sharding, [block for block, _ in done])
    return images, labels, sum(skipped for _, skipped in done)

  def _block(self, batch: dict, jpegs: list, labels: np.ndarray, device: "_Device") -> tuple[jax.Array, int]:
    rows = device.rows
    failed = device.decode(jpegs[rows])
    on_host = {r - rows.start: image for r, image in zip(batch["host_rows"], batch["host_image"])
               if rows.start <= r < rows.stop}
    skipped = 0
    for r in failed:
      image = np.empty(self.shape[1:], np.uint8)
      labels[rows.start + r], skips = self.host._read_into(int(batch["index"][rows.start + r]), image)
      on_host[r], skipped = image, skipped + skips
    return device.finish(on_host), skipped


class _Device:
  """One device's decoder, its rows of the batch and where it decodes them."""

  def __init__(self, nv, device, rows: slice, size: int, threads: int):
    self.nv, self.device, self.rows, self.size = nv, device, rows, size
    n = rows.stop - rows.start
    threads = max(1, min(threads, (os.cpu_count() or 2) - 1))  # nvImageCodec warns of more, and takes fewer
    if device.platform == "cpu":
      self.cuda = None
      self.decoder = nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY, backends=[nv.Backend(nv.CPU_ONLY)],
                                max_num_cpu_threads=threads, options="")
      return
    # options="": the library's defaults, fancy chroma upsampling as libjpeg-turbo's (the binding's default is off)
    self.cuda = _cuda_runtime()
    self.decoder = nv.Decoder(device_id=device.local_hardware_id, max_num_cpu_threads=threads, options="")
    self.stream = self.cuda.stream(device.local_hardware_id)
    self.slots = [jax.device_put(np.zeros((n, size, size, 3), np.uint8), device) for _ in range(SLOTS)]
    self.views = [[nv.as_image(_Row(slot.unsafe_buffer_pointer() + r * size * size * 3, size, self.stream))
                   for r in range(n)] for slot in self.slots]
    self.copies, self.count = [None] * SLOTS, 0

  def decode(self, jpegs: list[np.ndarray]) -> list[int]:
    """Decodes the rows whose JPEG is not empty into the next buffer; returns those that failed."""
    rows = [r for r, jpeg in enumerate(jpegs) if len(jpeg)]
    if self.cuda is None:
      self.buffer = np.empty((len(jpegs), self.size, self.size, 3), np.uint8)
      images, stream = [self.nv.as_image(self.buffer[r]) for r in rows], 0
    else:
      k = self.count % SLOTS
      if self.copies[k] is not None:
        self.copies[k].block_until_ready()  # the last reader of this buffer is its copy
      images, stream = [self.views[k][r] for r in rows], self.stream
    if not rows:
      return []
    out = self.decoder.decode([self.nv.CodeStream(jpegs[r]) for r in rows], images=images, cuda_stream=stream)
    return [r for r, image in zip(rows, out) if image is None]

  def finish(self, on_host: dict) -> jax.Array:
    """This device's block: the decoded buffer with the host's rows `on_host` ({row: (S, S, 3) uint8}) copied in."""
    if self.cuda is None:
      for r, image in on_host.items():
        self.buffer[r] = image
      return jax.device_put(self.buffer, self.device)
    k = self.count % SLOTS
    for r, image in on_host.items():
      self.cuda.copy_to_device(self.views[k][r].__cuda_array_interface__["data"][0], np.ascontiguousarray(image),
                               self.stream)
    self.cuda.synchronize(self.stream)
    self.copies[k] = _own(self.slots[k])
    self.count += 1
    return self.copies[k]


@jax.jit
def _own(block):
  return jnp.copy(block)


class _Row:
  """One S×S×3 row of a device buffer as nvImageCodec takes it (the CUDA array interface), on our stream."""

  def __init__(self, pointer: int, size: int, stream: int):
    self.__cuda_array_interface__ = dict(shape=(size, size, 3), typestr="|u1", data=(pointer, False), version=3,
                                         strides=None, stream=stream)


class _CudaRuntime:
  """The few CUDA runtime calls that JAX does not offer: a stream for nvImageCodec to decode on, waiting for it, and
  copying a host row to the device. The runtime is the one JAX's CUDA plugin brought (ctypes releases the GIL)."""

  def __init__(self, library: ctypes.CDLL):
    self.lib = library

  def _check(self, status: int, call: str) -> None:
    if status:
      raise RuntimeError(f"{call} failed with CUDA error {status}")

  def stream(self, ordinal: int) -> int:
    self._check(self.lib.cudaSetDevice(ordinal), "cudaSetDevice")
    stream = ctypes.c_void_p()
    self._check(self.lib.cudaStreamCreateWithFlags(ctypes.byref(stream), 1), "cudaStreamCreate")  # non-blocking
    return stream.value

  def synchronize(self, stream: int) -> None:
    self._check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")

  def copy_to_device(self, pointer: int, array: np.ndarray, stream: int) -> None:
    self._check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(pointer), array.ctypes.data_as(ctypes.c_void_p),
                                         ctypes.c_size_t(array.nbytes), 1, ctypes.c_void_p(stream)),  # host to device
                "cudaMemcpyAsync")


@functools.cache
def _cuda_runtime() -> _CudaRuntime:
  names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
  wheels = (os.path.join(path, "nvidia", "*", "lib", "libcudart.so*") for path in sys.path)
  names += sorted(hit for pattern in wheels for hit in glob.glob(pattern))
  for name in names:
    try:
      return _CudaRuntime(ctypes.CDLL(name))
    except OSError:
      continue
  raise ValueError("config.dataset.decoder='gpu' needs the CUDA runtime (libcudart), which JAX's CUDA plugin installs")
