"""Top-1 and top-5 error of a run's newest checkpoint, as the paper tests: on centre crops and on 10 crops (four
corners and centre, and their mirrors, averaging the softmax):

  python scripts/evaluate.py --workdir runs/alexnet_2gpu [--crops 1,10] [--config.key=value …]

The run's directory says everything else (run.json: its config, classes and statistics); --config.KEY=VALUE changes
how it is read (e.g. --config.dataset.data_dir where the data lies now, --config.eval_batch_size). Prints a table
and writes eval_<step>.json into the workdir (--out elsewhere).
"""

import json
import os
import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings

cli.define_run_config()
flags.DEFINE_list("crops", ["1", "10"], "1: centre crop; 10: the paper's 10 crops")
flags.DEFINE_string("out", None, "where to write the results (default: WORKDIR/eval_<step>.json)")


def main(argv):
  del argv
  config = flags.FLAGS.config
  apply_process_settings(config)
  from alexnet_jax.training import distributed  # noqa: PLC0415
  from alexnet_jax.training.loop import evaluate_checkpoint  # noqa: PLC0415

  try:
    distributed.initialize(config)  # as many processes as trained it, or one
    step, results = evaluate_checkpoint(flags.FLAGS.workdir, config, [int(c) for c in flags.FLAGS.crops])
  except ValueError as e:
    sys.exit(f"error: {e}")
  if not distributed.is_writer():
    return
  print(f"{'crops':>5} {'images':>8} {'top-1 error':>12} {'top-5 error':>12} {'loss':>8}   (step {step})")
  for crops, r in results.items():
    print(f"{crops:>5} {r['count']:>8,} {1 - r['top1']:>12.4f} {1 - r['top5']:>12.4f} {r['loss']:>8.4f}")
  path = flags.FLAGS.out or os.path.join(flags.FLAGS.workdir, f"eval_{step}.json")
  try:
    with open(path, "w") as f:
      json.dump(dict(step=step, dataset=config.dataset.name, split=config.dataset.eval_split, results=results), f,
                indent=1)
  except OSError as e:
    sys.exit(f"error: cannot write {path}: {e.strerror or e}; the results are above")
  print(f"wrote {path}")


if __name__ == "__main__":
  cli.run(main, required=["workdir"])
