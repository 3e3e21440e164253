"""Prepares a dataset once for fast training.

  make prepare ARGS='--name=imagenet2012 --data_dir=/data/tfds --manual_dir=/data/ILSVRC2012'
  make prepare ARGS='--name=folder --data_dir=/data/photos --out_dir=/data/photos_256'

tfds datasets are written as array_record, the format training reads. Training reads them without TensorFlow;
preparing needs it (tfds's builders decode and re-encode with tf.io and tf.image), so `make prepare` runs this
script in a virtual environment of its own, .venv-prepare. For imagenet2012, manual_dir holds
ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from image-net.org.

An image folder is copied with every image's shorter side resized to --resize (256), as the paper stored ImageNet:
decoding a 256-pixel JPEG and skipping the resize makes the training pipeline ~3× faster (docs/BENCHMARKS.md).
Unreadable images are left out and listed.
"""

import sys

from absl import app, flags, logging

flags.DEFINE_string("name", None, "a tfds dataset name (imagenet2012, imagenette, cifar10, …) or 'folder'")
flags.DEFINE_string("data_dir", "", "tfds: where prepared datasets live (default ~/tensorflow_datasets); "
                    "folder: the image folder's root")
flags.DEFINE_string("manual_dir", "", "tfds: the downloaded files, for datasets that tfds cannot download")
flags.DEFINE_string("out_dir", "", "folder: where the resized copy goes")
flags.DEFINE_integer("resize", 256, "folder: the shorter side of the resized images")


def prepare_tfds(name: str, data_dir: str | None, manual_dir: str | None) -> str:
  try:
    import tensorflow  # noqa: F401, PLC0415
  except ImportError:
    sys.exit("error: preparing a tfds dataset needs TensorFlow: run this as make prepare ARGS='…', which installs "
             "it in .venv-prepare")
  import tensorflow_datasets as tfds  # noqa: PLC0415

  try:
    builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  except tfds.core.registered.DatasetNotFoundError:
    sys.exit(f"error: tensorflow-datasets has no dataset {name!r}")
  except (AssertionError, OSError) as e:  # manual files missing, or no network to download them
    sys.exit(f"error: could not prepare {name}: {' '.join(str(e).split())[:600]}")
  splits = ", ".join(f"{k} {v.num_examples:,}" for k, v in builder.info.splits.items())
  return (f"prepared {name} ({splits}) in {builder.data_dir}; train with --config.dataset.name={name} "
          f"--config.dataset.data_dir={data_dir or '~/tensorflow_datasets'}")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  f = flags.FLAGS
  if f.name != "folder":
    print(prepare_tfds(f.name, f.data_dir or None, f.manual_dir or None))
    return
  if not f.out_dir:
    sys.exit("error: --name=folder needs --out_dir, where the resized copy goes")
  from alexnet_jax.data import DataError  # noqa: PLC0415
  from alexnet_jax.data.prepare import resize_folder  # noqa: PLC0415

  try:
    written, errors = resize_folder(f.data_dir, f.out_dir, f.resize)
  except DataError as e:
    sys.exit(f"error: {e}")
  for e in errors:
    print(f"left out unreadable image {e}", file=sys.stderr)
  print(f"wrote {written:,} images with shorter side {f.resize} to {f.out_dir} ({len(errors)} unreadable left out); "
        f"train with --config.dataset.name=folder --config.dataset.data_dir={f.out_dir}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["name"])
  app.run(main)
