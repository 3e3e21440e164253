"""Decoding on the devices with NVIDIA's nvImageCodec: each device decodes its own rows of a training batch, so the
host sends JPEG bytes (~23 KB an image in the paper's store) instead of pixels (196 KB), and its cores do not decode.

The host's batch comes from decode.Decoder.jpeg_batch: the JPEG of every row that nvJPEG can decode to the host
decoder's pixels, the pixels of the others (config.dataset.host_share of them, and any other image). Each device has
a decoding process of its own, so that nvImageCodec's host-side work does not share the training loop's interpreter;
it decodes into a buffer that this process maps (CUDA IPC) and copies into one of SLOTS batch buffers, written again
only after its copy has run, so no step reads a buffer while it is rewritten. A row that nvJPEG fails to decode is
decoded by the host decoder. On CPU devices (tests) the processes decode with libjpeg-turbo, exactly
decode.Decoder's pixels; on a GPU nvJPEG's IDCT differs by at most one level of 255, so a batch is a pure function
of (seed, step) for each decoder. docs/data.md has the rest.
"""

import collections
import contextlib
import ctypes
import functools
import glob
import mmap
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import weakref

import jax
import numpy as np
from jax.sharding import NamedSharding

from alexnet_jax.data import decode
from alexnet_jax.data.feed import IN_FLIGHT  # batches a process holds: it decodes one while the other is collected
from alexnet_jax.data.sources import DataError

SLOTS = 3  # batch buffers per device: one being written while steps read the copies of the others
# nvImageCodec's CPU threads in each decoding process: its host-side share (parsing; Huffman decoding for what
# it sends to its hybrid backend) is light with 8 (tuned on 2×H200, docs/BENCHMARKS.md).
THREADS = 8
START_S = 300  # a decoding process not started by then (imports, CUDA context, decoder) is reported as failed


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
    raise DataError("config.dataset.decoder='gpu' needs nvImageCodec: pip install -e '.[gpu]'")
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
  """Turns the host's JPEG batches into image arrays (N, S, S, 3) uint8 placed as `sharding` says, each device's
  block decoded by a process of its own with `threads` CPU threads; `host` (the dataset's decode.Decoder) decodes
  what a device could not. close(), or garbage collection, stops the processes."""

  def __init__(self, sharding: NamedSharding, batch_size: int, host: decode.Decoder, threads: int,
               backends: str = "all"):
    require()
    self.sharding, self.host = sharding, host
    self.shape = (batch_size, host.size, host.size, 3)
    blocks = {device: range(*index[0].indices(batch_size))
              for device, index in sharding.addressable_devices_indices_map(self.shape).items()}
    first = min(rows.start for rows in blocks.values())  # this process's rows start there
    self.devices, self._started, self._finished = [], 0, 0
    # where this process's time went, for benchmarks: handing batches over, waiting for the processes, collecting
    # their pixels (copies, the host's rows); 'decode': the processes' time in decoding calls, summed over them
    self.seconds = dict(start=0.0, wait=0.0, collect=0.0, decode=0.0)
    self.close = weakref.finalize(self, _close_all, self.devices)
    for device, rows in blocks.items():  # the processes start together
      self.devices.append(_Device(device, slice(rows.start - first, rows.stop - first), host.size, threads,
                                  backends))
    try:
      for device in self.devices:
        device.connect()
    except BaseException:
      self.close()
      raise

  def __call__(self, batch: dict) -> tuple[jax.Array, np.ndarray, int]:
    """(images, labels, unreadable images passed over) of a batch that decode.Decoder.jpeg_batch made."""
    return self.start(batch)()

  def start(self, batch: dict):
    """Hands the devices' processes their rows of `batch` and returns at once a function that waits for them and
    returns what __call__ does. Up to IN_FLIGHT batches may be started and not yet finished, finished in order:
    the processes decode the next batch while this one's pixels are collected (data.feed.Feed does so)."""
    if self._started - self._finished == IN_FLIGHT:
      raise RuntimeError(f"at most {IN_FLIGHT} batches can be decoding at once")
    half, begin = self._started % IN_FLIGHT, time.perf_counter()
    for device in self.devices:  # they decode at once
      device.submit(batch["jpeg"], batch["jpeg_end"], half)
    self._started += 1
    self.seconds["start"] += time.perf_counter() - begin
    return functools.partial(self._finish, batch, half)

  def _finish(self, batch: dict, half: int) -> tuple[jax.Array, np.ndarray, int]:
    if half != self._finished % IN_FLIGHT:  # the processes answer in the order the batches were started
      raise RuntimeError("decoded batches must be finished in the order they were started")
    labels, skipped, blocks = batch["label"].copy(), 0, []
    for device in self.devices:
      start, stop = device.rows.start, device.rows.stop
      first, last = np.searchsorted(batch["host_rows"], [start, stop])  # host_rows ascend
      rows, images = batch["host_rows"][first:last] - start, batch["host_image"][first:last]
      begin = time.perf_counter()
      failed, decode_s = device.wait()
      collect = time.perf_counter()
      self.seconds["wait"] += collect - begin
      self.seconds["decode"] += decode_s
      if failed:
        more = np.empty((len(failed), *self.shape[1:]), np.uint8)
        for r, image in zip(failed, more):
          labels[start + r], skips = self.host.read_into(int(batch["index"][start + r]), image)
          skipped += skips
        rows, images = np.concatenate([rows, failed]), np.concatenate([images, more])
      blocks.append(device.finish(rows.astype(np.int32), images, half))
      self.seconds["collect"] += time.perf_counter() - collect
    self._finished += 1
    return jax.make_array_from_single_device_arrays(self.shape, self.sharding, blocks), labels, skipped


