"""Writes a run's pictures: python scripts/visualize.py --config configs/X.py [--config.key=value …] --workdir DIR.

curves.png (loss, top-1, top-5 against steps) and conv1_filters.png (one grid of filters per tower, titled with its
colour specialisation), from the newest checkpoint and metrics.jsonl in DIR. train.py writes the same at its end.
"""

import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "the configs/*.py file the run was trained with", lock_config=True)
flags.DEFINE_string("workdir", None, "the run's workdir")


def main(argv):
  del argv
  config = flags.FLAGS.config
  logging.set_verbosity(logging.WARNING)
  if config.cpu_devices:
    jax.config.update("jax_num_cpu_devices", config.cpu_devices)
  from alexnet_jax import checkpoints, train  # noqa: PLC0415
  from alexnet_jax.config import validate  # noqa: PLC0415
  from alexnet_jax.data import get_dataset  # noqa: PLC0415

  try:
    config = validate(config)
    dataset = get_dataset(config)
    setup = train.make_setup(config, dataset.num_classes, dataset.num_train)
    manager = checkpoints.manager(flags.FLAGS.workdir, config)
    if manager.latest_step() is None:
      raise ValueError(f"no checkpoint in {flags.FLAGS.workdir}")
    state, _ = checkpoints.restore(manager, train.create_train_state(setup, config, jax.random.key(config.seed)))
    colour = train.write_pictures(flags.FLAGS.workdir, setup, state)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")
  print(f"wrote curves.png and conv1_filters.png in {flags.FLAGS.workdir}; colour specialisation {colour}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
