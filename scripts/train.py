"""Trains a network: python scripts/train.py --config configs/demo.py [--config.key=value …] [--workdir DIR]."""

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from alexnet_jax.config import start

config_flags.DEFINE_config_file("config", None, "a configs/*.py file", lock_config=True)
flags.DEFINE_string("workdir", None, "checkpoints, TensorBoard files and metrics.jsonl (default: runs/<config>)")


def main(argv):
  del argv
  config = start(flags.FLAGS.config)
  from alexnet_jax.train import train_and_evaluate  # noqa: PLC0415

  config_file = config_flags.get_config_filename(flags.FLAGS["config"])
  workdir = flags.FLAGS.workdir or os.path.join("runs", os.path.basename(config_file).removesuffix(".py"))
  try:
    metrics = train_and_evaluate(config, workdir)
  except ValueError as e:  # bad config, data or checkpoint: one line, no traceback
    sys.exit(f"error: {e}")
  print(f"final eval: top-1 {metrics['top1']:.4f}  top-5 {metrics['top5']:.4f}  loss {metrics['loss']:.4f}")


def parse_flags(argv):
  """absl's parser, with a mistyped --config.key reported in one line instead of a traceback."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError, TypeError, ValueError, flags.Error) as e:
    message = str(e).replace("\\'", "'").replace("\\n", " ")  # ml_collections nests a repr in its errors
    if len(message) > 1 and message[0] == message[-1] == "'":
      message = message[1:-1]
    sys.exit(f"error: bad flag: {' '.join(message.split())}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=parse_flags)