def _close_all(devices: list) -> None:
  for device in devices:
    device.close()


class _Device:
  """One device's decoding process, its rows of the batch, and where their pixels go."""

  def __init__(self, device, rows: slice, size: int, threads: int, backends: str):
    self.device, self.rows, self.size = device, rows, size
    self.count, self.row_bytes = rows.stop - rows.start, size * size * 3
    self.ordinal = None if device.platform == "cpu" else device.local_hardware_id
    self.room = _jpeg_room(self.count, size)  # per batch in flight, as the pixel buffers
    self.jpegs = _Shared(IN_FLIGHT * self.room)
    self.pixels = _Shared(IN_FLIGHT * self.count * self.row_bytes) if self.ordinal is None else None
    context = multiprocessing.get_context("spawn")  # this process runs CUDA and threads: never fork it
    self.conn, child = context.Pipe()
    self.process = context.Process(
        target=_serve, name=f"nvdecode-{device.id}", daemon=True,
        args=(child, self.ordinal, self.count, size, threads, backends, self.jpegs.path,
              self.pixels and self.pixels.path))
    self.process.start()
    child.close()
    self.source, self.cut = None, collections.deque()  # cut: per batch in flight, the rows it could not send

  def connect(self) -> None:
    """Waits for the process to start; maps its output buffer and allocates this device's batch buffers (CUDA)."""
    try:
      if not self.conn.poll(START_S):
        raise DataError(f"the decoding process of {self.device} did not start in {START_S} s")
      handle = self._receive()
    finally:  # both processes have mapped them, or it has failed: no name is left behind
      self._unlink()
    if self.ordinal is None:
      return
    self.cuda = _cuda_runtime()
    self.source = self.cuda.open_ipc(self.ordinal, handle)
    self.stream = self.cuda.stream(self.ordinal)
    self.slots = [jax.device_put(np.zeros((self.count, self.size, self.size, 3), np.uint8), self.device)
                  for _ in range(SLOTS)]
    self.copies, self.done = [None] * SLOTS, 0

  def _exited(self) -> DataError:
    self.process.join(5)
    return DataError(f"the decoding process of {self.device} exited (code {self.process.exitcode})")

  def _receive(self):
    try:
      kind, value = self.conn.recv()
    except (EOFError, OSError):  # its end of the pipe is closed
      raise self._exited() from None
    if kind == "error":
      raise DataError(f"the decoding process of {self.device} failed: {value}")
    return value

  def submit(self, flat: np.ndarray, ends: np.ndarray, half: int) -> None:
    """Hands the process this device's rows of a batch, to decode in `half` of its buffers: JPEG bytes `flat`, row
    r's ending at ends[r] (empty rows are the host's). Rows past what the shared buffer holds (_jpeg_room:
    tiny images, whose headers outweigh their pixels) are sent empty and reported as failed (wait): the host
    decodes them."""
    begin = int(ends[self.rows.start - 1]) if self.rows.start else 0
    ends = ends[self.rows] - begin
    room = self.jpegs.array[half * self.room:][:self.room]
    fits = ends <= len(room)
    limit = int(ends[fits][-1]) if fits.any() else 0
    self.cut.append(np.flatnonzero(~fits & (np.diff(ends, prepend=0) > 0)).tolist())
    room[:limit] = flat[begin:begin + limit]
    try:
      self.conn.send(("decode", half, np.minimum(ends, limit)))
    except OSError:  # its end of the pipe is closed
      raise self._exited() from None

  def wait(self) -> tuple[list[int], float]:
    """The rows of the oldest batch submitted that the process failed to decode or was not sent, once it has
    decoded the others, and the seconds its decoding call took."""
    failed, seconds = self._receive()
    return sorted(failed + self.cut.popleft()), seconds

  def finish(self, rows: np.ndarray, images: np.ndarray, half: int) -> jax.Array:
    """This device's block: the rows decoded into `half`, with the host's `images` at `rows`. Those go over as one
    array and are scattered on the device: a copy per 196 KB row from pageable memory pays a transfer's overhead
    each."""
    block_bytes = self.count * self.row_bytes
    if self.ordinal is None:
      block = self.pixels.array[half * block_bytes:][:block_bytes].reshape(self.count, self.size, self.size, 3)
      block = block.copy()
      block[rows] = images
      return jax.device_put(block, self.device)
    k = self.done % SLOTS
    if self.copies[k] is not None:
      self.copies[k].block_until_ready()  # the last reader of this buffer is its copy
    self.cuda.copy_on_device(self.slots[k].unsafe_buffer_pointer(), self.source + half * block_bytes, block_bytes,
                             self.stream)
    self.cuda.synchronize(self.stream)  # from now on the process may decode into this half again
    rows, images = (jax.device_put(a, self.device) for a in (rows, images))
    self.copies[k] = _place(self.slots[k], rows, images)
    self.done += 1
    return self.copies[k]

  def close(self) -> None:
    if self.source is not None:
      self.cuda.close_ipc(self.source)
      self.source = None
    with contextlib.suppress(OSError):
      self.conn.send(("stop",))
    self.process.join(10)
    if self.process.is_alive():
      self.process.kill()
    self._unlink()

  def _unlink(self) -> None:
    for shared in (self.jpegs, self.pixels):
      if shared is not None:
        shared.unlink()


