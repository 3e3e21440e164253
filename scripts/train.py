"""Trains a network: python scripts/train.py --config configs/demo.py [--config.key=value …] [--workdir DIR].

Several processes run the same command, each with --config.distributed.process_id=I (and the run's
--config.distributed.coordinator=HOST:PORT and num_processes=N), or under Slurm/Open MPI with
--config.distributed.detect=true: docs/multihost.md."""

import gc
import os
import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings

cli.define_config("a configs/*.py file")
flags.DEFINE_string("workdir", None, "checkpoints, TensorBoard files and metrics.jsonl (default: runs/<config>)")


def main(argv):
  del argv
  config = flags.FLAGS.config
  apply_process_settings(config)
  from alexnet_jax.training import distributed, guard  # noqa: PLC0415
  from alexnet_jax.training.loop import train_and_evaluate  # noqa: PLC0415

  workdir = flags.FLAGS.workdir or os.path.join("runs", cli.config_name())
  try:
    distributed.initialize(config)  # a run of several processes (docs/multihost.md); nothing for one
    metrics = train_and_evaluate(config, workdir)
  except ValueError as e:  # bad config, data, checkpoint or workdir, or divergence: one line, no traceback
    metrics, line, status = None, f"error: {e}", 1
  except guard.Interrupted as e:  # SIGTERM, SIGINT or SIGHUP: the step saved, the status a signal's
    metrics, line, status = None, f"\n{e}", e.exit_status
  if metrics is None:
    gc.collect()  # the failed run's frames go, and with them its progress bar, which prints its last line now
    print(line, file=sys.stderr)
    sys.exit(status)
  print(f"final eval: top-1 {metrics['top1']:.4f}  top-5 {metrics['top5']:.4f}  loss {metrics['loss']:.4f}")


if __name__ == "__main__":
  cli.run(main, required=["config"])
