"""Training batches onto the devices ahead of the steps that need them, from a thread of their own.

The training loop only dispatches steps; while the devices run them, this thread takes the next host batches, puts
them on the mesh (or has the devices decode them: nvdecode.py) and keeps AHEAD of them ready. Putting a batch from
the loop itself would stall every step for the copy; from this thread it overlaps the last step (docs/BENCHMARKS.md).
"""

import collections
import queue
import threading
import time

AHEAD = 2  # device batches ready: enough to cover one slow put, few enough to hold little device memory
IN_FLIGHT = 2  # batches put and not yet finished: the next is under way (decoding) while the last is collected


class Feed:
  """An iterator of (device batch, skipped) from the iterator `host_batches` of (host batch, skipped).
  `batch_placer.put(host batch)` (data.device_batches.HostPut, DevicePut) starts a batch on its way and returns
  `finish`, which returns (device batch, images skipped on the device); the next batch is put before the last is
  finished, so a put that hands its work to others (the decoding processes) overlaps with collecting the last. An
  exception in the thread is raised by next().
  `seconds` says where the thread's time went: waiting for host batches ('host'), putting and finishing them
  ('put'), waiting for the loop to take them ('loop')."""

  def __init__(self, host_batches, batch_placer):
    self._host, self._placer = host_batches, batch_placer
    self._ready = queue.Queue(AHEAD)
    self._stop = threading.Event()
    self.seconds = dict(host=0.0, put=0.0, loop=0.0)
    self._thread = threading.Thread(target=self._run, name="feed", daemon=True)
    self._thread.start()

  def _run(self):
    pending = collections.deque()  # (finish, skipped) of the batches put and not yet finished, oldest first
    try:
      while not self._stop.is_set():
        start = time.perf_counter()
        batch, skipped = next(self._host)
        put = time.perf_counter()
        pending.append((self._placer.put(batch), skipped))
        self.seconds["host"] += put - start
        self.seconds["put"] += time.perf_counter() - put
        if len(pending) == IN_FLIGHT:
          self._finish(*pending.popleft())
    except BaseException as e:  # noqa: BLE001  (handed to the loop, which raises it after the batches before it)
      try:
        while pending:
          self._finish(*pending.popleft())
      except BaseException as earlier:  # noqa: BLE001
        e = earlier
      self._offer(e)

  def _finish(self, finish, skipped: int) -> None:
    start = time.perf_counter()
    on_device, more = finish()
    self.seconds["put"] += time.perf_counter() - start
    self._offer((on_device, skipped + more))

  def _offer(self, item) -> None:
    while not self._stop.is_set():
      start = time.perf_counter()
      try:
        self._ready.put(item, timeout=0.01)  # counted as it goes: a benchmark reads `seconds` over a window
        return
      except queue.Full:
        continue
      finally:
        self.seconds["loop"] += time.perf_counter() - start

  def __iter__(self):
    return self

  def __next__(self):
    item = self._ready.get()
    if isinstance(item, BaseException):
      self._stop.set()
      raise item
    return item

  def close(self) -> None:
    """Stops the thread, then the host iterator's worker processes and the batch_placer's decoding processes, if any."""
    self._stop.set()
    self._thread.join()
    while not self._ready.empty():
      self._ready.get()
    getattr(self._host, "close", lambda: None)()
    self._placer.close()
