"""Training batches onto the devices ahead of the steps that need them, from a thread of their own.

The training loop only dispatches steps; while the devices run them, this thread takes the next host batches, puts
them on the mesh (or has the devices decode them: nvdecode.py) and keeps AHEAD of them ready. Putting a batch from
the loop itself would stall every step for the copy; from this thread it overlaps the last step (docs/BENCHMARKS.md).
"""

import collections
import queue
import threading
import time

AHEAD = 2  # puts' device batches ready: enough to cover one slow put, few enough to hold little device memory
IN_FLIGHT = 2  # puts not yet finished: the next is under way (decoding) while the last is collected


class Feed:
  """An iterator of (device batch, skipped) from the iterator `host_batches` of (host batch, skipped).
  `batch_placer.put(host batches)` (data.device_batches.HostPut, DevicePut, data.cache's) starts `batch_placer.group`
  consecutive batches on their way together and returns `finish`, which returns [(device batch, images skipped on
  the device)] for them; the next put comes before the last is finished, so a put that hands its work to others (the
  decoding processes) overlaps with collecting the last. A put of several batches pays the host's fixed costs of a
  put (Python, the GIL, a jit's dispatch) once for all of them (data/cache.py). An exception in the thread is raised
  by next(), after the batches taken before it.
  `seconds` says where the thread's time went: waiting for host batches ('host'), putting and finishing them
  ('put'), waiting for the loop to take them ('loop')."""

  def __init__(self, host_batches, batch_placer):
    self._host, self._placer = host_batches, batch_placer
    self._ready = queue.Queue(AHEAD * batch_placer.group)
    self._stop = threading.Event()
    self.seconds = dict(host=0.0, put=0.0, loop=0.0)
    self._thread = threading.Thread(target=self._run, name="feed", daemon=True)
    self._thread.start()

  def _run(self):
    pending = collections.deque()  # (finish, skipped) of the batches put and not yet finished, oldest first
    try:
      while not self._stop.is_set():
        start, taken = time.perf_counter(), []
        try:
          while len(taken) < self._placer.group:
            taken.append(next(self._host))
        finally:  # an error midway: the batches taken before it are put, and reach the loop before the error
          put = time.perf_counter()
          if taken:
            pending.append((self._placer.put([batch for batch, _ in taken]), [skipped for _, skipped in taken]))
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

  def _finish(self, finish, skipped: list[int]) -> None:
    start = time.perf_counter()
    done = finish()
    self.seconds["put"] += time.perf_counter() - start
    for (on_device, more), before in zip(done, skipped, strict=True):
      self._offer((on_device, before + more))

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