def _jpeg_room(count: int, size: int) -> int:
  """Bytes of shared memory for the JPEGs of `count` rows of size×size: half their pixels' bytes. The paper's store
  needs an eighth (23 KB for 196 KB); rows past it go to the host (submit)."""
  return count * size * size * 3 // 2


class _Shared:
  """Shared memory that a child process maps by path: a file in /dev/shm, unlinked once both have mapped it. Not
  multiprocessing.shared_memory: its resource tracker would unlink it when the child exits, and warn. The memory is
  reserved when made (a container's small /dev/shm gives one clear error here, not a bus error on first write)."""

  def __init__(self, size: int, path: str | None = None):
    if path is None:
      folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
      fd, path = tempfile.mkstemp(prefix="alexnet_jax_nvdecode_", dir=folder)
      try:
        os.posix_fallocate(fd, 0, size)
      except OSError as e:
        os.close(fd)
        os.unlink(path)
        raise DataError(f"decoding on the devices needs {size / 2**20:,.0f} MiB more of shared memory in {folder} "
                        f"({e.strerror}): give it more room (docker run --shm-size)") from None
    else:
      fd = os.open(path, os.O_RDWR)
    self.path, self.map = path, mmap.mmap(fd, size)
    os.close(fd)
    self.array = np.frombuffer(self.map, np.uint8)

  def unlink(self) -> None:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(self.path)


