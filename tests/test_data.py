"""The input pipeline on real loading paths: tfds (mock_data), an image folder, a store-like source of fixed-size
JPEGs, the procedural set; the CPU decoder against PIL; resume, determinism, sharding and bad data."""

import dataclasses
import functools
import glob
import io
import logging
import mmap
import multiprocessing
import os
import signal
import tempfile

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from alexnet_jax.config import paper_config, validate
from alexnet_jax.data import (
  DataError,
  augment,
  decode,
  eval_batches,
  get_dataset,
  iterate,
  procedural,
  rings,
  sources,
  statistics,
  train_batches,
)
from alexnet_jax.data.pipeline import make_dataset
from alexnet_jax.data.workers import SIGNALS, left_to_this_thread
from alexnet_jax.data.device_batches import BatchLayout, random_batch
from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.network.table import get_network
from alexnet_jax.training import evaluation, train


def data_config(name, **dataset):
  c = paper_config()
  c.image_size = 32
  c.dataset.update(dict(name=name, resize=40, threads=2) | dataset)
  return c


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_batches_equal(a, b):
  """Two lists of (batch, skipped) training elements."""
  assert len(a) == len(b)
  for (x, x_skipped), (y, y_skipped) in zip(a, b):
    assert x.keys() == y.keys() and x_skipped == y_skipped
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.fixture(scope="module")
def imagenet():
  # Mock ImageNet images come in random sizes (e.g. 17×47): everything is resized, then cropped.
  with tfds.testing.mock_data(num_examples=24):
    return get_dataset(data_config("imagenet2012", data_dir="/nonexistent"))


