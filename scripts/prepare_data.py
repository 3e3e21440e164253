"""Prepares a tfds dataset once, as array_record, the format training reads:

  make prepare ARGS='--name=imagenet2012 --data_dir=/data/tfds --manual_dir=/data/ILSVRC2012'

Training reads prepared datasets without TensorFlow; preparing needs it (tfds's builders decode and re-encode with
tf.io and tf.image), so `make prepare` runs this script in a virtual environment of its own, .venv-prepare.
For imagenet2012, manual_dir holds ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from image-net.org.
"""

import sys

from absl import app, flags, logging

flags.DEFINE_string("name", None, "a tfds dataset name: imagenet2012, imagenette, cifar10, …")
flags.DEFINE_string("data_dir", "", "where prepared datasets live (default ~/tensorflow_datasets)")
flags.DEFINE_string("manual_dir", "", "the downloaded files, for datasets that cannot be downloaded by tfds")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  try:
    import tensorflow  # noqa: F401, PLC0415
  except ImportError:
    sys.exit("error: preparing a tfds dataset needs TensorFlow: run this as make prepare ARGS='…', which installs "
             "it in .venv-prepare")
  import tensorflow_datasets as tfds  # noqa: PLC0415

  name, data_dir = flags.FLAGS.name, flags.FLAGS.data_dir or None
  try:
    builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir=flags.FLAGS.manual_dir or None))
  except tfds.core.registered.DatasetNotFoundError:
    sys.exit(f"error: tensorflow-datasets has no dataset {name!r}")
  except (AssertionError, OSError) as e:  # manual files missing, or no network to download them
    sys.exit(f"error: could not prepare {name}: {' '.join(str(e).split())[:600]}")
  splits = ", ".join(f"{k} {v.num_examples:,}" for k, v in builder.info.splits.items())
  print(f"prepared {name} ({splits}) in {builder.data_dir}; train with --config.dataset.name={name} "
        f"--config.dataset.data_dir={data_dir or '~/tensorflow_datasets'}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["name"])
  app.run(main)
