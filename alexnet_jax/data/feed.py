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
  ('put'), waiting for the loop to take them ('loop'), up to the moment it is read, the part under way included:
  a benchmark reads it over a window of a few steps, and one put or wait across the window's end would otherwise
  go uncounted or count whole."""

  def __init__(self, host_batches, batch_placer):
    self._host, self._placer = host_batches, batch_placer
    self._ready = queue.Queue(AHEAD * batch_placer.group)
    self._stop = threading.Event()
    self._seconds = dict(host=0.0, put=0.0, loop=0.0)
    self._lock = threading.Lock()  # the thread's state and its start, against `seconds` read from another thread
    self._state, self._since = "host", time.perf_counter()
    self._thread = threading.Thread(target=self._run, name="feed", daemon=True)
    self._thread.start()

  def _run(self):
    pending = collections.deque()  # (finish, skipped) of the batches put and not yet finished, oldest first
    try:
      while not self._stop.is_set():
        self._enter("host")
        taken = []
        try:
          while len(taken) < self._placer.group:
            taken.append(next(self._host))
        finally:  # an error midway: the batches taken before it are put, and reach the loop before the error
          self._enter("put")
          if taken:
            pending.append((self._placer.put([batch for batch, _ in taken]), [skipped for _, skipped in taken]))
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
    self._enter("put")
    done = finish()
    for (on_device, more), before in zip(done, skipped, strict=True):
      self._offer((on_device, before + more))

  def _offer(self, item) -> None:
    self._enter("loop")
    while not self._stop.is_set():
      try:
        self._ready.put(item, timeout=0.01)
        return
      except queue.Full:
        continue

  def _enter(self, state: str) -> None:
    """The thread's time since its last state goes to that state; from now on it is in `state`."""
    now = time.perf_counter()
    with self._lock:
      self._seconds[self._state] += now - self._since
      self._state, self._since = state, now

  @property
  def seconds(self) -> dict:
    with self._lock:
      seconds = dict(self._seconds)
      seconds[self._state] += time.perf_counter() - self._since
    return seconds

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
