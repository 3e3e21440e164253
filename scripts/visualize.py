"""Writes a run's pictures: python scripts/visualize.py --workdir DIR [--config.key=value …].

curves.png (loss, accuracy and the learning rate against steps, titled with the run) and conv1_filters.png (the
first conv layer's filters, each scaled to its own contrast, a block per tower) and conv1_learned.png (what training
changed in them: each filter minus its random start, which a short run's filters are mostly made of), from the
newest checkpoint and metrics.jsonl in DIR. train.py writes the same at its end.
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
  from alexnet_jax.training import loop, restore  # noqa: PLC0415

  try:
    _, setup, state = restore.restore_newest(flags.FLAGS.workdir, config)
    colour = loop.write_pictures(flags.FLAGS.workdir, setup, state, config)
  except (ValueError, OSError) as e:
    sys.exit(f"error: {e}")
  towers = ", ".join(f"{k.removeprefix('colour_tower_')} {v:.3f}" for k, v in colour.items())
  print(f"wrote curves.png, conv1_filters.png and conv1_learned.png in {flags.FLAGS.workdir}; conv1 colour "
        f"specialisation: {towers}")


if __name__ == "__main__":
  cli.run(main, required=["workdir"])
