"""The paper's store (data/store.py, data/prepare.py, scripts/prepare_data.py): writer and reader through tfds's
mock data and an image folder of odd inputs; determinism, resume, the manifest and the reader's errors."""

import errno
import filecmp
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from alexnet_jax.data import DataError, augment, prepare, sources, statistics, store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 32
# JPEG at quality 90 with 4:2:0 chroma keeps the smooth test images within these levels (of 255) of the centre crop
# that was encoded: the mean over pixels and the worst pixel.
MEAN_TOLERANCE, MAX_TOLERANCE = 2.0, 16


def smooth(h, w, seed):
  """(h, w, 3) uint8 colour waves of low frequency, different for every seed: what JPEG keeps well."""
  rng = np.random.default_rng(seed)
  y, x = np.mgrid[:h, :w] / max(h, w)
  angle, phase = rng.uniform(1, 4, (2, 3)), rng.uniform(0, 6, 3)
  waves = np.sin(angle[0] * x[..., None] + angle[1] * y[..., None] + phase)
  return np.round(127.5 + 100 * waves).astype(np.uint8)


def save(path, pixels, mode="RGB", **options):
  Image.fromarray(pixels).convert(mode).save(path, **options)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """root/{train,val}/{a,b}/: RGB JPEGs of odd sizes, a grey JPEG, a CMYK JPEG, an RGBA PNG, a 16-bit grey PNG, and
  a corrupt JPEG among them."""
  root = tmp_path_factory.mktemp("folder")
  for split in ("train", "val"):
    for name in ("a", "b"):
      os.makedirs(root / split / name)
  seed = iter(range(100))
  for i, (h, w) in enumerate(((37, 53), (61, 40), (33, 33))):
    save(root / "train" / "a" / f"{i}.jpg", smooth(h, w, next(seed)), quality=95)
  save(root / "train" / "a" / "3_grey.jpg", smooth(45, 50, next(seed)), "L", quality=95)
  (root / "train" / "b" / "0_broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
  save(root / "train" / "b" / "1_cmyk.jpg", smooth(40, 48, next(seed)), "CMYK", quality=95)
  save(root / "train" / "b" / "2_rgba.png", smooth(50, 36, next(seed)), "RGBA")
  wide = smooth(34, 70, next(seed))[..., 0].astype(np.uint16) * 257  # 16-bit grey, 0..65535
  Image.fromarray(wide).save(root / "train" / "b" / "3_16bit.png")
  for name in ("a", "b"):
    save(root / "val" / name / "0.jpg", smooth(48, 40, next(seed)), quality=95)
  return root


def write(root, out, shard_size=3, workers=1, quality=90):
  splits, classes, source = prepare.folder_sources(str(root), [], SIZE)
  settings = prepare.store_settings(source, classes, SIZE, quality, shard_size)
  return prepare.write_store(str(out), splits, settings, workers)


@pytest.fixture(scope="module")
def written(folder, tmp_path_factory):
  out = tmp_path_factory.mktemp("store")
  return out, *write(folder, out)


def expected_square(image):
  """What the store encodes: the central SIZE×SIZE patch after resizing the shorter side to SIZE."""
  return augment.center_crop(augment.resize_shorter(image, SIZE), SIZE)


def assert_close_to(jpeg, square):
  decoded = store.decode_pil(jpeg)
  assert decoded.shape == (SIZE, SIZE, 3) and decoded.dtype == np.uint8
  error = np.abs(decoded.astype(int) - square.astype(int))
  assert error.mean() < MEAN_TOLERANCE and error.max() <= MAX_TOLERANCE, (error.mean(), error.max())


def test_folder_store_holds_every_readable_image_as_its_centre_square(folder, written):
  out, manifest, count = written
  source = prepare.folder_sources(str(folder), [], SIZE)[0]["train"]
  broken = source.files.index(str(folder / "train" / "b" / "0_broken.jpg"))
  train = store.open_split(str(out), "train")
  assert count == 9 and len(train) == 7 and train.resize == SIZE and train.statistics is None
  assert train.classes == ("a", "b")
  readable = [i for i in range(len(source)) if i != broken]
  for i, j in enumerate(readable):  # index i of the store is the source's i-th readable image
    record = train[i]
    assert record["label"] == source.labels[j]
    assert_close_to(record["jpeg"], expected_square(source[j]["image"]))
  assert [store.open_split(str(out), "val")[i]["label"] for i in range(2)] == [0, 1]


def test_odd_inputs_become_8_bit_rgb(folder):
  grey16 = np.asarray(Image.open(folder / "train" / "b" / "3_16bit.png"))
  assert grey16.dtype == np.uint16 and grey16.max() > 50_000
  decoded = sources.decode(str(folder / "train" / "b" / "3_16bit.png"))
  np.testing.assert_array_equal(decoded, np.repeat((grey16 >> 8).astype(np.uint8)[..., None], 3, -1))  # not clipped
  for name in ("1_cmyk.jpg", "2_rgba.png"):
    assert sources.decode(str(folder / "train" / "b" / name)).shape[2] == 3


def test_manifest_says_what_the_store_holds(folder, written):
  out, manifest, _ = written
  assert store.read_manifest(str(out)) == manifest
  assert (manifest["format"], manifest["version"]) == (store.FORMAT, store.VERSION)
  assert manifest["source"] == {"folder": str(folder)} and manifest["classes"] == ["a", "b"]
  assert (manifest["size"], manifest["quality"], manifest["num_classes"], manifest["shard_size"]) == (SIZE, 90, 2, 3)
  assert manifest["jpeg"] == prepare.JPEG_OPTIONS and "bilinear" in manifest["resize"]
  train, val = manifest["splits"]["train"], manifest["splits"]["val"]
  assert (train["count"], train["shards"], val["count"], val["shards"]) == (7, 3, 2, 1)
  assert train["bytes"] == sum(os.path.getsize(out / store.shard_name("train", k, 3)) for k in range(3))
  (left_out,) = train["left_out"]
  assert left_out["index"] == 4 and "0_broken.jpg" in left_out["error"] and val["left_out"] == []
  assert train["digests"] == [store.shard_digest(str(out / store.shard_name("train", k, 3))) for k in range(3)]
  with pytest.raises(DataError, match=r"written with other settings \(quality 90 → 80\); choose another --store"):
    write(folder, out, quality=80)


def test_tfds_store_through_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=7):  # mock ImageNet images come in random sizes, e.g. 17×47
    splits, classes, source = prepare.tfds_sources("imagenet2012", "/nonexistent", ["train", "validation"], SIZE)
    examples = [splits["train"][i] for i in range(7)]
    settings = prepare.store_settings(source, classes, SIZE, 90, shard_size=3)
    manifest, count = prepare.write_store(str(tmp_path), splits, settings, workers=1)
  assert count == 14 and manifest["source"] == {"tfds": "imagenet2012", "version": "5.1.0"}
  assert len(manifest["classes"]) == manifest["num_classes"] == 1000 and manifest["classes"][0] == "n01440764"
  assert [manifest["splits"][s]["shards"] for s in ("train", "validation")] == [3, 3]
  train = store.open_split(str(tmp_path), "train")
  assert len(train) == 7 and train.statistics is statistics.IMAGENET
  for i, example in enumerate(examples):
    assert train[i]["label"] == example["label"]
    # Mock pixels are uniform noise, which JPEG cannot keep pixel by pixel: compare the mean colour only.
    decoded = store.decode_pil(train[i]["jpeg"])
    np.testing.assert_allclose(decoded.mean((0, 1)), expected_square(example["image"]).mean((0, 1)), atol=4)


