"""Batches from worker processes through rings of shared memory (data/rings.py): where they lie, when a slot is
free again, and what happens without one."""

import gc
import glob
import logging
import os

import numpy as np

from alexnet_jax.data import rings

SHAPE = (4, 8, 8, 3)


def test_a_slot_is_free_again_only_once_the_last_view_of_its_batch_is_gone():
  reader = rings.Reader()
  worker = rings.Worker(reader.tag)  # this process as the worker: the two share the ring only through its file
  assert worker.empty((0, *SHAPE[1:]), np.uint8).size == 0 and worker.ring is None  # sized by a batch with rows
  images = worker.empty(SHAPE, np.uint8)
  images[...] = np.arange(images.size).reshape(SHAPE)
  batch = dict(image=worker.slot(images), label=np.arange(4))
  assert isinstance(batch["image"], rings.Slot)
  received = reader.received(batch)
  assert not os.path.exists(batch["image"].path)  # removed once both have mapped it
  np.testing.assert_array_equal(received["image"], images)
  np.testing.assert_array_equal(received["label"], np.arange(4))
  state = worker.ring.state[batch["image"].index]
  row = received["image"][1]
  del received
  gc.collect()
  assert worker.ring.state[batch["image"].index] == state == 1  # a row of it is still held
  del row
  gc.collect()
  assert worker.ring.state[batch["image"].index] == 0
  reader.close()


def test_a_worker_whose_slots_are_all_held_or_too_small_sends_its_own_arrays():
  reader = rings.Reader()
  worker = rings.Worker(reader.tag)
  held = [worker.empty(SHAPE, np.uint8) for _ in range(rings.SLOTS)]
  assert all(isinstance(worker.slot(a), rings.Slot) for a in held)
  for extra in (worker.empty(SHAPE, np.uint8), worker.empty((8, *SHAPE[1:]), np.uint8),
                worker.empty((0, *SHAPE[1:]), np.uint8)):
    assert worker.slot(extra) is extra  # sent as Grain sends any array
  reader.close()
  assert not glob.glob(f"{rings.ring_prefix(reader.tag)}*")  # the ring never mapped, removed all the same


def test_without_a_ring_a_worker_says_so_once_and_decodes_into_its_own_memory(tmp_path, monkeypatch, caplog):
  monkeypatch.setattr(rings, "ring_prefix", lambda tag: str(tmp_path / "missing" / tag))
  worker = rings.Worker("x")
  with caplog.at_level(logging.WARNING):
    arrays = [worker.empty(SHAPE, np.uint8) for _ in range(3)]
  assert [worker.slot(a) is a for a in arrays] == [True] * 3
  assert len([r for r in caplog.records if "no ring" in r.getMessage()]) == 1
