"""Top-1 and top-5 error of a workdir's newest checkpoint, as the paper tests: on centre crops and on 10 crops
(four corners and centre, and their mirrors, averaging the softmax):

  python scripts/evaluate.py --config configs/alexnet_2gpu.py --workdir runs/alexnet_2gpu [--config.key=value …]

Prints a table and writes eval_<step>.json into the workdir.
"""

import json
import os
import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings

cli.define_config("the configs/*.py file the workdir was trained with")
flags.DEFINE_string("workdir", None, "the training run's workdir (its checkpoints/ are read)")
flags.DEFINE_list("crops", ["1", "10"], "1: centre crop; 10: the paper's 10 crops")


def main(argv):
  del argv
  config = flags.FLAGS.config
  apply_process_settings(config)
  from alexnet_jax.training import distributed  # noqa: PLC0415
  from alexnet_jax.training.loop import evaluate_checkpoint  # noqa: PLC0415

  try:
    distributed.initialize(config)  # as many processes as trained it, or one
    step, results = evaluate_checkpoint(config, flags.FLAGS.workdir, [int(c) for c in flags.FLAGS.crops])
  except ValueError as e:
    sys.exit(f"error: {e}")
  if not distributed.is_writer():
    return
  path = os.path.join(flags.FLAGS.workdir, f"eval_{step}.json")
  with open(path, "w") as f:
    json.dump(dict(step=step, config=config.dataset.name, results=results), f, indent=1)
  print(f"{'crops':>5} {'images':>8} {'top-1 error':>12} {'top-5 error':>12} {'loss':>8}   (step {step})")
  for crops, r in results.items():
    print(f"{crops:>5} {r['count']:>8,} {1 - r['top1']:>12.4f} {1 - r['top5']:>12.4f} {r['loss']:>8.4f}")
  print(f"wrote {path}")


if __name__ == "__main__":
  cli.run(main, required=["config", "workdir"])
