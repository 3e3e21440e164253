"""Exports a run's trained network, or its train step, as a portable artifact (alexnet_jax/export.py, docs/export.md):

  python scripts/export.py --workdir DIR --out model.jaxexport [--platforms cpu[,cuda,tpu]]
      [--function inference|train_step] [--input uint8|chwn] [--batch N] [--mesh one|run] [--config.key=value …]

'inference' (the default) holds the newest checkpoint's weights and what the run says of itself (class names, pixel
statistics, stored size): logits (N, classes) for uint8 images (N, S, S, 3) as scripts/predict.py --artifact makes
them, or for normalised CHWN crops ('chwn'). 'train_step': (state, batch, key) → (state, metrics) of the run's config.
N is any batch unless --batch fixes it (a cuda program with the Triton kernels needs one). The artifact runs on one
device (--mesh run: on the run's mesh). 'cuda' with the Triton kernels is exported only beside a CUDA GPU, for GPUs
of its compute capability. --out may be in the workdir, but not one of the run's own files.
"""

import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings

cli.define_run_config()
flags.DEFINE_list("platforms", ["cpu"], "platforms to lower for: cpu, cuda, rocm, tpu")
flags.DEFINE_string("out", None, "the artifact's file")
flags.DEFINE_enum("function", "inference", ["inference", "train_step"], "what to export")
flags.DEFINE_enum("input", "uint8", ["uint8", "chwn"], "inference input: the pipeline's uint8 images or CHWN crops")
flags.DEFINE_integer("batch", 0, "images per call (default 0: any)")
flags.DEFINE_enum("mesh", "one", ["one", "run"], "the devices the artifact runs on: one, or the run's mesh")


def write_artifact(config, args) -> str:
  """Writes the artifact; returns what it holds, in one line."""
  from alexnet_jax import export  # noqa: PLC0415  (after apply_process_settings)
  from alexnet_jax.training import restore, workdirs  # noqa: PLC0415

  workdirs.check_output("--out", args.out, args.workdir)  # before anything is read: the run's files stay whole
  if args.mesh == "one":
    config.mesh.model, config.mesh.data = 1, 1
  described, setup, state = restore.restore_newest(args.workdir, config)
  batch = args.batch or None
  if args.function == "inference":
    exported = export.export_inference(setup, state.params, platforms=args.platforms, input_kind=args.input,
                                       batch_size=batch, size=described.size)
    facts = export.facts_of(described, args.input)
  else:
    exported = export.export_train_step(setup, platforms=args.platforms, batch_size=batch, size=described.size)
    facts = dict(function="train_step", size=described.size, image_size=described.image_size)
  size = export.save(exported, args.out, facts | dict(step=int(state.step)))
  mesh = " × ".join(f"{k} {v}" for k, v in setup.mesh.shape.items())
  return f"{args.out}: {export.describe(exported)}, mesh {mesh}, {size / 2**20:.1f} MiB"


def main(argv):
  del argv
  args = flags.FLAGS
  apply_process_settings(args.config)
  try:
    print(write_artifact(args.config, args))
  except ValueError as e:  # bad config, platforms, checkpoint or path: one line, no traceback
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  cli.run(main, required=["workdir", "out"])
