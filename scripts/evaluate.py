"""Top-1 and top-5 accuracy of a run's newest checkpoint, as the paper tests: on the centre crop and on the paper's
10 crops (four corners and centre, and their mirrors, averaging the softmax):

  python scripts/evaluate.py --workdir runs/alexnet_2gpu [--crops 1,10] [--config.key=value …]

The run's directory says the rest (run.json: its config, classes and statistics); --config.KEY=VALUE changes how it
is read (e.g. --config.dataset.data_dir where the data lies now). A run trained without mirrored crops is scored on
the 5 unmirrored crops in place of 10: a mirror is an image it never saw. Prints a table and writes
eval_<step>.json into the workdir (--out elsewhere, but not over one of the run's own files).
"""

import json
import os
import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings

cli.define_run_config()
flags.DEFINE_list("crops", None, "1: centre crop; 5: four corners and centre; 10: those and their mirrors, the "
                  "paper's (default: 1 and the run's many-crop, 10 where it trained with flips, else 5)")
flags.DEFINE_string("out", None, "where to write the results (default: WORKDIR/eval_<step>.json)")


def main(argv):
  del argv
  config = flags.FLAGS.config
  apply_process_settings(config)
  from alexnet_jax.training import workdirs  # noqa: PLC0415
  from alexnet_jax.training import distributed  # noqa: PLC0415
  from alexnet_jax.training.evaluation import evaluate_checkpoint  # noqa: PLC0415
  from alexnet_jax.training.train import CROPS, multi_crop  # noqa: PLC0415

  crops = flags.FLAGS.crops or ["1", str(multi_crop(config))]
  if not all(c.isdigit() and int(c) in CROPS for c in crops):
    sys.exit(f"error: --crops takes {', '.join(map(str, CROPS))}, got {','.join(crops)}")
  crops = [int(c) for c in crops]
  if 10 in crops and multi_crop(config) != 10:
    print("note: this run trained without mirrored crops, so half of the 10 crops are images it never saw; "
          "5 crops is its many-crop evaluation")
  try:
    if flags.FLAGS.out:  # the default, eval_<step>.json, is a new file beside the run's
      workdirs.check_output("--out", flags.FLAGS.out, flags.FLAGS.workdir)
    distributed.initialize(config)  # as many processes as trained it, or one
    step, results = evaluate_checkpoint(flags.FLAGS.workdir, config, crops)
  except ValueError as e:
    sys.exit(f"error: {e}")
  if not distributed.is_writer():
    return
  print(f"{'crops':>5} {'images':>8} {'top-1 accuracy':>15} {'top-5 accuracy':>15} {'loss':>8}   (step {step})")
  for n, r in results.items():
    print(f"{n:>5} {r['count']:>8,} {r['top1']:>15.4f} {r['top5']:>15.4f} {r['loss']:>8.4f}")
  path = flags.FLAGS.out or os.path.join(flags.FLAGS.workdir, f"eval_{step}.json")
  written = dict(step=step, dataset=config.dataset.name, split=config.dataset.eval_split, results=results)
  try:
    workdirs.write_file(path, json.dumps(written, indent=1).encode())
  except ValueError as e:
    sys.exit(f"error: {e}; the results are above")
  print(f"wrote {path}")


if __name__ == "__main__":
  cli.run(main, required=["workdir"])
