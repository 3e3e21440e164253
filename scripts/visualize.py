"""Writes a run's pictures: python scripts/visualize.py --config configs/X.py [--config.key=value …] --workdir DIR.

curves.png (loss, top-1, top-5 against steps) and conv1_filters.png (one grid of filters per tower, titled with its
colour specialisation), from the newest checkpoint and metrics.jsonl in DIR. train.py writes the same at its end.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from alexnet_jax.config import start

config_flags.DEFINE_config_file("config", None, "the configs/*.py file the run was trained with", lock_config=True)
flags.DEFINE_string("workdir", None, "the run's workdir")


def main(argv):
  del argv
  config = start(flags.FLAGS.config)
  from alexnet_jax import train  # noqa: PLC0415

  try:
    setup, _, state = train.restore_newest(config, flags.FLAGS.workdir)
    colour = train.write_pictures(flags.FLAGS.workdir, setup, state)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")
  print(f"wrote curves.png and conv1_filters.png in {flags.FLAGS.workdir}; colour specialisation {colour}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