def store_files(out):
  return sorted(os.path.relpath(os.path.join(d, f), out) for d, _, files in os.walk(out) for f in files)


def assert_same_files(a, b):
  assert store_files(a) == store_files(b)
  _, mismatch, errors = filecmp.cmpfiles(a, b, store_files(a), shallow=False)
  assert not mismatch and not errors, mismatch + errors


def test_same_bytes_on_rerun_and_whatever_the_pool_size(folder, written, tmp_path):
  write(folder, tmp_path / "again", workers=1)
  write(folder, tmp_path / "pool", workers=2)  # worker processes
  assert_same_files(written[0], tmp_path / "again")
  assert_same_files(written[0], tmp_path / "pool")


def test_rerun_keeps_complete_shards_and_rewrites_the_rest(folder, written, tmp_path):
  out = tmp_path / "resumed"
  shutil.copytree(written[0], out)
  os.remove(out / store.MANIFEST)
  os.remove(out / store.shard_name("train", 1, 3))  # lost, as if killed before its rename
  (out / (store.shard_name("train", 2, 3) + ".tmp")).write_bytes(b"half a shard")  # a write cut short
  with open(out / store.shard_name("val", 0, 1), "r+b") as f:  # a shard that does not match its part: rewritten
    f.truncate(100)
  kept = os.stat(out / store.shard_name("train", 0, 3)).st_mtime_ns
  manifest, count = write(folder, out)
  assert count == 2 + 2 and manifest == written[1]  # train shard 1 (of 2 readable images) and val's shard
  assert os.stat(out / store.shard_name("train", 0, 3)).st_mtime_ns == kept
  assert_same_files(written[0], out)  # the stale temporary file is gone too


