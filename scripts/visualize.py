"""Writes a run's pictures: python scripts/visualize.py --config configs/X.py [--config.key=value …] --workdir DIR.

curves.png (loss, top-1, top-5 against steps) and conv1_filters.png (one grid of filters per tower, titled with its
colour specialisation), from the newest checkpoint and metrics.jsonl in DIR. train.py writes the same at its end.
"""

import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings

cli.define_config("the configs/*.py file the run was trained with")
flags.DEFINE_string("workdir", None, "the run's workdir")


def main(argv):
  del argv
  config = flags.FLAGS.config
  apply_process_settings(config)
  from alexnet_jax.training import loop  # noqa: PLC0415

  try:
    setup, _, state = loop.restore_newest(config, flags.FLAGS.workdir)
    colour = loop.write_pictures(flags.FLAGS.workdir, setup, state)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")
  print(f"wrote curves.png and conv1_filters.png in {flags.FLAGS.workdir}; colour specialisation {colour}")


if __name__ == "__main__":
  cli.run(main, required=["config", "workdir"])
