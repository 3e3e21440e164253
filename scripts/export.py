"""Exports a trained network, or its train step, as a portable jax.export artifact (alexnet_jax/export.py).

  python scripts/export.py --config configs/CONFIG.py [--config.key=value …] [--workdir DIR] --platforms cpu,tpu[,cuda]
      --out model.jaxexport [--function inference|train_step] [--input uint8|chwn] [--batch N]

'inference' (the default) puts the newest checkpoint's weights of --workdir (default runs/<config>) inside the
artifact: logits (N, classes) for uint8 images (N, S, S, 3) as the evaluation pipeline gives them ('uint8', S the
dataset's stored side), or for normalised CHWN crops (3, image_size, image_size, N) ('chwn'). 'train_step' needs no
checkpoint: (state, batch, key) → (state, metrics). N is --batch (default: the config's eval_batch_size, or batch_size
for a train step). The artifact runs on as many devices as the config's mesh has: --config.mesh.model=1
--config.mesh.data=1 makes a one-device artifact of the same numbers. 'cuda' with the Triton kernels can only be
exported beside a CUDA GPU, and the artifact then needs a GPU of that compute capability (README, Export).
"""

import os
import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings

cli.define_config("a configs/*.py file")
flags.DEFINE_string("workdir", None, "the run whose newest checkpoint is exported (default: runs/<config>)")
flags.DEFINE_list("platforms", None, "platforms to lower for: cpu, cuda, rocm, tpu")
flags.DEFINE_string("out", None, "the artifact's file")
flags.DEFINE_enum("function", "inference", ["inference", "train_step"], "what to export")
flags.DEFINE_enum("input", "uint8", ["uint8", "chwn"], "inference input: the pipeline's uint8 images or CHWN crops")
flags.DEFINE_integer("batch", 0, "images per call (default: the config's eval_batch_size, or batch_size)")


def write_artifact(config, args) -> str:
  """Writes the artifact; returns what it holds, in one line."""
  from alexnet_jax import export  # noqa: PLC0415  (after apply_process_settings)
  from alexnet_jax.config import validate  # noqa: PLC0415
  from alexnet_jax.data import get_dataset  # noqa: PLC0415
  from alexnet_jax.training import loop, train  # noqa: PLC0415  (after apply_process_settings)

  config = validate(config)
  if args.function == "inference":
    setup, dataset, state = loop.restore_newest(config, args.workdir or os.path.join("runs", cli.config_name()))
    exported = export.export_inference(setup, state.params, platforms=args.platforms, input_kind=args.input,
                                       batch_size=args.batch or config.eval_batch_size, size=dataset.size)
  else:
    dataset = get_dataset(config)
    setup = train.dataset_setup(config, dataset)
    exported = export.export_train_step(setup, platforms=args.platforms,
                                        batch_size=args.batch or config.batch_size, size=dataset.size)
  size = export.save(exported, args.out)
  mesh = " × ".join(f"{k} {v}" for k, v in setup.mesh.shape.items())
  return f"{args.out}: {export.describe(exported)}, mesh {mesh}, {size / 2**20:.1f} MiB"


def main(argv):
  del argv
  args = flags.FLAGS
  apply_process_settings(args.config)
  try:
    print(write_artifact(args.config, args))
  except ValueError as e:  # bad config, platforms, checkpoint or data: one line, no traceback
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  cli.run(main, required=["config", "platforms", "out"])
