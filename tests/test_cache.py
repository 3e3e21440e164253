"""The caches of decoded images (data/cache.py), on the devices and in the host's memory: the batches they assemble
are the decoded ones, image for image and label for label, from a fresh start and a resume, whether a batch's rows
lie on every device or are split over them; the host decodes only what the cache does not hold; a run trains the
same with either."""

import functools
import io

import jax
import numpy as np
import pytest
from PIL import Image
from test_reliability import tiny_config

from alexnet_jax.config import paper_config, validate
from alexnet_jax.data import DataError, cache, procedural, train_batches
from alexnet_jax.data.pipeline import make_dataset
from alexnet_jax.data.device_batches import BatchLayout
from alexnet_jax.network import sharding
from alexnet_jax.training import loop

SIZE, N, BATCH, SLOTS = 24, 20, 8, 13  # 24×24 stored images, 20 of them, batches of 8, 13 cached


class Jpegs:
  """A store-like source: {'jpeg', 'label'} examples of SIZE×SIZE JPEGs; example 5 unreadable (its rows hold the
  next one, which the cache must then hold under slot 5 too)."""

  resize, statistics = SIZE, None

  def __init__(self):
    self.examples = []
    for i in range(N):
      pixels, _ = procedural.generate(0, "train", i, 1, 32)
      out = io.BytesIO()
      Image.fromarray((pixels[0, :SIZE, :SIZE] * 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
      self.examples.append(dict(jpeg=out.getvalue()[:100] if i == 5 else out.getvalue(), label=i % 3))

  def __len__(self):
    return len(self.examples)

  def __getitem__(self, i):
    return self.examples[i]


@pytest.fixture(scope="module")
def dataset():
  source, config = Jpegs(), paper_config()
  config.image_size = 16
  config.dataset.update(dict(name="store", resize=SIZE, threads=2))
  return make_dataset(config, source, source, ("a", "b", "c"))


MESHES = {"rows on both devices": (2, 1, ("data",)), "rows split over 'data'": (1, 2, ("data",)),
          "rows split over 'model'": (2, 1, ("data", "model"))}


PUTS = {"device": cache.CachedPut, "sharded": functools.partial(cache.CachedPut, sharded=True),
        "host": cache.HostCachedPut}


@pytest.mark.parametrize("where", PUTS.values(), ids=PUTS.keys())
@pytest.mark.parametrize("mesh", MESHES.values(), ids=MESHES.keys())
@pytest.mark.parametrize("start", [0, 3], ids=["fresh", "resumed mid-epoch"])
def test_cached_batches_are_the_decoded_ones(dataset, mesh, start, where):
  model, data, axes = mesh
  rows = BatchLayout(sharding.make_mesh(model, data), axes)
  rule = cache.Schedule(SLOTS, N, BATCH, rows.blocks, start)
  cached = train_batches(dataset, BATCH, rows=rows.process_rows(BATCH), cached=rule)
  plain = train_batches(dataset, BATCH)
  put = where(rows, SIZE, 16, rule)
  read_from_cache = 0
  for step in range(start, start + 14):  # 112 rows: the fill, then more than three epochs
    host, skipped = cached[step]
    want, want_skipped = plain[step]
    got, _ = put.put(host)()
    assert list(got) == list(want) and got["image"].sharding == rows.sharding(4)
    for k in want:
      np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=f"{k} of step {step}")
    decoded = host["decoded"] >= 0
    held = (host["index"] < SLOTS) & (step * BATCH + np.arange(BATCH) >= rule.fill_end)
    np.testing.assert_array_equal(decoded, ~held)  # the host decodes exactly what the cache does not give
    assert skipped == (want_skipped if decoded.all() else int(5 in host["index"][decoded]))
    read_from_cache += int(held.sum())
  assert read_from_cache > 3 * BATCH
  if where is PUTS["sharded"]:  # each device holds its row block's share of the slots, and only that
    shares = {s.data.shape[0] for s in put.images.addressable_shards}
    assert shares == {-(-SLOTS // rows.blocks)}, shares
  images = np.asarray(put.images)
  substitute = {5: 6}  # the unreadable example's rows hold the next one's image and label
  for i in range(SLOTS):
    image, label, _ = dataset.train.rows([substitute.get(i, i)])
    np.testing.assert_array_equal(images[i], image[0])
    assert np.asarray(put.labels)[i] == label[0]


def test_rule_fills_from_the_start_through_the_first_whole_epoch():
  fresh, resumed = cache.Schedule(13, 20, 8, 1, 0), cache.Schedule(13, 20, 8, 1, 3)
  # Resumed at row 24, a run decodes the rest of that epoch and the whole next one (rows 40…59).
  assert fresh.fill_end == 20 and resumed.fill_end == 60
  assert fresh.writes(2) and not fresh.writes(3) and resumed.writes(7) and not resumed.writes(8)
  # Step 2 holds rows 16…23: the first four end the filling epoch; of the others, those with a slot are read.
  np.testing.assert_array_equal(fresh.cached(2, np.array([0, 1, 2, 3, 4, 5, 17, 18])), [0, 0, 0, 0, 1, 1, 0, 0])
  assert not resumed.cached(6, np.arange(8)).any() and resumed.cached(7, np.arange(8)).sum() == 4
  assert [fresh.padded(k) for k in (0, 1, 2, 8)] == [1, 1, 2, 8]
  assert [cache.Schedule(0, 2000, 512, 2, 0).padded(k) for k in (0, 1, 33, 256)] == [1, 32, 64, 256]


def test_the_sharded_cache_holds_its_bytes_on_each_of_its_shards():
  mesh = sharding.make_mesh(1, 2)
  assert cache.slots(10 * cache.image_bytes(32), 320, 32, mesh, 0) == 10
  assert cache.slots(10 * cache.image_bytes(32), 320, 32, mesh, 0, shards=2) == 20
  assert cache.slots(200 * cache.image_bytes(32), 320, 32, mesh, 0, shards=2) == 320  # at most the split


def test_the_host_cache_holds_what_its_bytes_or_the_host_s_memory_allow():
  assert cache.host_slots(10 * cache.image_bytes(32), 320, 32) == 10
  assert cache.host_slots(0, 320, 32) == 320  # 320 KB of images: far below 3/4 of any host's available memory


def test_a_run_trains_the_same_with_half_the_images_cached(tmp_path, capsys):
  config = tiny_config(num_epochs=2.0)  # 10 steps an epoch: the fill, then an epoch that reads half from the cache
  plain = loop.train_and_evaluate(config, str(tmp_path / "plain"))
  half = 160 * cache.image_bytes(config.image_size)
  for where, said in (("device", "on each device"), ("host", "in this process's memory")):
    config.dataset.update(dict(cache=where, cache_bytes=half))
    cached = loop.train_and_evaluate(config, str(tmp_path / where))
    assert f"cache: 160 of 320 training images {said}" in capsys.readouterr().out
    assert cached == plain, where


def test_a_run_trains_the_same_with_the_cache_sharded_over_the_data_axis(tmp_path, capsys):
  config = tiny_config(num_epochs=2.0)
  config.mesh.update(dict(model=1, data=2))  # the batch's rows split over two devices: a block of the cache on each
  plain = loop.train_and_evaluate(config, str(tmp_path / "plain"))
  quarter = 80 * cache.image_bytes(config.image_size)  # on each device: half the images over the two
  config.dataset.update(dict(cache="sharded", cache_bytes=quarter))
  sharded = loop.train_and_evaluate(config, str(tmp_path / "sharded"))
  assert "cache: 160 of 320 training images over 2 devices' memory (a block on each)" in capsys.readouterr().out
  assert sharded == plain


def test_a_cache_that_cannot_be_sized_or_kept_is_refused_in_one_line():
  config = tiny_config()
  config.dataset.update(dict(cache="device", decoder="gpu"))
  with pytest.raises(ValueError, match="cache='device' keeps images the host decoded"):
    validate(config)
  config.dataset.cache = "host"
  with pytest.raises(ValueError, match="cache='host' keeps images the host decoded"):
    validate(config)
  config.dataset.cache = "device"
  config.dataset.decoder = "cpu"
  with pytest.raises(DataError, match="do not report their memory: set config.dataset.cache_bytes"):
    cache.slots(config.dataset.cache_bytes, 320, 32, sharding.make_mesh(2, 1), 0)
  assert jax.devices()[0].memory_stats() is None  # why the CPU devices need cache_bytes


def test_a_cached_batch_with_crops_outside_the_images_is_refused(dataset):
  rows = BatchLayout(sharding.make_mesh(2, 1), ("data",))
  rule = cache.Schedule(SLOTS, N, BATCH, 1, 0)
  host, _ = train_batches(dataset, BATCH, cached=rule)[0]
  host["offset"] = host["offset"] + SIZE  # XLA would clamp such a crop silently
  with pytest.raises(ValueError, match="crop offsets must lie in"):
    cache.CachedPut(rows, SIZE, 16, rule).put(host)


@pytest.mark.parametrize("mesh", MESHES.values(), ids=MESHES.keys())
def test_host_cache_puts_a_batch_in_parts_and_joins_it_on_the_devices(mesh):
  # The host cache's buffer holds a batch chunk-major, each part a share of every row block, put on its own and joined
  # on the devices: the joined batch must be the batch, each device holding its rows.
  model, data, axes = mesh
  rows = BatchLayout(sharding.make_mesh(model, data), axes)
  batch = np.arange(16 * 2 * 2 * 3, dtype=np.uint8).reshape(16, 2, 2, 3)
  per_block = 16 // rows.blocks
  for chunks in (1, 2, 4):
    buffer = np.empty_like(batch)
    buffer[cache._chunk_major(16, per_block, chunks)] = batch
    parts = [jax.make_array_from_process_local_data(rows.sharding(4), p) for p in np.split(buffer, chunks)]
    joined = cache._joined(rows)(*parts)
    assert joined.sharding == rows.sharding(4)
    np.testing.assert_array_equal(np.asarray(joined), batch)
