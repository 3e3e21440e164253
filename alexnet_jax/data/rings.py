"""Decoded batches from worker processes through shared memory that stays mapped: each worker decodes a batch's
images straight into a slot of its own ring (a file in /dev/shm made once, SLOTS batches long) and sends the slot's
coordinates; the training process maps each ring once and hands on a view of the slot, which goes back to the worker
when the last reference to it is gone. A ring's file is removed once both have mapped it, or, if the training process
never did, when it closes the iterator, or by the worker as it ends with a killed training process (workers.py).

Why: Grain sends an array from a worker through a new shared-memory block each time, which the worker allocates
page by page as it copies the batch in, and the training process maps and frees again; a ring's pages are made
once (docs/BENCHMARKS.md, the host's batches alone). A worker whose slots are all still held, or a batch larger
than a slot, takes Grain's way: nothing ever waits on a slot.
"""

import contextlib
import dataclasses
import glob
import logging
import mmap
import os
import tempfile
import threading
import uuid
import weakref

import numpy as np

SLOTS = 8  # batches a worker can have in flight in its ring: decoding, queued, and held by the feed and caches
_FREE, _HELD = 0, 1


@dataclasses.dataclass(frozen=True)
class Slot:
  """What a worker sends in place of an array in its ring: the ring's file and where the array lies in it."""

  path: str
  index: int
  shape: tuple
  dtype: str


def ring_prefix(tag: str) -> str:
  """Where the rings of the workers of one iterator (`tag`) lie: the training process removes those it never
  mapped by this prefix, the workers' own process ids after it."""
  folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
  return os.path.join(folder, f"alexnet_jax_batches_{tag}_")


class _Ring:
  """A worker's ring: SLOTS slots of `slot_bytes` after a header of one state byte each (held or free). The worker
  sets a free slot held as it takes it; the training process sets it free when done with it."""

  def __init__(self, path: str, slot_bytes: int):
    self.path, self.slot_bytes, self.next = path, slot_bytes, 0
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
      os.posix_fallocate(fd, 0, _header() + SLOTS * slot_bytes)  # all the ring's pages, once
      self.map = mmap.mmap(fd, _header() + SLOTS * slot_bytes)
    except OSError:
      os.unlink(path)
      raise
    finally:
      os.close(fd)
    self.state = np.frombuffer(self.map, np.uint8, SLOTS)

  def empty(self, shape: tuple, dtype) -> np.ndarray | None:
    """An uninitialised array in a free slot, marked held; None if every slot is held or it does not fit."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes > self.slot_bytes:
      return None
    for k in range(SLOTS):
      index = (self.next + k) % SLOTS
      if self.state[index] == _FREE:
        self.state[index] = _HELD
        self.next = (index + 1) % SLOTS
        return np.ndarray(shape, dtype, self.map, _header() + index * self.slot_bytes)
    return None


def _header() -> int:
  return mmap.PAGESIZE  # the slots start page-aligned


class Worker:
  """This worker process's ring, made with the first batch it decodes (slot_bytes: that batch's images)."""

  def __init__(self, tag: str):
    self.path, self.ring, self.failed = f"{ring_prefix(tag)}{os.getpid()}", None, False
    self.lock = threading.Lock()  # the worker's threads build batches side by side

  def empty(self, shape: tuple, dtype) -> np.ndarray:
    if not np.prod(shape):  # no rows to decode (all cached): nothing to size a ring by
      return np.empty(shape, dtype)
    with self.lock:
      if self.ring is None and not self.failed:
        try:
          self.ring = _Ring(self.path, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        except OSError as e:  # e.g. a container's small /dev/shm: Grain's own blocks, which it needs anyway
          self.failed = True
          logging.warning("batches from this worker come through Grain's shared memory: no ring of %d batches at "
                          "%s (%s)", SLOTS, self.path, e.strerror)
      array = self.ring.empty(shape, dtype) if self.ring is not None else None
    return np.empty(shape, dtype) if array is None else array

  def slot(self, value):
    if self.ring is None or not isinstance(value, np.ndarray) or not _within(value, self.ring.map):
      return value
    offset = value.__array_interface__["data"][0] - _address(self.ring.map) - _header()
    return Slot(self.path, offset // self.ring.slot_bytes, value.shape, value.dtype.str)


_worker: Worker | None = None  # set in a worker process (serve)


def serve(tag: str) -> None:
  """In a worker process of the iterator `tag` (Reader.tag): batch images from empty() lie in its ring."""
  global _worker
  _worker = Worker(tag)


def leave() -> None:
  """In a worker whose training process has gone: its ring's file removed, if that process never mapped it."""
  if _worker is not None:
    _remove(_worker.path)


def empty(shape: tuple, dtype=np.uint8) -> np.ndarray:
  """An uninitialised array for a batch's images: in a worker that serves, in its ring where a slot is free."""
  return np.empty(shape, dtype) if _worker is None else _worker.empty(shape, dtype)


def sent(batch: dict) -> dict:
  """`batch` as a worker sends it: each array that lies in its ring replaced by its Slot."""
  return batch if _worker is None else {key: _worker.slot(value) for key, value in batch.items()}


def _address(buffer) -> int:
  return np.frombuffer(buffer, np.uint8, 1).__array_interface__["data"][0]


def _within(array: np.ndarray, buffer) -> bool:
  start = _address(buffer)
  return array.flags.c_contiguous and start <= array.__array_interface__["data"][0] < start + len(buffer)


class Reader:
  """The training process's side of one iterator's workers: each ring mapped once (its file removed once mapped),
  slots handed on as views that free their slot when the last reference to them is gone; close() removes the files
  of rings never mapped."""

  def __init__(self):
    self.tag, self.maps = uuid.uuid4().hex[:12], {}
    self.close = weakref.finalize(self, _remove_rings, self.tag)  # at close(), or at exit without one

  def received(self, batch: dict) -> dict:
    return {key: self._view(value) if isinstance(value, Slot) else value for key, value in batch.items()}

  def _view(self, slot: Slot) -> np.ndarray:
    if slot.path not in self.maps:
      with open(slot.path, "r+b") as f:
        self.maps[slot.path] = mmap.mmap(f.fileno(), 0)
      _remove(slot.path)
    ring = self.maps[slot.path]
    slot_bytes = (len(ring) - _header()) // SLOTS
    # An array on the map itself, not a view of one: any view of it holds it (numpy's base), so the slot is freed
    # only once they are all gone.
    view = np.ndarray(slot.shape, slot.dtype, ring, _header() + slot.index * slot_bytes)
    state = np.frombuffer(ring, np.uint8, SLOTS)
    weakref.finalize(view, state.__setitem__, slot.index, _FREE)
    return view


def _remove_rings(tag: str) -> None:
  for path in glob.glob(f"{ring_prefix(tag)}*"):
    _remove(path)


def _remove(path: str) -> None:
  with contextlib.suppress(FileNotFoundError):
    os.unlink(path)