def test_a_killed_prepare_resumes_to_the_same_bytes(folder, written, tmp_path):
  """SIGKILL while shards are being written, then a rerun: the same files as a run that was never interrupted."""
  # At 512 pixels each one-image shard takes milliseconds to encode: time enough to kill the run half-way.
  args = [sys.executable, "scripts/prepare_data.py", "--name=folder", f"--data_dir={folder}", "--size=512",
          "--shard_size=1", "--workers=1"]
  env = dict(os.environ, PYTHONPATH=ROOT)
  whole = subprocess.run(args + [f"--store={tmp_path / 'whole'}"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
  assert whole.returncode == 0, whole.stderr
  assert "train: 7 images in 8 shards" in whole.stdout and "val: 2 images in 2 shards" in whole.stdout
  assert "left out train #4: " in whole.stderr and "0_broken.jpg" in whole.stderr and "bytes/image" in whole.stdout
  cut = tmp_path / "cut"
  run = subprocess.Popen(args + [f"--store={cut}"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
  while not (os.path.isdir(cut / "parts") and os.listdir(cut / "parts")) and run.poll() is None:
    time.sleep(0.001)
  run.send_signal(signal.SIGKILL)
  assert len([f for f in os.listdir(cut / "parts") if f.endswith(".json")]) < 10  # shards were left to write
  run.wait()
  assert not os.path.exists(cut / store.MANIFEST), "the run ended before it was killed"
  rerun = subprocess.run(args + [f"--store={cut}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr
  assert_same_files(tmp_path / "whole", cut)


def test_reader_errors_say_what_to_do(folder, written, tmp_path):
  with pytest.raises(DataError, match=r"^no such directory: .*nowhere$"):
    store.open_split(str(tmp_path / "nowhere"), "train")
  out = tmp_path / "store"
  shutil.copytree(written[0], out)
  with pytest.raises(DataError, match=r"no split 'test' in the store .* \(it holds: train, val\)$"):
    store.open_split(str(out), "test")
  os.remove(out / store.shard_name("train", 2, 3))
  with pytest.raises(DataError, match=r"lacks train-00002-of-00003.array_record \(1 shards missing\)"):
    store.open_split(str(out), "train")
  store.write_shard(str(out / store.shard_name("train", 2, 3)), [store.encode_record(0, b"")])
  with pytest.raises(DataError, match="shard train-00002-of-00003.array_record is not the one its manifest.json"):
    store.open_split(str(out), "train")
  with_digests = (out / store.MANIFEST).read_text()
  without_digests(out)  # as a store written before digests: counted, not compared
  with pytest.raises(DataError, match="split 'train' has 6 images, its manifest says 7"):
    store.open_split(str(out), "train")
  (out / store.MANIFEST).write_text(with_digests)
  shutil.copy(written[0] / store.shard_name("train", 2, 3), out / store.shard_name("train", 2, 3))
  shard = out / store.shard_name("train", 1, 3)
  whole = shard.read_bytes()
  shard.write_bytes(whole[:len(whole) // 2])  # a copy cut short
  with pytest.raises(DataError, match=r"shard train-00001-of-00003.array_record is damaged \(truncated or "
                     r"overwritten\); rerun make prepare"):
    store.open_split(str(out), "train")
  shard.write_bytes(whole[:100] + bytes(200) + whole[300:])  # a record overwritten: its checksum no longer holds
  with pytest.raises(DataError, match="shard train-00001-of-00003.array_record is not the one its manifest.json"):
    store.open_split(str(out), "train")
  without_digests(out)  # unchecked on opening, array_record's own checksum finds it when the record is read
  split = store.open_split(str(out), "train")
  with pytest.raises(DataError, match="shard train-00001-of-00003.array_record is damaged"):
    [split[i] for i in range(len(split))]
  assert split.where(0) == "train-00000-of-00003.array_record, record 0"
  assert split.where(len(split) - 1).startswith("train-00002-of-00003.array_record, record ")
  manifest = json.loads((out / store.MANIFEST).read_text())
  (out / store.MANIFEST).write_text(json.dumps(manifest | dict(size="256")))
  with pytest.raises(DataError, match=r"manifest.json is malformed \('size' is not an integer\); rerun make prepare"):
    store.read_manifest(str(out))
  (out / store.MANIFEST).write_text(json.dumps(manifest | dict(splits=dict(train=dict(count=-1, shards=3)))))
  with pytest.raises(DataError, match="malformed \\(split 'train' lacks an integer count or shards\\)"):
    store.read_manifest(str(out))
  (out / store.MANIFEST).write_text(json.dumps(manifest | dict(version=99)))
  with pytest.raises(DataError, match="is a store of format version 99, this code reads version 1"):
    store.read_manifest(str(out))
  (out / store.MANIFEST).write_text(json.dumps(dict(splits={})))
  with pytest.raises(DataError, match="is not the manifest of an alexnet_jax image store"):
    store.read_manifest(str(out))
  os.remove(out / store.MANIFEST)  # shards and parts without a manifest: an unfinished run
  with pytest.raises(DataError, match="is not a finished store"):
    store.read_manifest(str(out))


def without_digests(out):
  """The store at out as written before shard digests: none in its manifest or parts."""
  manifest = json.loads((out / store.MANIFEST).read_text())
  for entry in manifest["splits"].values():
    del entry["digests"]
  (out / store.MANIFEST).write_text(json.dumps(manifest))
  for part in (out / "parts").iterdir():
    part.write_text(json.dumps({k: v for k, v in json.loads(part.read_text()).items() if k != "digest"}))


def test_a_shard_from_another_store_is_named_and_a_rerun_replaces_it(folder, written, tmp_path):
  # The shard of a store at another quality holds as many images: only its bytes tell it apart.
  out, other = tmp_path / "store", tmp_path / "other"
  shutil.copytree(written[0], out)
  write(folder, other, quality=80)
  foreign = store.shard_name("train", 1, 3)
  shutil.copy(other / foreign, out / foreign)
  assert store.count_records(str(out / foreign)) == store.count_records(str(written[0] / foreign))
  with pytest.raises(DataError, match=rf"^store {out}: shard {foreign} is not the one its manifest.json was written "
                     rf"with \(copied from another store, or changed since\); rerun make prepare with --store={out}, "
                     "which writes it again$"):
    store.open_splits(str(out), "train", "val")
  kept = os.stat(out / store.shard_name("train", 0, 3)).st_mtime_ns
  manifest, count = write(folder, out)
  assert count == 2 and manifest == written[1]  # that shard's two readable images, and no other shard
  assert os.stat(out / store.shard_name("train", 0, 3)).st_mtime_ns == kept
  assert_same_files(written[0], out)
  assert len(store.open_split(str(out), "train")) == 7


def test_a_store_written_before_digests_is_read_and_completed_as_before(folder, written, tmp_path):
  out = tmp_path / "store"
  shutil.copytree(written[0], out)
  without_digests(out)
  split = store.open_split(str(out), "train")
  assert [split[i] for i in range(len(split))] == [store.open_split(str(written[0]), "train")[i] for i in range(7)]
  manifest, count = write(folder, out)
  assert count == 0 and manifest == written[1]  # every shard kept; the manifest now has their digests


def test_a_manifest_size_that_is_not_its_images_is_refused(written, tmp_path):
  # Read as it says, 32-pixel images would be resized to 64 without a word.
  out = tmp_path / "store"
  shutil.copytree(written[0], out)
  manifest = json.loads((out / store.MANIFEST).read_text())
  (out / store.MANIFEST).write_text(json.dumps(manifest | dict(size=2 * SIZE)))
  with pytest.raises(DataError, match=rf"^store {out}: its manifest.json says 'size' {2 * SIZE}, but its images are "
                     rf"{SIZE}×{SIZE} \(train-00000-of-00003.array_record, record 0\); rerun make prepare into a new "
                     "--store$"):
    store.open_split(str(out), "train")


def test_split_names_that_are_not_plain_names_are_refused_before_anything_is_written(folder, tmp_path):
  # data_dir/../outside is a folder of images, so that the split would be read: its shards would go outside --store.
  shutil.copytree(folder / "train", tmp_path / "photos" / "train")
  shutil.copytree(folder / "val", tmp_path / "outside")
  run = subprocess.run([sys.executable, "scripts/prepare_data.py", "--name=folder", f"--data_dir={tmp_path / 'photos'}",
                        f"--store={tmp_path / 'store'}", "--splits=train,../outside", f"--size={SIZE}", "--workers=1"],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)
  assert run.returncode == 1 and run.stderr.strip().splitlines()[-1] == (
      "error: split name '../outside' is not a plain file name (one without '/', not empty, '.' or '..'): the store "
      "names its files after its splits")
  assert sorted(os.listdir(tmp_path)) == ["outside", "photos"]  # no store, and nothing beside it
  assert sorted(os.listdir(tmp_path / "outside")) == ["a", "b"]
  splits, classes, source = prepare.folder_sources(str(folder), [], SIZE)
  settings = prepare.store_settings(source, classes, SIZE, 90)
  for name in ("", ".", "..", "a/b", "/tmp/x"):
    with pytest.raises(DataError, match=f"^split name {re.escape(repr(name))} is not a plain file name"):
      prepare.folder_sources(str(folder), ["train", name], SIZE)
    with pytest.raises(DataError, match=f"^split name {re.escape(repr(name))} is not a plain file name"):
      prepare.write_store(str(tmp_path / "store"), {"train": splits["train"], name: splits["val"]}, settings, 1)
  assert not os.path.exists(tmp_path / "store")


def test_a_moved_store_opens_and_completes_where_it_lies(folder, written, tmp_path):
  # Nothing in a store names its own path: `mv photos_128 elsewhere` is the same store.
  moved = tmp_path / "elsewhere"
  shutil.copytree(written[0], tmp_path / "photos_128")
  os.rename(tmp_path / "photos_128", moved)
  assert len(store.open_splits(str(moved), "train", "val")[0]) == 7
  manifest, count = write(folder, moved)
  assert count == 0 and manifest == written[1]
  # mv into a directory that exists puts the store inside it: the message names that store, not make prepare.
  (tmp_path / "dest").mkdir()
  os.rename(moved, tmp_path / "dest" / "elsewhere")
  inside = tmp_path / "dest" / "elsewhere"
  with pytest.raises(DataError, match=rf"^{tmp_path / 'dest'} holds no store itself \(no manifest.json\), but {inside} "
                     rf"inside it is one: set --config.dataset.data_dir={inside}$"):
    store.open_split(str(tmp_path / "dest"), "train")
  # The image folder moved too: a rerun says that its path is what differs.
  shutil.copytree(folder, tmp_path / "photos")
  with pytest.raises(DataError, match=rf'other settings \(source {{"folder": "{folder}"}} → {{"folder": '
                     rf'"{tmp_path / "photos"}"}}\); choose another --store'):
    write(tmp_path / "photos", inside)


def test_prepare_script_errors():
  run = subprocess.run([sys.executable, "scripts/prepare_data.py", "--name=folder", "--data_dir=/nonexistent"],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)
  assert run.returncode == 1 and run.stderr.strip().splitlines()[-1] == (
      "error: --name=folder needs --store, the directory where the store goes")


def test_training_reads_the_store(written):
  # config.dataset.name='store': the pipeline's decoder gives each stored image as decode_pil does (simplejpeg
  # without fast modes decodes as libjpeg through PIL), the crop is drawn inside the S×S image, and a store of
  # another size than config.dataset.resize is refused in one line.
  from alexnet_jax.config import paper_config  # noqa: PLC0415
  from alexnet_jax.data import eval_batches, get_dataset, train_batches  # noqa: PLC0415

  out, _, _ = written
  config = paper_config()
  config.image_size = 24
  config.dataset.update(dict(name="store", data_dir=str(out), eval_split="val", resize=SIZE, threads=2))
  dataset = get_dataset(config)
  assert (dataset.num_classes, dataset.num_train, dataset.num_eval) == (2, 7, 2)
  batch, skipped = train_batches(dataset, 4)[0]
  assert skipped == 0 and batch["image"].shape == (4, SIZE, SIZE, 3)
  assert ((0 <= batch["offset"]) & (batch["offset"] <= SIZE - 24)).all()
  train = store.open_split(str(out), "train")
  stored = {train[i]["jpeg"]: train[i]["label"] for i in range(len(train))}
  decoded = [store.decode_pil(jpeg) for jpeg in stored]
  for image, label in zip(batch["image"], batch["label"]):
    match = [i for i, d in enumerate(decoded) if np.array_equal(d, image)]
    assert match and list(stored.values())[match[0]] == label
  (evaluation,) = list(eval_batches(dataset, 2))
  np.testing.assert_array_equal(evaluation["image"][1], store.decode_pil(store.open_split(str(out), "val")[1]["jpeg"]))
  config.dataset.resize = 2 * SIZE
  with pytest.raises(DataError, match=f"holds {SIZE}×{SIZE} images: set config.dataset.resize={SIZE}"):
    get_dataset(config)


def test_train_script_decodes_on_the_devices_from_a_worker_process(folder, tmp_path):
  # The whole loop with config.dataset.decoder='gpu': a worker process reads the JPEGs, the two CPU devices decode
  # them (nvImageCodec's CPU backend) beside the host's share; the run ends with nothing left in shared memory.
  out, size = tmp_path / "store", 72
  splits, classes, source = prepare.folder_sources(str(folder), [], size)
  prepare.write_store(str(out), splits, prepare.store_settings(source, classes, size, 90, 4), 1)
  overrides = dict(name="store", data_dir=out, eval_split="val", resize=size, num_classes=0, decoder="gpu",
                   host_share=0.5, workers=1)
  args = [f"--config.dataset.{k}={v}" for k, v in overrides.items()] + [
      "--config.batch_size=4", "--config.eval_batch_size=2", "--config.num_epochs=3", "--config.log_every_steps=1",
      "--config.width=0.0625", "--config.image_size=64"]  # the demo's layers, compiled in seconds
  run = subprocess.run([sys.executable, "scripts/train.py", "--config=configs/demo.py", f"--workdir={tmp_path / 'run'}",
                        *args], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                       timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "leaked shared_memory" not in run.stderr
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    lines = [json.loads(line) for line in f]
  train = [m for m in lines if m["split"] == "train"]
  assert [m["step"] for m in train] == [1, 2, 3] and all(np.isfinite(m["loss"]) for m in train)


def test_your_own_images_in_three_commands_as_printed(folder, tmp_path):
  # prepare_data.py's last lines are the commands that train on the store and classify with the run: run as printed,
  # the training a tenth as long (its 600 steps would be this suite's longest test).
  store_dir = tmp_path / f"store_{os.getpid()}"
  prepared = subprocess.run([sys.executable, "scripts/prepare_data.py", "--name=folder", f"--data_dir={folder}",
                             f"--store={store_dir}", "--size=72", "--workers=1"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
  assert prepared.returncode == 0, prepared.stderr
  commands = [line.strip() for line in prepared.stdout.splitlines() if line.startswith("  python scripts/")]
  assert [c.split()[1] for c in commands] == ["scripts/train.py", "scripts/predict.py"]
  workdir = os.path.join(ROOT, "runs", store_dir.name)
  try:
    python = lambda command: [sys.executable, *shlex.split(command)[1:]]  # noqa: E731  (the user's interpreter)
    shorter = " --config.num_steps=60 --config.eval_every_steps=60 --config.checkpoint_every_steps=60"
    trained = subprocess.run(python(commands[0] + shorter), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "final eval" in trained.stdout
    images = [str(folder / "val" / "a"), str(folder / "val" / "b" / "0.jpg")]  # a folder, a file
    predicted = subprocess.run(python(commands[1].replace("IMAGES…", shlex.join(images))), cwd=ROOT,
                               capture_output=True, text=True, timeout=300)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    lines = predicted.stdout.strip().splitlines()
    assert [line.split(": ")[0] for line in lines] == [str(folder / "val" / name / "0.jpg") for name in "ab"]
    assert all(sorted(part.split()[0] for part in line.split(": ")[1].split(", ")) == ["a", "b"] for line in lines)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)


def test_a_full_disk_stops_prepare_in_one_line_and_a_rerun_completes_the_store(folder, written, tmp_path):
  # A file size limit fails writes as a full disk does (EFBIG), without root: 1 kB holds no shard of 90% JPEGs.
  limited = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000)); "
             "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
  out = tmp_path / "store"
  args = ["scripts/prepare_data.py", "--name=folder", f"--data_dir={folder}", f"--store={out}", f"--size={SIZE}",
          "--shard_size=3", "--workers=1"]
  env = dict(os.environ, PYTHONPATH=ROOT)
  run = subprocess.run([sys.executable, "-c", limited, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 1 and "Traceback" not in run.stderr
  assert re.fullmatch(rf"error: cannot write the store in {out}: {out}/\S+\.array_record: {os.strerror(errno.EFBIG)}; "
                      "free space or choose another --store, then run the same command again: it keeps the shards "
                      "written", run.stderr.strip().splitlines()[-1]), run.stderr
  rerun = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr
  assert_same_files(written[0], out)
