"""Prepares a dataset once for fast training: the paper's store of size×size JPEGs (alexnet_jax/data/store.py).

  make prepare ARGS='--name=imagenet2012 --data_dir=/data/tfds --manual_dir=/data/ILSVRC2012 --store=/data/in256'
  make prepare ARGS='--name=folder --data_dir=photos --store=photos_128 --size=128 [--quality=90]'

A tfds dataset is first prepared as array_record in data_dir, unless it is there already: that needs TensorFlow, so
`make prepare` runs this script in a virtual environment of its own, .venv-prepare. For imagenet2012, manual_dir
holds ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from image-net.org. Without --store, that is all.
With --store, every image is written to the store: shorter side resized to --size, the central square, JPEG at
--quality, with its label; deterministic and resumable (a rerun keeps the complete shards); unreadable images are
left out and listed. The last lines printed are the commands that train configs/own_images.py on the store and
classify images with the run. The default size, 256, is the paper's for its 224 crops; 128 suits CPUs.
"""

import math
import os
import shlex
import sys
import time

from absl import flags, logging

from alexnet_jax import cli

flags.DEFINE_string("name", None, "a tfds dataset name (imagenet2012, imagenette, cifar10, …) or 'folder'")
flags.DEFINE_string("data_dir", "", "tfds: where prepared datasets live (default ~/tensorflow_datasets); "
                    "folder: the image folder's root, ROOT/<split>/<class>/<image>")
flags.DEFINE_string("manual_dir", "", "tfds: the downloaded files, for datasets that tfds cannot download")
flags.DEFINE_string("store", "", "where the store of size×size JPEGs goes (a directory)")
flags.DEFINE_integer("size", 256, "the side of the stored images")
flags.DEFINE_integer("quality", 90, "JPEG quality of the stored images")
flags.DEFINE_list("splits", [], "splits to store (default: tfds train and validation, or test where there is no "
                  "validation; folder: train and every other directory of data_dir); classes come from the first")
flags.DEFINE_integer("shard_size", 1024, "images per shard (source indices, unreadable ones included)")
flags.DEFINE_integer("workers", 0, "processes writing shards (0: one per core)")


def prepare_tfds(name: str, data_dir: str | None, manual_dir: str | None) -> str:
  import tensorflow_datasets as tfds  # noqa: PLC0415

  try:
    builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
    if builder.is_prepared():
      return f"{name} is prepared in {builder.data_dir}"
    try:
      import tensorflow  # noqa: F401, PLC0415
    except ImportError:
      sys.exit("error: preparing a tfds dataset needs TensorFlow: run this as make prepare ARGS='…', which "
               "installs it in .venv-prepare")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  except tfds.core.registered.DatasetNotFoundError:
    sys.exit(f"error: tensorflow-datasets has no dataset {name!r}")
  except (AssertionError, OSError) as e:  # manual files missing, or no network to download them
    sys.exit(f"error: could not prepare {name}: {' '.join(str(e).split())[:600]}")
  splits = ", ".join(f"{k} {v.num_examples:,}" for k, v in builder.info.splits.items())
  return (f"prepared {name} ({splits}) in {builder.data_dir}; train with --config.dataset.name={name} "
          f"--config.dataset.data_dir={data_dir or '~/tensorflow_datasets'}")


def report(root: str, manifest: dict, written: int, seconds: float) -> None:
  """Left-out images on stderr; per split and in all, images and bytes on disk on stdout."""
  total, size = 0, 0
  for split, entry in manifest["splits"].items():
    for e in entry["left_out"]:
      print(f"left out {split} #{e['index']}: {e['error']}", file=sys.stderr)
    total, size = total + entry["count"], size + entry["bytes"]
    print(f"{split}: {entry['count']:,} images in {entry['shards']} shards, {entry['bytes'] / 1e6:,.1f} MB, "
          f"{len(entry['left_out'])} unreadable left out")
  print(f"wrote {written:,} images in {seconds:.1f} s ({written / max(seconds, 1e-9):,.0f} images/s); the store "
        f"holds {total:,} images of {manifest['size']}×{manifest['size']} at JPEG quality {manifest['quality']}: "
        f"{size / 1e6:,.1f} MB, {size / max(total, 1):,.0f} bytes/image")
  print(train_command(root, manifest))


def train_command(root: str, manifest: dict) -> str:
  """The lines that say how to train on the store and classify with the run, their commands as a user types them
  in the shell that README's setup leaves (.venv active)."""
  from alexnet_jax.config import get  # noqa: PLC0415
  from alexnet_jax.configs import own_images  # noqa: PLC0415

  config = own_images.get_config()
  splits = list(manifest["splits"])
  train_split, eval_split = splits[0], (splits[1:] or splits)[0]
  workdir = os.path.join("runs", os.path.basename(os.path.normpath(root)))
  size, images = manifest["size"], manifest["splits"][train_split]["count"]
  # As many steps as the config's, or 20 epochs of a larger store, and crops of 7/8 of the side as the paper's 224 of
  # 256: only what differs from configs/own_images.py is spelled out.
  steps = max(config.num_steps, math.ceil(20 * images / config.batch_size))
  changes = dict(num_steps=steps, image_size=max(8, size * 7 // 8)) | {
      "dataset.resize": size, "dataset.train_split": train_split, "dataset.eval_split": eval_split}
  flags_ = [f"--config.dataset.data_dir={shlex.quote(os.path.abspath(root))}"] + [
      f"--config.{k}={shlex.quote(str(v))}" for k, v in changes.items() if get(config, k) != v]
  command = (f"python scripts/train.py --config configs/own_images.py {' '.join(flags_)} "
             f"--workdir {shlex.quote(workdir)}")
  return ("train (in the shell where .venv is active: source .venv/bin/activate):\n"
          f"  {command}"
          f"\nthen classify images with it:\n  python scripts/predict.py --workdir {shlex.quote(workdir)} IMAGES…")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  f = flags.FLAGS
  from alexnet_jax.data import DataError, prepare  # noqa: PLC0415

  try:
    prepare.check_split_names(f.splits)  # before anything is written, a tfds dataset's preparation included
  except DataError as e:
    sys.exit(f"error: {e}")
  if f.name != "folder":
    message = prepare_tfds(f.name, f.data_dir or None, f.manual_dir or None)
    if not f.store:
      print(message)
      return
  elif not f.store:
    sys.exit("error: --name=folder needs --store, the directory where the store goes")
  start = time.perf_counter()
  try:
    if f.name == "folder":
      splits, classes, source = prepare.folder_sources(f.data_dir, f.splits, f.size)
    else:
      splits, classes, source = prepare.tfds_sources(f.name, f.data_dir, f.splits, f.size)
    settings = prepare.store_settings(source, classes, f.size, f.quality, f.shard_size)
    manifest, written = prepare.write_store(f.store, splits, settings, f.workers)
  except DataError as e:
    sys.exit(f"error: {e}")
  except OSError as e:  # a full disk, or a store directory that cannot be written
    sys.exit(f"error: cannot write the store in {f.store}: {e.strerror or e}{f' ({e.filename})' if e.filename else ''}"
             "; free space or choose another --store, then run the same command again: it keeps the shards written")
  report(f.store, manifest, written, time.perf_counter() - start)


if __name__ == "__main__":
  cli.run(main, required=["name"])