def _serve(conn, ordinal: int | None, n: int, size: int, threads: int, backends: str, jpeg_path: str,
           pixel_path: str | None):
  """A decoding process: for each ("decode", half, ends) it decodes the rows with bytes in that half of the shared
  JPEG buffer into the same half of its output (device `ordinal`'s memory, whose IPC handle it sends once started;
  shared host memory on CPU devices) and answers with the rows that failed, or with the error that stopped it.
  `backends`: 'all', nvImageCodec's own choice, or 'hardware', the GPU's JPEG engines for every image (load hint
  1) and the others for what they fail."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is the training process's to handle
  try:
    nv = require()
    block = n * size * size * 3
    jpegs = _Shared(IN_FLIGHT * _jpeg_room(n, size), jpeg_path).array.reshape(IN_FLIGHT, -1)
    threads = max(1, min(threads, (os.cpu_count() or 2) - 1))  # nvImageCodec warns of more, and takes fewer
    if ordinal is None:
      pixels = _Shared(IN_FLIGHT * block, pixel_path).array.reshape(IN_FLIGHT, n, size, size, 3)
      decoder = nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY, backends=[nv.Backend(nv.CPU_ONLY)],
                           max_num_cpu_threads=threads, options="")
      rows, stream, handle = [[nv.as_image(half[r]) for r in range(n)] for half in pixels], 0, None
    else:
      cuda = _cuda_runtime()
      pointer, handle = cuda.malloc_shared(ordinal, IN_FLIGHT * block)
      stream = cuda.stream(ordinal)
      # options="": the library's defaults, fancy chroma upsampling as libjpeg-turbo's (the binding's default is off)
      chosen = [nv.Backend(kind) for kind in (nv.HW_GPU_ONLY, nv.HYBRID_CPU_GPU, nv.CPU_ONLY)]
      decoder = nv.Decoder(device_id=ordinal, max_num_cpu_threads=threads, options="",
                           backends=chosen if backends == "hardware" else None)
      rows = [[nv.as_image(_Row(pointer + (half * n + r) * size * size * 3, size, stream)) for r in range(n)]
              for half in range(IN_FLIGHT)]
    conn.send(("ready", handle))
    while True:
      try:
        kind, *message = conn.recv()
      except EOFError:  # the training process has gone
        return
      if kind == "stop":
        return
      half, ends = message
      start_s = time.perf_counter()
      starts = np.concatenate([[0], ends[:-1]])
      todo = [r for r in range(len(ends)) if ends[r] > starts[r]]
      out = decoder.decode([nv.CodeStream(jpegs[half, starts[r]:ends[r]]) for r in todo],
                           images=[rows[half][r] for r in todo], cuda_stream=stream) if todo else []
      if ordinal is not None:
        cuda.synchronize(stream)
      conn.send(("done", ([r for r, image in zip(todo, out) if image is None], time.perf_counter() - start_s)))
  except Exception as e:  # noqa: BLE001  (starting or decoding: the training process raises it)
    conn.send(("error", f"{type(e).__name__}: {e}"))


@jax.jit
def _place(block, rows, images):
  """A copy of `block` that JAX owns, with `images` at `rows`."""
  return block.at[rows].set(images, unique_indices=True)


class _Row:
  """One S×S×3 row of a device buffer as nvImageCodec takes it (the CUDA array interface), on our stream."""

  def __init__(self, pointer: int, size: int, stream: int):
    self.__cuda_array_interface__ = dict(shape=(size, size, 3), typestr="|u1", data=(pointer, False), version=3,
                                         strides=None, stream=stream)


class _IpcHandle(ctypes.Structure):
  _fields_ = [("reserved", ctypes.c_char * 64)]  # cudaIpcMemHandle_t


class _CudaRuntime:
  """The few CUDA runtime calls that JAX does not offer: streams, waiting for them, copies on a device, and device
  memory shared between processes (CUDA IPC). The runtime is the one JAX's CUDA plugin brought (ctypes
  releases the GIL)."""

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

  def malloc_shared(self, ordinal: int, size: int) -> tuple[int, bytes]:
    """(pointer, IPC handle) of `size` bytes of device `ordinal`'s memory, for another process to map."""
    self._check(self.lib.cudaSetDevice(ordinal), "cudaSetDevice")
    pointer, handle = ctypes.c_void_p(), _IpcHandle()
    self._check(self.lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size)), "cudaMalloc")
    self._check(self.lib.cudaIpcGetMemHandle(ctypes.byref(handle), pointer), "cudaIpcGetMemHandle")
    return pointer.value, bytes(handle)

  def open_ipc(self, ordinal: int, handle: bytes) -> int:
    self._check(self.lib.cudaSetDevice(ordinal), "cudaSetDevice")
    pointer = ctypes.c_void_p()
    self._check(self.lib.cudaIpcOpenMemHandle(ctypes.byref(pointer), _IpcHandle.from_buffer_copy(handle), 1),
                "cudaIpcOpenMemHandle")  # 1: cudaIpcMemLazyEnablePeerAccess
    return pointer.value

  def close_ipc(self, pointer: int) -> None:
    self._check(self.lib.cudaIpcCloseMemHandle(ctypes.c_void_p(pointer)), "cudaIpcCloseMemHandle")

  def copy_on_device(self, target: int, source: int, size: int, stream: int) -> None:
    self._check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(target), ctypes.c_void_p(source), ctypes.c_size_t(size),
                                         3, ctypes.c_void_p(stream)),  # device to device
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
