"""The host memory that the host cache's images and its batches' buffers live in (cache.HostCachedPut): the cache's
pages asked for from the start, the buffers used again and, on GPUs, mapped for the devices' DMA."""

import collections
import ctypes
import math
import mmap
import threading
import time

import jax
import numpy as np

BUFFERS = 3  # the host cache's batch buffers, each used again once its batch has crossed to the devices
MADV_POPULATE_WRITE = 23  # Linux 5.14: fault a range's pages in, writable, without touching their bytes


class Pages:
  """An uninitialised uint8 array of `shape` in anonymous memory, whose pages a thread of its own asks the system for
  from the start (madvise's MADV_POPULATE_WRITE, a step at a time, Python's lock let go), ahead of the first epoch's
  writes into it. Taken at the first write instead, each 4 KiB page is a fault in the copy threads of the first
  epoch, whose copies bound it, and on a machine whose memory grows as it is used, the host's growth too
  (docs/data.md). Writes need not wait: a page already written is left as it is. Where the system has no
  MADV_POPULATE_WRITE, pages are taken as written. `seconds`: how long the thread took, once it has."""

  STEP = 1 << 28  # bytes a call: close() waits for one at most

  def __init__(self, shape: tuple[int, ...]):
    self.nbytes = math.prod(shape)
    self.array = np.frombuffer(mmap.mmap(-1, max(self.nbytes, 1)), np.uint8, count=self.nbytes).reshape(shape)
    self.seconds = None
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._populate, name="host cache pages", daemon=True)
    self._thread.start()

  def _populate(self) -> None:
    start = time.perf_counter()
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes, madvise.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    address = self.array.ctypes.data
    for offset in range(0, self.nbytes, self.STEP):
      if self._stop.is_set() or madvise(address + offset, min(self.STEP, self.nbytes - offset), MADV_POPULATE_WRITE):
        return
    self.seconds = time.perf_counter() - start

  def close(self) -> None:
    self._stop.set()
    self._thread.join()


class Buffers:
  """The host buffers that batches cross to the devices from, each used again once the batch placed from it is on
  the devices: fresh memory for each batch would be paged in (and zeroed) every step, which costs more than the copy.
  Where the devices can read host memory directly (a GPU's DMA: client.dma_map), BUFFERS of a whole batch's rows are
  mapped once and a put from one is a single copy that the devices make after the put returns, without the staging
  copy through pinned memory that a put from pageable memory takes, and which held the feed's thread for most of a
  step (docs/BENCHMARKS.md). CPU devices use none again: their arrays may be the host buffer itself (XLA:CPU takes
  aligned memory as it is)."""

  def __init__(self, device, row: tuple):
    self.device, self.row = device, row
    self.reuse = device.platform != "cpu"
    self.mapped = None  # the mapped buffers (None: not yet tried; []: this client cannot map)
    self._held = collections.deque()  # (buffer, the device array placed from it), oldest first
    self._taken = None

  def take(self, n: int, most: int) -> np.ndarray:
    """A buffer of n rows; `most`: the most any batch sends (this process's rows of a batch), which a mapped buffer
    holds."""
    if self.mapped is None and self.reuse:
      self.mapped = self._map(most)
    buffer = None
    if len(self._held) == BUFFERS:
      buffer, placed = self._held.popleft()
      jax.block_until_ready(placed)  # copied from the buffer long ago: this rarely waits
    if buffer is None or len(buffer) < n or (not self.mapped and len(buffer) != n):
      buffer = self.mapped[len(self._held)] if self.mapped else np.empty((n, *self.row), np.uint8)
    self._taken = buffer
    return buffer[:n]

  def placed(self, array) -> None:
    """The device array put from the buffer last taken."""
    if self.reuse:
      self._held.append((self._taken, array))

  def _map(self, rows: int) -> list[np.ndarray]:
    buffers = [np.frombuffer(mmap.mmap(-1, rows * math.prod(self.row)), np.uint8).reshape(rows, *self.row)
               for _ in range(BUFFERS)]  # page-aligned
    try:
      for b in buffers:
        self.device.client.dma_map(b.ctypes.data, b.nbytes)
    except jax.errors.JaxRuntimeError:  # this client cannot map: puts from pageable memory
      self._unmap(buffers)
      return []
    return buffers

  def _unmap(self, buffers) -> None:
    for b in buffers:
      try:
        self.device.client.dma_unmap(b.ctypes.data)
      except jax.errors.JaxRuntimeError:  # never mapped
        pass

  def close(self) -> None:
    for _, placed in self._held:
      jax.block_until_ready(placed)  # the devices may still be reading the buffer
    self._unmap(self.mapped or [])