def test_imagenet2012_through_tfds_data_source(imagenet):
  assert (imagenet.num_classes, imagenet.num_train, imagenet.num_eval) == (1000, 24, 24)
  assert imagenet.statistics is statistics.IMAGENET  # published, not measured on the mock images
  batch, skipped = train_batches(imagenet, 8)[0]
  assert list(batch) == ["image", "offset", "flip", "shift", "label"] and skipped == 0  # the count stays on the host
  assert batch["image"].shape == (8, 40, 40, 3) and batch["image"].dtype == np.uint8  # the 40×40 stored images
  assert batch["offset"].shape == (8, 2) and batch["offset"].dtype == np.int32
  assert batch["offset"].min() >= 0 and batch["offset"].max() <= 40 - 32  # the device cuts the 32×32 crops
  assert batch["flip"].shape == (8,) and batch["flip"].dtype == bool
  assert batch["label"].dtype == np.int32 and ((0 <= batch["label"]) & (batch["label"] < 1000)).all()
  assert batch["shift"].shape == (8, 3) and 0 < np.abs(batch["shift"]).max() < 0.2  # σ 0.1 × λ ≤ 0.22
  batches = list(eval_batches(imagenet, 10))
  assert list(batches[0]) == ["image", "label", "mask", "unreadable"]
  assert [b["mask"].sum() for b in batches] == [10, 10, 4]
  assert batches[-1]["image"].shape == (10, 40, 40, 3)
  # Full-size images are stored on the fly: shorter side 40, the central 40×40 patch.
  for i in (0, 23):
    stored = augment.resize_center_crop(imagenet.eval.source[i]["image"], 40)
    np.testing.assert_array_equal(batches[i // 10]["image"][i % 10], stored)


def test_cifar10_statistics_come_from_the_data():
  with tfds.testing.mock_data(num_examples=40):
    cifar = get_dataset(data_config("cifar10", eval_split="test", resize=32))  # stored as they are: no resampling
    assert cifar.num_classes == 10
    # Mock pixels are uniform on 0..255: mean ½, std ≈ 0.29, equal PCA eigenvalues ≈ 1/12 each.
    np.testing.assert_allclose(cifar.statistics.mean, 0.5, atol=0.02)
    np.testing.assert_allclose(cifar.statistics.std, 0.289, atol=0.02)
    np.testing.assert_allclose(cifar.statistics.eigval, 1 / 12, rtol=0.15)
    assert train_batches(cifar, 5)[3][0]["image"].shape == (5, 32, 32, 3)


def test_unprepared_or_unknown_tfds_dataset_says_what_to_do(tmp_path):
  with pytest.raises(DataError, match=r"not prepared as array_record in .*make prepare ARGS=.--name=cifar10"):
    get_dataset(data_config("cifar10", data_dir=str(tmp_path)))
  with pytest.raises(DataError, match="has no dataset 'imagenet9'"):
    get_dataset(data_config("imagenet9", data_dir=str(tmp_path)))
  with tfds.testing.mock_data(num_examples=4):
    with pytest.raises(DataError, match="num_classes=10 but 'imagenet2012' has 1000"):
      get_dataset(data_config("imagenet2012", num_classes=10))


def write_image(path, rng, size, mode="RGB"):
  pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
  Image.fromarray(pixels).convert(mode).save(path)


@pytest.fixture
def folder(tmp_path):
  """root/{train,val}/{cat,dog}/ with JPEGs and PNGs of mixed sizes and modes, and one corrupt file."""
  rng = np.random.default_rng(0)
  for split, n in (("train", 5), ("val", 2)):
    for name in ("cat", "dog"):
      os.makedirs(tmp_path / split / name)
      for i in range(n):
        mode, suffix = ("L", "png") if i == 1 else ("RGB", "jpg")
        write_image(tmp_path / split / name / f"{i}.{suffix}", rng, (40 + 7 * i, 60 - 3 * i), mode)
  (tmp_path / "train" / "dog" / "9_broken.jpg").write_bytes(b"not a jpeg")
  (tmp_path / "train" / "dog" / "notes.txt").write_text("not an image")
  return tmp_path


def test_image_folder_skips_and_counts_an_unreadable_image(folder, caplog):
  data = get_dataset(data_config("folder", data_dir=str(folder), eval_split="val", threads=1))
  assert (data.num_classes, data.num_train, data.num_eval) == (2, 11, 4)
  broken = data.train.source.files.index(str(folder / "train" / "dog" / "9_broken.jpg"))
  with caplog.at_level(logging.WARNING):
    example = data.train[broken]
  assert example["skipped"] == 1 and "skipping unreadable image" in caplog.text and "9_broken.jpg" in caplog.text
  np.testing.assert_array_equal(example["image"], data.train[(broken + 1) % 11]["image"])
  # Over one epoch of batches, the broken file is passed over exactly once.
  (batch, skipped), = take(iterate(train_batches(data, 11), 0, 0), 1)
  assert skipped == 1 and "skipped" not in batch
  # The broken file is the last of the split: its substitute wraps around to the first, a cat.
  assert sorted(batch["label"]) == [0] * 6 + [1] * 5
  assert [b["label"].tolist() for b in eval_batches(data, 4)] == [[0, 0, 1, 1]]


def test_evaluation_counts_each_readable_image_once_and_the_unreadable_apart(folder):
  (folder / "val" / "dog" / "5_broken.jpg").write_bytes(b"not a jpeg")  # the split's last: its stand-in is the first
  config = data_config("folder", data_dir=str(folder), eval_split="val", threads=1, resize=72)
  config.update(dict(width=0.0625, image_size=64, eval_batch_size=8, mesh=dict(model=1, data=1)))
  data = get_dataset(config)
  (batch,) = list(eval_batches(data, 8))
  assert batch["mask"].tolist() == [True] * 4 + [False] * 4 and batch["unreadable"] == 1
  setup = train.dataset_setup(config, data)
  state = train.create_train_state(setup, jax.random.key(0))
  p_eval_step = jax.jit(functools.partial(train.eval_step, setup=setup), static_argnames="crops")
  metrics = evaluation.evaluate(state, data, config, p_eval_step, setup.batch_layout)
  assert metrics["count"] == 4 and metrics["unreadable"] == 1


def test_a_label_outside_the_classes_stops_naming_the_image(folder):
  data = get_dataset(data_config("folder", data_dir=str(folder), eval_split="val", threads=1))
  data.train.source.labels[3] = 7  # as a corrupt or foreign store would hold it
  with pytest.raises(DataError, match=rf"image {folder}/train/cat/3.jpg has label 7, not one of the 2 classes "
                     r"\[0, 1\]"):
    data.train.batch(np.arange(5))
  data.train.source.labels[3] = -1
  with pytest.raises(DataError, match="has label -1, not one of the 2 classes"):
    data.train[3]


def test_image_folder_errors(folder, tmp_path_factory):
  with pytest.raises(DataError, match=r"^no such directory: .*nowhere$"):
    get_dataset(data_config("folder", data_dir=str(folder / "nowhere")))
  with pytest.raises(DataError, match=r"no split 'validation' in .* \(it holds: train, val\): set "
                     r"--config.dataset.eval_split=val"):
    get_dataset(data_config("folder", data_dir=str(folder)))  # the default eval split is 'validation'
  with pytest.raises(DataError, match=r"resize=24 must be ≥ config.image_size=32 \(images are resized, then cropped"):
    get_dataset(data_config("folder", data_dir=str(folder), eval_split="val", resize=24))
  os.makedirs(folder / "val" / "horse")
  with pytest.raises(DataError, match="classes that the training split lacks: horse"):
    get_dataset(data_config("folder", data_dir=str(folder), eval_split="val"))


def test_image_folder_passes_over_what_is_not_a_regular_file(folder, caplog):
  os.mkfifo(folder / "train" / "cat" / "pipe.jpg")  # reading it would wait for a writer forever
  with caplog.at_level(logging.WARNING):
    data = get_dataset(data_config("folder", data_dir=str(folder), eval_split="val", threads=1))
  assert f"skipping {folder}/train/cat/pipe.jpg: not a regular file" in caplog.text
  assert data.num_train == 11 and not any(f.endswith("pipe.jpg") for f in data.train.source.files)


def test_an_image_too_small_for_the_network_is_refused_before_data_is_read():
  config = data_config("procedural")
  config.update(dict(network="alexnet", image_size=8))
  with pytest.raises(ValueError, match=r"config.image_size=8 is too small for network 'alexnet': layer pool1's 3×3 "
                     r"window does not fit the 1×1 map that reaches it"):
    validate(config)
  with pytest.raises(ValueError, match=r"layer conv1's 11×11 filters do not fit the 4×4 map that reaches it"):
    layer_shapes(get_network("alexnet"), 4)


@pytest.fixture(scope="module")
def small():
  config = data_config("procedural", num_train_examples=10, num_eval_examples=6)
  return get_dataset(config)


def test_procedural_images_come_at_the_crop_size_unaugmented():
  data = get_dataset(data_config("procedural", resize=0, num_train_examples=4, num_eval_examples=2))
  assert data.resize is None and data.statistics is procedural.STATISTICS  # dataset.resize is not asked
  batch, _ = train_batches(data, 4)[0]
  assert batch["image"].shape == (4, 32, 32, 3)  # stored at the crop size
  for image in batch["image"]:
    assert any(np.array_equal(image, data.train.source[i]["image"]) for i in range(4))
  np.testing.assert_array_equal(batch["offset"], 0)  # not cropped, not mirrored, not shifted
  assert not batch["flip"].any()
  np.testing.assert_array_equal(batch["shift"], 0)


@pytest.fixture
def one_per_class(tmp_path):
  """root/{train,val}/c<i>/0.png: six lossless 40×52 noise images, one per class, so that a label names its image."""
  rng = np.random.default_rng(1)
  for split in ("train", "val"):
    for c in range(6):
      os.makedirs(tmp_path / split / f"c{c}")
      write_image(tmp_path / split / f"c{c}" / "0.png", rng, (40, 52))
  return tmp_path


def test_every_epoch_is_a_new_permutation_with_new_augmentation(one_per_class):
  data = get_dataset(data_config("folder", data_dir=str(one_per_class), eval_split="val"))
  batches = train_batches(data, 6)  # batch e is epoch e
  epochs = [batches[e][0] for e in range(3)]
  for batch in epochs:
    assert sorted(batch["label"]) == list(range(6))  # every example once
  assert not np.array_equal(epochs[0]["label"], epochs[1]["label"])
  draws = []
  for i in range(6):
    stored = data.train.source[i]["image"][:, 6:46]  # 40×52 lossless images: the central 40×40 patch, exactly
    seen = [(tuple(b["offset"][j]), bool(b["flip"][j]), b["shift"][j]) for b in epochs
            for j in np.flatnonzero(b["label"] == i)]
    for b in epochs:
      np.testing.assert_array_equal(b["image"][b["label"] == i][0], stored)
    assert len({(offset, flip) for offset, flip, _ in seen}) > 1, seen  # the same image, cropped or mirrored anew
    for a in range(3):
      for b in range(a):
        assert not np.array_equal(seen[a][2], seen[b][2])  # and shifted in colour anew
    draws += [(offset, flip) for offset, flip, _ in seen]
  (tops, lefts), mirrored = zip(*(offset for offset, _ in draws)), [flip for _, flip in draws]
  assert len(set(tops)) > 3 and len(set(lefts)) > 3 and set(mirrored) == {False, True}
  np.testing.assert_array_equal(batches[1][0]["image"], epochs[1]["image"])  # a pure function of the step


def with_threads(dataset, threads):
  return dataclasses.replace(dataset, train=decode.Decoder(dataset.train.source, dataset.size, False, threads))


def test_resumed_iterator_continues_where_the_checkpoint_left(small):
  whole = take(iterate(train_batches(small, 4), 0, 0), 7)
  one_thread = train_batches(with_threads(small, 1), 4)
  assert_batches_equal(take(iterate(one_thread, 3, 0), 4), whole[3:])  # another thread count changes nothing


def test_worker_processes_give_the_same_batches(small):
  batches = train_batches(small, 4)
  iterator = iterate(batches, 2, 1)
  try:
    assert_batches_equal(take(iterator, 3), [batches[i] for i in (2, 3, 4)])
  finally:
    iterator.close()


def test_worker_processes_send_their_batches_through_their_rings(small):
  batches = train_batches(small, 32)
  iterator = iterate(batches, 0, 2)
  try:
    got = take(iterator, 4)
    assert all(isinstance(b["image"].base, mmap.mmap) for b, _ in got)  # views of a ring, not Grain's blocks
    assert_batches_equal(got, [batches[i] for i in range(4)])
  finally:
    iterator.close()
  assert not glob.glob(f"{rings.ring_prefix(iterator.reader.tag)}*")


def test_worker_processes_end_by_themselves_when_closed(small):
  # A batch of these images is larger than a pipe holds: had it come through the worker's pipe, the worker would
  # wait at its exit for the parent to read it, until Grain killed it 25 s later (a minute for two, at every close).
  iterator = iterate(train_batches(small, 32), 0, 2)
  take(iterator, 3)
  workers = multiprocessing.active_children()
  iterator.close()
  assert workers and [p.exitcode for p in workers] == [0] * len(workers)


def test_worker_processes_leave_stop_signals_to_the_training_process(small):
  # A terminal's Ctrl-C, Slurm's scancel and a container's stop reach the whole process group; the training process
  # saves and stops its workers, which must not die of them on their own (with a traceback each). Started as
  # training starts them (data/input.py), they hold those signals blocked from their first instruction.
  with left_to_this_thread():
    iterator = iterate(train_batches(small, 4), 0, 1)
    next(iterator)
  try:
    children = [pid for task in os.listdir("/proc/self/task")
                for pid in open(f"/proc/self/task/{task}/children").read().split()]
    workers = [pid for pid in children if b"spawn_main" in open(f"/proc/{pid}/cmdline", "rb").read()]
    blocked = [int(line.split()[1], 16) for pid in workers for line in open(f"/proc/{pid}/status")
               if line.startswith("SigBlk:")]
    assert blocked and all(mask >> (s - 1) & 1 for mask in blocked for s in SIGNALS), (workers, blocked)
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & set(SIGNALS)  # this thread takes them again
  finally:
    iterator.close()


def test_processes_read_consecutive_slices_of_each_global_batch(small):
  whole = train_batches(small, 6)
  parts = [train_batches(small, 6, p, 3) for p in range(3)]
  for step in (0, 1, 5):
    for key in ("image", "label"):
      np.testing.assert_array_equal(np.concatenate([p[step][0][key] for p in parts]), whole[step][0][key])
  with pytest.raises(ValueError, match="not divisible"):
    train_batches(small, 6, 0, 4)


class Jpegs:
  """A store-like source of 48×48 JPEGs: {'jpeg': bytes, 'label': int}, as a store's reader gives its examples."""

  resize, statistics = 48, None

  def __init__(self, examples):
    self.examples = examples

  def __len__(self):
    return len(self.examples)

  def __getitem__(self, i):
    return self.examples[i]


def encoded(pixels, mode="RGB", format="JPEG"):
  out = io.BytesIO()
  Image.fromarray(pixels).convert(mode).save(out, format=format, quality=90)  # 4:2:0 chroma, as photos are stored
  return out.getvalue()


def photo(i, size=(48, 48)):
  """A grating with sensor-like noise: busy chroma, the hard case for JPEG's fast upsampling."""
  pixels, _ = procedural.generate(0, "train", i, 1, max(size))
  noise = np.random.default_rng(i).normal(0, 16, (*size, 3))
  return np.clip(pixels[0, :size[0], :size[1]] * 255 + noise, 0, 255).astype(np.uint8)


N_REGULAR = 12  # 48×48 colour JPEGs, then the odd entries a store or a folder can hold:
ODD = ("grey", "cmyk", "64x80", "png", "corrupt")


@pytest.fixture(scope="module")
def store():
  examples = [dict(jpeg=encoded(photo(i)), label=i % 3) for i in range(N_REGULAR)]
  odd = dict(grey=encoded(photo(20), "L"), cmyk=encoded(photo(21), "CMYK"), png=encoded(photo(22), format="PNG"),
             corrupt=encoded(photo(23))[:300])
  odd["64x80"] = encoded(photo(24, (64, 80)))
  return Jpegs(examples + [dict(jpeg=odd[name], label=2) for name in ODD])


def pil_stored(data, size=48):
  return augment.resize_center_crop(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), size)


def test_cpu_decoder_gives_pils_pixels_and_skips_what_neither_reads(store, caplog):
  readable = range(N_REGULAR + len(ODD) - 1)
  pil = np.stack([pil_stored(store[i]["jpeg"]) for i in readable])
  images, labels, skipped = decode.Decoder(store, 48, fast=False, threads=3).batch(readable)
  assert images.shape == (len(readable), 48, 48, 3) and images.dtype == np.uint8 and skipped == 0
  np.testing.assert_array_equal(images, pil)  # libjpeg-turbo's accurate DCT and fancy upsampling, as PIL's
  np.testing.assert_array_equal(labels, [i % 3 for i in range(N_REGULAR)] + [2] * (len(ODD) - 1))
  # With fast DCT and upsampling the 48×48 JPEGs in colour and grey are simplejpeg's, within decode.py's stated
  # tolerance; CMYK, the wrong size and the PNG went through PIL, whose pixels they are.
  fast, _, _ = decode.Decoder(store, 48, fast=True, threads=3).batch(readable)
  error = np.abs(fast.astype(int) - pil)
  assert 0 < error[:N_REGULAR + 1].mean() < decode.FAST_MEAN_ERROR, error[:N_REGULAR + 1].mean()
  assert error[:N_REGULAR + 1].max() <= decode.FAST_MAX_ERROR
  assert error[N_REGULAR + 1:].max() == 0
  corrupt = len(store) - 1
  with caplog.at_level(logging.WARNING):
    images, labels, skipped = decode.Decoder(store, 48).batch([corrupt, 3])
  assert skipped == 1 and f"skipping unreadable image #{corrupt}" in caplog.text
  np.testing.assert_array_equal(images[0], pil[0])  # the substitute wraps around to the first example
  np.testing.assert_array_equal(images[1], pil[3])


def test_store_batches_are_the_same_whatever_the_threads_and_resume_exactly(store):
  config = data_config("store", threads=1)
  one = make_dataset(config, store, Jpegs(store.examples[:5]), ("a", "b", "c"))
  assert one.size == 48 and one.statistics.mean.shape == (3,)  # measured on the decoded images
  batches = [train_batches(one, 5)[s] for s in range(7)]
  four = train_batches(with_threads(one, 4), 5)
  assert_batches_equal(take(iterate(four, 2, 0), 5), batches[2:])
  assert train_batches(one, len(store))[0][1] == 1  # an epoch passes over the corrupt example once
  for batch, _ in batches:
    assert batch["image"].shape == (5, 48, 48, 3) and batch["offset"].max() <= 48 - 32
  evaluation = list(eval_batches(one, 4))
  assert [b["mask"].sum() for b in evaluation] == [4, 1]
  np.testing.assert_array_equal(evaluation[1]["image"][0], pil_stored(store[4]["jpeg"]))


def test_devices_decode_the_cpu_decoders_pixels_and_the_host_what_they_cannot(store, caplog):
  """nvdecode on the two CPU devices (nvImageCodec's libjpeg-turbo backend): each device decodes its block of the
  batch; the host decodes its share, the odd images (grey, CMYK, wrong size, PNG) and what a device fails on (the
  corrupt JPEG, whose header reads), substituting and counting as the CPU decoder does."""
  from alexnet_jax.data import nvdecode  # noqa: PLC0415
  from alexnet_jax.network import sharding  # noqa: PLC0415

  truncated = encoded(photo(30))
  source = Jpegs(store.examples + [dict(jpeg=truncated[:len(truncated) * 2 // 3], label=1)])
  corrupt, cut = len(store) - 1, len(store)  # 300 bytes (no header: the host's), the truncated JPEG (the devices')
  indices = np.array([*range(1, len(source)), 5, 7, 0])  # 20 rows, 10 a device: row r holds example r + 1 up to 17
  host = decode.Decoder(source, 48, threads=2)
  expected, labels, skipped = host.batch(indices)
  batch, host_skipped = host.jpeg_batch(indices, np.array([1, 12], np.int32))
  assert set(batch["host_rows"]) == {1, 12, *range(N_REGULAR - 1, corrupt)}  # the share, then the odd ones
  lengths = np.diff(batch["jpeg_end"], prepend=0)
  assert lengths[cut - 1] and host_skipped == 2  # the corrupt one's substitute is the cut one, passed over
  assert not lengths[batch["host_rows"]].any() and lengths.sum() == len(batch["jpeg"])
  sharding = BatchLayout(sharding.make_mesh(2), ("data", "model")).sharding(4)
  with caplog.at_level(logging.WARNING):
    images, device_labels, device_skipped = nvdecode.DeviceDecoder(sharding, len(indices), host, 2)(batch)
  assert images.sharding == sharding and f"skipping unreadable image #{cut}" in caplog.text
  np.testing.assert_array_equal(np.asarray(images), expected)
  np.testing.assert_array_equal(device_labels, labels)
  assert device_skipped == 1 and host_skipped + device_skipped == skipped


def test_rows_past_the_decoding_processes_buffer_are_decoded_by_the_host(monkeypatch):
  """A device's shared JPEG buffer holds half its rows' pixels' worth of bytes: plenty for S×S photos, not for
  16×16 JPEGs, whose headers alone outweigh 384 bytes. The rows that do not fit go to the host, decoded all the
  same; closing stops the processes and leaves no shared memory behind; too little shared memory is one clear
  error."""
  from alexnet_jax.data import nvdecode  # noqa: PLC0415
  from alexnet_jax.network import sharding  # noqa: PLC0415

  tiny = Jpegs([dict(jpeg=encoded(photo(i)[:16, :16].copy()), label=i % 3) for i in range(12)])
  host = decode.Decoder(tiny, 16, threads=2)
  indices = np.arange(12)
  expected, labels, _ = host.batch(indices)
  batch, _ = host.jpeg_batch(indices, np.zeros(0, np.int32))
  assert np.diff(batch["jpeg_end"], prepend=0).min() > 16 * 16 * 3 // 2  # every JPEG outweighs its room
  layout = BatchLayout(sharding.make_mesh(2), ("data", "model"))
  decoder = nvdecode.DeviceDecoder(layout.sharding(4), len(indices), host, 2)
  shared = [s.path for device in decoder.devices for s in (device.jpegs, device.pixels) if s]  # this decoder's own
  finish = decoder.start(batch)
  assert all(0 < len(device.cut[0]) < 6 for device in decoder.devices)  # of each device's 6, the first fit
  images, device_labels, skipped = finish()
  np.testing.assert_array_equal(np.asarray(images), expected)
  np.testing.assert_array_equal(device_labels, labels)
  assert skipped == 0
  decoder.close()
  assert [device.process.exitcode for device in decoder.devices] == [0, 0]
  assert shared and not any(os.path.exists(path) for path in shared)
  if os.path.isdir("/dev/shm"):
    made, mkstemp = [], tempfile.mkstemp  # the file the refused allocation made, to see it gone
    monkeypatch.setattr(tempfile, "mkstemp", lambda **kw: made.append(mkstemp(**kw)) or made[-1])
    free = os.statvfs("/dev/shm")
    with pytest.raises(DataError, match=r"needs [\d,]+ MiB more of shared memory in /dev/shm .*--shm-size"):
      nvdecode._Shared(free.f_bavail * free.f_frsize + 2**30)
    assert len(made) == 1 and not os.path.exists(made[0][1])


def test_two_batches_decode_at_once_and_come_back_in_order(store):
  """The processes decode the next batch while the last one's pixels are collected: each batch its own images, in
  the order started; a third batch before the first is finished is refused."""
  from alexnet_jax.data import nvdecode  # noqa: PLC0415
  from alexnet_jax.network import sharding  # noqa: PLC0415

  host = decode.Decoder(Jpegs(store.examples[:N_REGULAR]), 48, threads=2)
  halves = [np.arange(6), np.arange(6, 12)]
  decoder = nvdecode.DeviceDecoder(BatchLayout(sharding.make_mesh(2), ("data", "model")).sharding(4), 6, host, 2)
  finishes = [decoder.start(host.jpeg_batch(rows, np.zeros(0, np.int32))[0]) for rows in halves]
  with pytest.raises(RuntimeError, match="at most 2 batches"):
    decoder.start(host.jpeg_batch(halves[0], np.zeros(0, np.int32))[0])
  with pytest.raises(RuntimeError, match="in the order they were started"):
    finishes[1]()
  for finish, rows in zip(finishes, halves):
    np.testing.assert_array_equal(np.asarray(finish()[0]), host.batch(rows)[0])
  batch = host.jpeg_batch(halves[1], np.array([0], np.int32))[0]
  np.testing.assert_array_equal(np.asarray(decoder(batch)[0]), host.batch(halves[1])[0])
  assert set(decoder.seconds) == {"start", "wait", "collect", "decode"}
  assert decoder.seconds["decode"] > 0 and min(decoder.seconds.values()) >= 0
  decoder.devices[1].process.kill()  # a decoding process that dies is named, not waited for
  with pytest.raises(DataError, match=r"the decoding process of cpu:1 exited \(code -9\)"):
    decoder(batch)
  decoder.close()


def test_training_batches_are_the_same_whoever_decodes_them(store):
  """input.batch_placer gives the step the same batch from the host's pixels and from the devices' decoding."""
  from alexnet_jax.data.feed import Feed  # noqa: PLC0415
  from alexnet_jax.data.input import batch_placer  # noqa: PLC0415
  from alexnet_jax.training import train  # noqa: PLC0415

  config = data_config("store", threads=2)
  config.batch_size, config.mesh.model = 8, 2
  on_host = make_dataset(config, store, Jpegs(store.examples[:4]), ("a", "b", "c"))
  on_devices = dataclasses.replace(on_host, decoder="gpu", host_share=0.25)
  setup = train.dataset_setup(config, on_host)
  feeds = [Feed(iterate(train_batches(d, 8), 0, 0), batch_placer(config, d, setup.batch_layout, setup.image_size))
           for d in (on_host, on_devices)]
  for _ in range(3):  # an epoch and a half: the corrupt example is passed over once, on the host or the device
    (a, a_skipped), (b, b_skipped) = (next(f) for f in feeds)
    assert a_skipped == b_skipped and a.keys() == b.keys()
    for k in a:
      assert a[k].sharding == b[k].sharding
      np.testing.assert_array_equal(a[k], b[k])
  for f in feeds:
    f.close()


@pytest.mark.parametrize("model, data, axes", [(2, 1, ("data", "model")), (1, 2, ("data",)), (2, 1, ("data",))])
def test_a_batch_s_small_arrays_cross_in_one_put_and_arrive_as_they_left(model, data, axes, monkeypatch):
  """The pixels cross alone and the small arrays together, as the int32 columns of one array: every array arrives
  with its values, bits (a float's sign, a NaN), dtype and sharding, whether the rows are split over both devices or
  replicated on them; an array of another dtype or rows crosses alone."""
  from alexnet_jax.network import sharding  # noqa: PLC0415

  rows = BatchLayout(sharding.make_mesh(model, data), axes)
  batch = random_batch(6, 6, 10, size=8)
  batch["shift"] = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
  batch["shift"][0] = [-0.0, np.nan, -1e-38]
  batch["weight"] = np.linspace(0, 1, 6, dtype=np.float16)  # not a packed dtype: alone
  puts = []
  make_array = jax.make_array_from_process_local_data
  monkeypatch.setattr(jax, "make_array_from_process_local_data",
                      lambda where, data: puts.append(data.shape) or make_array(where, data))
  placed = rows.put(batch)
  assert sorted(puts) == sorted([(6, 8, 8, 3), (6, 7), (6,)])  # pixels; offset 2 + flip + shift 3 + label; weight
  assert list(placed) == list(batch)
  for key, value in batch.items():
    assert placed[key].dtype == value.dtype and placed[key].sharding == rows.sharding(value.ndim), key
    np.testing.assert_array_equal(np.asarray(placed[key]).view(np.uint8), value.view(np.uint8), err_msg=key)




def test_a_folder_of_one_class_is_refused_naming_it(tmp_path):
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  from alexnet_jax.data import prepare  # noqa: PLC0415

  for split in ("train", "val"):
    os.makedirs(tmp_path / split / "cat")
    write_image(tmp_path / split / "cat" / "0.png", np.random.default_rng(0), (40, 40))
  said = f"{tmp_path}/train holds one class folder, cat: a classifier needs ≥ 2 classes, a folder of images for each"
  with pytest.raises(DataError, match=f"^{said}$"):  # every label 0: it would train to top-1 1.0, silently
    get_dataset(data_config("folder", data_dir=str(tmp_path), eval_split="val"))
  with pytest.raises(DataError, match=f"^{said}$"):
    prepare.folder_sources(str(tmp_path), [], 32)
  done = subprocess.run([sys.executable, "scripts/prepare_data.py", "--name=folder", f"--data_dir={tmp_path}",
                         f"--store={tmp_path / 'store'}"], capture_output=True, text=True, timeout=120,
                        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert done.returncode == 1 and done.stderr.strip().splitlines() == [f"error: {said}"], done.stderr[-2000:]
  assert not os.path.exists(tmp_path / "store")
  # A store of one class (written by hand, past prepare's check) is refused where training opens it.
  one = {split: sources.ImageFolder(str(tmp_path), split, ("cat",), 32) for split in ("train", "val")}
  prepare.write_store(str(tmp_path / "store"), one, prepare.store_settings(dict(folder="x"), ["cat"], 32, 90), 1)
  with pytest.raises(DataError, match=r"^'store' at .*/store has 1 class \(cat\): a classifier needs ≥ 2$"):
    get_dataset(data_config("store", data_dir=str(tmp_path / "store"), eval_split="val", resize=32))
