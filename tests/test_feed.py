"""The feed's thread (data/feed.py): the order of its puts and finishes, a placer's group of batches a put, what the
host and the devices skipped, an error in its thread raised after the batches before it, and where its time went."""

import threading
import time

import pytest

from alexnet_jax.data.feed import Feed


@pytest.mark.parametrize("group, order", [
    (1, ["put [0]", "put [1]", "finish [0]", "put [2]", "finish [1]", "put [3]", "finish [2]", "finish [3]"]),
    (3, ["put [0, 1, 2]", "put [3]", "finish [0, 1, 2]", "finish [3]"])])
def test_the_feed_puts_the_next_batches_before_it_finishes_the_last(group, order):
  # A put takes the placer's group of batches; where the host's batches end midway, the put takes those left.
  calls = []

  class Recorder:  # a batch_placer that records the order of its calls
    def __init__(self):
      self.group = group

    def put(self, batches):
      calls.append(f"put {batches}")

      def finish():
        calls.append(f"finish {batches}")
        return [(b, 1) for b in batches]
      return finish

    def close(self):
      calls.append("close")

  feed = Feed(iter([(b, b) for b in range(4)]), Recorder())
  assert [next(feed) for _ in range(4)] == [(0, 1), (1, 2), (2, 3), (3, 4)]  # skipped on the host and the device
  assert calls == order
  with pytest.raises(StopIteration):
    next(feed)
  assert set(feed.seconds) == {"host", "put", "loop"} and min(feed.seconds.values()) >= 0
  feed.close()
  assert calls[-1] == "close"


def test_the_feed_raises_the_error_of_its_thread():
  class Failing:  # a batch_placer that fails on batch 2
    group = 1

    def put(self, batches):
      if batches == [2]:
        raise ValueError("bad batch 2")
      return lambda: [(batches[0] * 10, 1)]

    def close(self):
      pass

  feed = Feed(iter([(0, 0), (1, 2), (2, 0)]), Failing())
  assert [next(feed), next(feed)] == [(0, 1), (10, 3)]
  with pytest.raises(ValueError, match="bad batch 2"):
    next(feed)
  feed.close()


def test_an_error_midway_through_a_group_comes_after_the_batches_taken_before_it():
  class Threes:  # a batch_placer that takes three batches a put
    group = 3

    def put(self, batches):
      return lambda: [(b, 0) for b in batches]

    def close(self):
      pass

  def host_batches():
    yield 0, 0
    yield 1, 0
    raise OSError("the store's disk went away")

  feed = Feed(host_batches(), Threes())
  assert [next(feed), next(feed)] == [(0, 0), (1, 0)]  # put as a group of two
  with pytest.raises(OSError, match="disk went away"):
    next(feed)
  feed.close()


def test_the_feed_s_seconds_count_the_wait_under_way_when_read():
  # A benchmark reads `seconds` at a window's two ends: a wait for the host that spans one must count up to the read,
  # and the thread's three shares together the whole time between two reads.
  release = threading.Event()

  class Instant:  # a batch_placer whose puts take no time
    group = 1

    def put(self, batches):
      return lambda: [(batches[0], 0)]

    def close(self):
      pass

  def host_batches():
    yield 0, 0
    yield 1, 0
    release.wait()  # the host's third batch is slow
    yield 2, 0

  feed = Feed(host_batches(), Instant())
  assert next(feed) == (0, 0)  # finished once the second was put
  time.sleep(0.05)  # the thread is now waiting for the host's third batch
  before, start = feed.seconds, time.perf_counter()
  time.sleep(0.3)
  after, elapsed = feed.seconds, time.perf_counter() - start
  waited = after["host"] - before["host"]
  assert 0.9 * elapsed < waited <= sum(after.values()) - sum(before.values()) < 1.1 * elapsed + 0.01
  release.set()
  assert [next(feed), next(feed)] == [(1, 0), (2, 0)]
  feed.close()
