"""Writes a run's pictures: python scripts/visualize.py --workdir DIR [--config.key=value …].

curves.png (loss, accuracy and the learning rate against steps) and conv1_filters.png (the first conv layer's
filters, a panel per tower), from the newest checkpoint and metrics.jsonl in DIR. train.py writes the same at its end.
"""

import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings

cli.define_run_config()


def main(argv):
  del argv
  config = flags.FLAGS.config
  apply_process_settings(config)
  from alexnet_jax.training import loop  # noqa: PLC0415

  try:
    _, setup, state = loop.restore_newest(flags.FLAGS.workdir, config)
    colour = loop.write_pictures(flags.FLAGS.workdir, setup, state)
  except (ValueError, OSError) as e:
    sys.exit(f"error: {e}")
  print(f"wrote curves.png and conv1_filters.png in {flags.FLAGS.workdir}; colour specialisation {colour}")


if __name__ == "__main__":
  cli.run(main, required=["workdir"])
