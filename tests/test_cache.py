"""The caches of decoded images (data/cache.py), on the devices, in the host's memory and in both (tiered): the
batches they assemble are the decoded ones, image for image and label for label, from a fresh start and a resume,
whether a batch's rows lie on every device or are split over them; the host decodes only what the cache does not
hold; each tier is sized by its own key; a run trains the same with any."""

import concurrent.futures
import ctypes
import io
import os
import threading
import time

import jax
import numpy as np
import pytest
from PIL import Image
from test_reliability import tiny_config

from alexnet_jax.config import paper_config, validate
from alexnet_jax.data import DataError, cache, procedural, train_batches
from alexnet_jax.data.input import cache_schedule
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


KINDS = ("device", "sharded", "host", "tiered")
ON_DEVICES = 6  # 'tiered': slots 0…5 on the devices, 6…12 in the host's memory, the other 7 images decoded


def schedule(kind: str, blocks: int, start: int) -> cache.Schedule:
  return cache.Schedule(SLOTS, N, BATCH, blocks, start, device_slots=ON_DEVICES if kind == "tiered" else 0)


def held(put) -> tuple[np.ndarray, np.ndarray]:
  """The images and labels of the SLOTS slots, from whichever tiers hold them."""
  tiers = [put.devices, put] if isinstance(put, cache.TieredCachedPut) else [put]
  images = np.concatenate([np.asarray(t.images)[:t.rule.slots - t.rule.device_slots] for t in tiers])
  labels = np.concatenate([np.asarray(t.labels)[:t.rule.slots - t.rule.device_slots] for t in tiers])
  return images, labels


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mesh", MESHES.values(), ids=MESHES.keys())
@pytest.mark.parametrize("start", [0, 3], ids=["fresh", "resumed mid-epoch"])
def test_cached_batches_are_the_decoded_ones(dataset, mesh, start, kind):
  model, data, axes = mesh
  rows = BatchLayout(sharding.make_mesh(model, data), axes)
  rule = schedule(kind, rows.blocks, start)
  cached = train_batches(dataset, BATCH, rows=rows.process_rows(BATCH), cached=rule)
  plain = train_batches(dataset, BATCH)
  put = cache.cached_put(kind, rows, SIZE, 16, rule)
  assert type(put) is {"host": cache.HostCachedPut, "tiered": cache.TieredCachedPut}.get(kind, cache.CachedPut)
  read_from_cache = 0
  for step in range(start, start + 14):  # 112 rows: the fill, then more than three epochs
    host, skipped = cached[step]
    want, want_skipped = plain[step]
    (got, _), = put.put([host])()
    assert list(got) == list(want) and got["image"].sharding == rows.sharding(4)
    for k in want:
      np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=f"{k} of step {step}")
    decoded = host["decoded"] >= 0
    held_rows = (host["index"] < SLOTS) & (step * BATCH + np.arange(BATCH) >= rule.fill_end)
    np.testing.assert_array_equal(decoded, ~held_rows)  # the host decodes exactly what the cache does not give
    assert skipped == (want_skipped if decoded.all() else int(5 in host["index"][decoded]))
    read_from_cache += int(held_rows.sum())
  assert read_from_cache > 3 * BATCH
  on_devices = {"sharded": SLOTS, "tiered": ON_DEVICES}.get(kind)
  if on_devices:  # each device holds its row block's share of the device's slots, and only that
    shares = {s.data.shape[0] for s in (put.devices if kind == "tiered" else put).images.addressable_shards}
    assert shares == {-(-on_devices // rows.blocks)}, shares
  images, labels = held(put)
  substitute = {5: 6}  # the unreadable example's rows hold the next one's image and label
  for i in range(SLOTS):
    image, label, _ = dataset.train.rows([substitute.get(i, i)])
    np.testing.assert_array_equal(images[i], image[0])
    assert labels[i] == label[0]


@pytest.mark.parametrize("kind", ("host", "tiered"))
@pytest.mark.parametrize("start", [0, 3], ids=["fresh", "resumed mid-epoch"])
@pytest.mark.parametrize("group", [1, 3], ids=["a batch a put", "three batches a put"])
def test_batches_put_before_the_last_is_finished_are_the_decoded_ones(dataset, start, kind, group):
  # The feed puts the next batches before it finishes the last; here every put comes first: the copies of later
  # batches run while earlier ones wait, and still read the images that earlier ones wrote into the cache. Three
  # batches a put: puts that write, that read, and (resumed) one that does both, batch after batch within it; the last
  # put holds two batches, as where the host's batches ended midway.
  rows = BatchLayout(sharding.make_mesh(1, 2), ("data",))
  rule = schedule(kind, rows.blocks, start)
  cached = train_batches(dataset, BATCH, rows=rows.process_rows(BATCH), cached=rule)
  plain = train_batches(dataset, BATCH)
  put = cache.cached_put(kind, rows, SIZE, 16, rule)
  assert put.group == cache.GROUP_ROWS // BATCH  # all of a batch's rows are this process's
  steps = range(start, start + 14)
  finishes = [put.put([cached[step][0] for step in steps[i:i + group]]) for i in range(0, len(steps), group)]
  got = [batch for finish in finishes for batch, _ in finish()]
  assert len(got) == len(steps)
  for step, batch in zip(steps, got):
    assert list(batch) == ["image", "offset", "flip", "shift", "label"], list(batch)
    for k, want in plain[step][0].items():
      assert batch[k].sharding == rows.sharding(want.ndim), k
      np.testing.assert_array_equal(np.asarray(batch[k]), want, err_msg=f"{k} of step {step}")
  put.close()


@pytest.mark.parametrize("kind", ("host", "tiered"))
def test_the_host_tier_is_written_behind_the_feed_and_read_once_written(dataset, kind):
  # The first epoch's writes into the host tier run on threads of their own: a put that writes returns before they
  # have, and a put that reads the tier waits for them.
  rows = BatchLayout(sharding.make_mesh(1, 2), ("data",))
  rule = schedule(kind, rows.blocks, 0)
  cached = train_batches(dataset, BATCH, rows=rows.process_rows(BATCH), cached=rule)
  plain = train_batches(dataset, BATCH)
  put = cache.cached_put(kind, rows, SIZE, 16, rule)
  held_back = threading.Event()
  for _ in range(cache.WRITE_THREADS):
    put._writes.submit(held_back.wait)
  reads = next(step for step in range(N) if cached[step][0]["decoded"].min() < 0)  # the first batch read from it
  assert 1 < reads <= cache.WRITES_AHEAD and all(rule.writes(step) for step in range(reads))
  finishes = [put.put([cached[step][0]]) for step in range(reads)]
  assert not put.images.any()  # nothing written yet: fresh anonymous memory is zeros
  reader = concurrent.futures.ThreadPoolExecutor(1)
  reading = reader.submit(put.put, [cached[reads][0]])
  time.sleep(0.5)
  assert not reading.done()
  held_back.set()
  finishes.append(reading.result(timeout=60))
  for step, finish in enumerate(finishes):
    (got, _), = finish()
    for k, want in plain[step][0].items():
      np.testing.assert_array_equal(np.asarray(got[k]), want, err_msg=f"{k} of step {step}")
  reader.shutdown()
  put.close()


class Counted(Jpegs):
  """Jpegs that note every example read: each is read to be decoded."""

  def __init__(self):
    super().__init__()
    self.read = []  # appended from the decoding threads: list.append holds the interpreter's lock

  def __getitem__(self, i):
    self.read.append(i)
    return super().__getitem__(i)


@pytest.mark.parametrize("start", [0, 3], ids=["fresh", "resumed mid-epoch"])
def test_after_the_fill_no_image_of_either_tier_is_decoded(start):
  source, config = Counted(), paper_config()
  config.image_size = 16
  config.dataset.update(dict(name="store", resize=SIZE, threads=2))
  counted = make_dataset(config, source, source, ("a", "b", "c"))
  rows = BatchLayout(sharding.make_mesh(1, 2), ("data",))
  rule = schedule("tiered", rows.blocks, start)
  batches = train_batches(counted, BATCH, rows=rows.process_rows(BATCH), cached=rule)  # what a worker builds
  put = cache.cached_put("tiered", rows, SIZE, 16, rule)
  plain = train_batches(counted, BATCH)
  tiers = {"devices": 0, "host": 0}
  for step in range(start, start + 14):
    source.read.clear()
    host, _ = batches[step]
    read = sorted(source.read)
    if step * BATCH >= rule.fill_end:  # wholly after the fill: only the images without a slot are read
      assert read == sorted(i for i in host["index"].tolist() if i >= SLOTS), (step, read)
      tiers["devices"] += int((host["index"] < ON_DEVICES).sum())
      tiers["host"] += int(((host["index"] >= ON_DEVICES) & (host["index"] < SLOTS)).sum())
    (got, _), = put.put([host])()
    np.testing.assert_array_equal(np.asarray(got["image"]), plain[step][0]["image"])  # and still the batch
  assert min(tiers.values()) > BATCH  # both tiers read, each more than a batch's worth of rows


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


def never():
  raise AssertionError("the device tier's bytes were given: the step's memory is not asked")


@pytest.mark.parametrize("host_bytes, in_host", [(5, 5), (100, 14), (0, 14)], ids=["5 images", "more than the rest",
                                                                                  "the host's memory"])
def test_the_tiered_cache_sizes_its_device_tier_from_cache_bytes_and_its_host_tier_from_host_cache_bytes(
    dataset, capsys, host_bytes, in_host):
  config = paper_config()
  config.batch_size = BATCH
  config.dataset.update(dict(cache="tiered", cache_bytes=3 * cache.image_bytes(SIZE),
                             host_cache_bytes=host_bytes * cache.image_bytes(SIZE)))
  rows = BatchLayout(sharding.make_mesh(1, 2), ("data",))  # two row blocks: 3 images on each, 6 on the devices
  rule = cache_schedule(config, dataset, rows, 100, 0, step_memory=never)
  assert (rule.device_slots, rule.slots, rule.tiered) == (6, 6 + in_host, True)  # the host tier: at most the rest
  said = capsys.readouterr().out
  assert said.startswith(f"cache: {6 + in_host} of 20 training images: 6 over 2 devices' memory (a block on each) "
                         f"(0.0 GiB), {in_host} in this process's memory (0.0 GiB), {14 - in_host} decoded every "
                         "epoch; read there from step 2"), said
  config.dataset.update(dict(cache="host", cache_bytes=0))  # the host cache: from the same key
  assert cache_schedule(config, dataset, rows, 100, 0, step_memory=never).slots == (min(20, host_bytes) or 20)


def test_a_run_trains_the_same_with_half_the_images_cached(tmp_path, capsys):
  config = tiny_config(num_epochs=2.0)  # 10 steps an epoch: the fill, then an epoch that reads half from the cache
  plain = loop.train_and_evaluate(config, str(tmp_path / "plain"))
  half = 160 * cache.image_bytes(config.image_size)
  for where, size, said in (("device", dict(cache_bytes=half), "on each device"),
                            ("host", dict(cache_bytes=0, host_cache_bytes=half), "in this process's memory")):
    config.dataset.update(dict(cache=where, **size))
    cached = loop.train_and_evaluate(config, str(tmp_path / where))
    assert f"cache: 160 of 320 training images {said}" in capsys.readouterr().out
    assert cached == plain, where


def test_a_run_trains_the_same_with_the_cache_sharded_or_tiered_over_the_data_axis(tmp_path, capsys):
  config = tiny_config(num_epochs=2.0)
  config.mesh.update(dict(model=1, data=2))  # the batch's rows split over two devices: a block of the cache on each
  plain = loop.train_and_evaluate(config, str(tmp_path / "plain"))
  quarter = 80 * cache.image_bytes(config.image_size)  # on each device: half the images over the two
  config.dataset.update(dict(cache="sharded", cache_bytes=quarter))
  sharded = loop.train_and_evaluate(config, str(tmp_path / "sharded"))
  assert "cache: 160 of 320 training images over 2 devices' memory (a block on each)" in capsys.readouterr().out
  assert sharded == plain
  # A quarter of the images on the devices, another quarter in this process's memory, half decoded every epoch.
  config.dataset.update(dict(cache="tiered", cache_bytes=quarter // 2, host_cache_bytes=quarter))
  tiered = loop.train_and_evaluate(config, str(tmp_path / "tiered"))
  assert ("cache: 160 of 320 training images: 80 over 2 devices' memory (a block on each) (0.0 GiB), 80 in this "
          "process's memory (0.0 GiB), 160 decoded every epoch; read there from step 10") in capsys.readouterr().out
  assert tiered == plain


def test_a_cache_that_cannot_be_sized_or_kept_is_refused_in_one_line():
  config = tiny_config()
  config.dataset.update(dict(cache="device", decoder="gpu"))
  with pytest.raises(ValueError, match="cache='device' keeps images the host decoded"):
    validate(config)
  for kind in ("host", "tiered"):
    config.dataset.cache = kind
    with pytest.raises(ValueError, match=f"cache='{kind}' keeps images the host decoded"):
      validate(config)
  config.dataset.update(dict(cache="host", decoder="cpu", cache_bytes=1 << 30))  # once the host cache's size
  with pytest.raises(ValueError, match="size cache 'host' with config.dataset.host_cache_bytes"):
    validate(config)
  config.dataset.update(dict(cache="device", cache_bytes=0))
  with pytest.raises(DataError, match="do not report their memory: set config.dataset.cache_bytes"):
    cache.slots(config.dataset.cache_bytes, 320, 32, sharding.make_mesh(2, 1), 0)
  assert jax.devices()[0].memory_stats() is None  # why the CPU devices need cache_bytes


def test_a_cached_batch_with_crops_outside_the_images_is_refused(dataset):
  rows = BatchLayout(sharding.make_mesh(2, 1), ("data",))
  rule = cache.Schedule(SLOTS, N, BATCH, 1, 0)
  host, _ = train_batches(dataset, BATCH, cached=rule)[0]
  host["offset"] = host["offset"] + SIZE  # XLA would clamp such a crop silently
  with pytest.raises(ValueError, match="crop offsets must lie in"):
    cache.CachedPut(rows, SIZE, 16, rule).put([host])


def test_a_tiered_batch_that_sends_more_rows_than_it_says_is_refused(dataset):
  rows = BatchLayout(sharding.make_mesh(2, 1), ("data",))
  rule = schedule("tiered", 1, 0)
  host, _ = train_batches(dataset, BATCH, cached=rule)[0]  # the fill: every row decoded and sent
  host["sent"] = np.int32(BATCH // 2)  # a process that counted only its own rows would say so
  with pytest.raises(ValueError, match=f"send up to {BATCH} rows, more than its 'sent' {BATCH // 2}"):
    cache.cached_put("tiered", rows, SIZE, 16, rule).put([host])


def resident_share(array: np.ndarray) -> float:
  """The share of `array`'s pages in memory (mincore)."""
  page = os.sysconf("SC_PAGE_SIZE")
  start = array.ctypes.data // page * page
  pages = (array.ctypes.data + array.nbytes - start + page - 1) // page
  vector = (ctypes.c_ubyte * pages)()
  mincore = ctypes.CDLL(None, use_errno=True).mincore
  mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
  assert mincore(start, pages * page, vector) == 0, os.strerror(ctypes.get_errno())
  return sum(v & 1 for v in vector) / pages


@pytest.mark.parametrize("kind", ["host", "tiered"])
def test_the_host_tier_s_pages_are_taken_before_its_images_are_written(kind):
  # Taken at the first write, each page would be a fault in the first epoch's copy threads: the host tier asks for its
  # pages from the start, and an image written meanwhile keeps its bytes.
  rows = BatchLayout(sharding.make_mesh(2, 1), ("data",))
  n = (64 << 20) // (SIZE * SIZE * 3)  # 64 MiB: above what malloc serves from memory freed before
  rule = cache.Schedule(n, n, BATCH, 1, 0, device_slots=ON_DEVICES if kind == "tiered" else 0)
  put = cache.cached_put(kind, rows, SIZE, 16, rule)
  image = np.arange(SIZE * SIZE * 3, dtype=np.uint8).reshape(SIZE, SIZE, 3)
  put.images[-1] = image
  deadline = time.monotonic() + 30
  while resident_share(put.images) < 1 and time.monotonic() < deadline:
    time.sleep(0.01)
  assert resident_share(put.images) == 1
  np.testing.assert_array_equal(put.images[-1], image)
  assert not put.images[:-1].any()  # fresh anonymous memory: zeros, untouched by the asking
  put.close()


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
