"""The input pipeline on real loading paths: tfds (mock_data), an image folder, the procedural set; resume, sharding
and bad data."""

import logging
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from alexnet_jax.config import paper_config
from alexnet_jax.data import DataError, eval_batches, get_dataset, iterate, prepare, statistics, train_batches


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
  assert set(batch) == {"image", "shift", "label"} and skipped == 0  # the count stays on the host
  assert batch["image"].shape == (8, 32, 32, 3) and batch["image"].dtype == np.uint8
  assert batch["label"].dtype == np.int32 and ((0 <= batch["label"]) & (batch["label"] < 1000)).all()
  assert batch["shift"].shape == (8, 3) and 0 < np.abs(batch["shift"]).max() < 0.2  # σ 0.1 × λ ≤ 0.22
  batches = list(eval_batches(imagenet, 10))
  assert set(batches[0]) == {"image", "shift", "label", "mask"}
  assert [b["mask"].sum() for b in batches] == [10, 10, 4]
  assert batches[-1]["image"].shape == (10, 32, 32, 3)
  ten = next(eval_batches(imagenet, 4, crops=10))
  assert ten["image"].shape == (4, 10, 32, 32, 3)
  np.testing.assert_array_equal(ten["image"][:, 4], batches[0]["image"][:4])  # crop 4 is the centre crop


def test_cifar10_statistics_come_from_the_data():
  with tfds.testing.mock_data(num_examples=40):
    cifar = get_dataset(data_config("cifar10", eval_split="test"))
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
  (batch, skipped), = take(iterate(train_batches(data, 11), 0, 2, 0), 1)
  assert skipped == 1 and "skipped" not in batch
  # The broken file is the last of the split: its substitute wraps around to the first, a cat.
  assert sorted(batch["label"]) == [0] * 6 + [1] * 5
  assert [b["label"].tolist() for b in eval_batches(data, 4)] == [[0, 0, 1, 1]]


def test_image_folder_errors(folder, tmp_path_factory):
  with pytest.raises(DataError, match=r"no image folder at .*nowhere/train: expected"):
    get_dataset(data_config("folder", data_dir=str(folder / "nowhere")))
  with pytest.raises(DataError, match="no image folder at .*validation"):
    get_dataset(data_config("folder", data_dir=str(folder)))  # the default eval split is 'validation'
  with pytest.raises(DataError, match=r"resize=24 must be ≥ config.image_size=32 \(images are resized, then cropped"):
    get_dataset(data_config("folder", data_dir=str(folder), eval_split="val", resize=24))
  os.makedirs(folder / "val" / "horse")
  with pytest.raises(DataError, match="classes that the training split lacks: horse"):
    get_dataset(data_config("folder", data_dir=str(folder), eval_split="val"))


@pytest.fixture(scope="module")
def small():
  config = data_config("procedural", num_train_examples=10, num_eval_examples=6)
  return get_dataset(config)


def test_procedural_images_come_at_the_crop_size_unaugmented():
  data = get_dataset(data_config("procedural", resize=0, num_train_examples=4, num_eval_examples=2))
  assert data.resize is None and data.statistics.mean.shape == (3,)  # dataset.resize is not asked; statistics measured
  batch, _ = train_batches(data, 4)[0]
  for image in batch["image"]:
    assert any(np.array_equal(image, data.train[i]["image"]) for i in range(4))  # not cropped, not mirrored
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


def placement(crop, image):
  """(top, left, mirrored) of the window of `image` that `crop` is."""
  windows = np.lib.stride_tricks.sliding_window_view(image, crop.shape)[:, :, 0]
  for mirrored, window in ((False, crop), (True, crop[:, ::-1])):
    hits = np.argwhere((windows == window).all(axis=(2, 3, 4)))
    if len(hits):
      return int(hits[0, 0]), int(hits[0, 1]), mirrored
  raise AssertionError("the crop is no window of its image")


def test_every_epoch_is_a_new_permutation_with_new_augmentation(one_per_class):
  # Images of shorter side 40 = dataset.resize, so the 32-pixel crops are exact windows of the stored pixels.
  data = get_dataset(data_config("folder", data_dir=str(one_per_class), eval_split="val"))
  batches = train_batches(data, 6)  # batch e is epoch e
  epochs = [batches[e][0] for e in range(3)]
  for batch in epochs:
    assert sorted(batch["label"]) == list(range(6))  # every example once
  assert not np.array_equal(epochs[0]["label"], epochs[1]["label"])
  placements = []
  for i in range(6):
    image = data.train[i]["image"]
    seen = [(placement(b["image"][j], image), b["shift"][j]) for b in epochs for j in np.flatnonzero(b["label"] == i)]
    assert len({where for where, _ in seen}) > 1, seen  # the same image, cropped or mirrored anew
    for a in range(3):
      for b in range(a):
        assert not np.array_equal(seen[a][1], seen[b][1])  # and shifted in colour anew
    placements += [where for where, _ in seen]
  tops, lefts, mirrored = zip(*placements)
  assert len(set(tops)) > 3 and len(set(lefts)) > 3 and set(mirrored) == {False, True}
  np.testing.assert_array_equal(batches[1][0]["image"], epochs[1]["image"])  # a pure function of the step


def test_resumed_iterator_continues_where_the_checkpoint_left(small):
  batches = train_batches(small, 4)
  whole = take(iterate(batches, 0, 2, 0), 7)
  assert_batches_equal(take(iterate(batches, 3, 1, 0), 4), whole[3:])  # another thread count changes nothing


def test_worker_processes_give_the_same_batches(small):
  batches = train_batches(small, 4)
  iterator = iterate(batches, 2, 1, 1)
  try:
    assert_batches_equal(take(iterator, 3), [batches[i] for i in (2, 3, 4)])
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


def test_resize_folder_copies_a_folder_at_a_shorter_side(folder, tmp_path_factory):
  out = tmp_path_factory.mktemp("resized")
  written, errors = prepare.resize_folder(str(folder), str(out), 48, workers=1)
  assert written == 14 and len(errors) == 1 and "9_broken.jpg" in errors[0]
  resized = get_dataset(data_config("folder", data_dir=str(out), eval_split="val", resize=48))
  assert (resized.num_classes, resized.num_train, resized.num_eval) == (2, 10, 4)
  image = resized.train.source[0]["image"]
  assert min(image.shape[:2]) == 48 and image.shape[2] == 3
  assert resized.train[0]["skipped"] == 0
