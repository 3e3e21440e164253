"""Checks the Triton kernels on a GPU through the JAX primitives (kernel_backend='triton') against float64.

  python scripts/dev/verify_kernels.py [--batch 128] [--backend triton] [--json OUT.json] [--skip_model]
      [--config configs/alexnet_2gpu.py --config.key=value …]

For every layer shape of the config's network (one tower's share; AlexNet's without --config): conv forward, data
and filter gradient, max-pool and LRN forward and backward, in bfloat16 and float32 (with tf32 and with 'highest'
precision), error ‖out − ref‖/‖ref‖ against XLA in float64 rounded to the output's dtype
(alexnet_jax/measure/kernel_checks.py: the cases, and why these bounds). Then the model's train step on the devices
present with the kernel backend against 'xla'. Prints a table; writes JSON; exits non-zero when a bound is missed
(bf16 ≤ 2^-8, tf32 ≤ 5e-3, float32 ≤ 1e-3; the step's loss within 1 %, its update within 5e-2).
tests/test_gpu_kernels.py runs the same kernel checks under pytest.
"""

import functools
import json
import sys

import jax
import numpy as np
from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings, network_table, paper_config
from alexnet_jax.measure import kernel_checks

cli.define_config("the model check's config (default: the paper's, in bfloat16)")
flags.DEFINE_integer("batch", 128, "the batch of the kernel checks' layer shapes")
flags.DEFINE_string("backend", "triton", "the kernels' backend; 'auto' or 'interpret' check the plumbing off a GPU")
flags.DEFINE_string("json", None, "write the rows here")
flags.DEFINE_bool("skip_model", False, "check the kernels only")


def check_model(config, backend, key):
  """The config's train step with kernel_backend `backend` and 'xla' from the same state and batch: the losses and
  the relative difference of the parameter updates."""
  from alexnet_jax.data.device_batches import random_batch  # noqa: PLC0415
  from alexnet_jax.training import train  # noqa: PLC0415

  results = {}
  classes = config.dataset.num_classes or 1000
  for name in ("xla", backend):
    c = config.copy_and_resolve_references()
    c.kernel_backend = name
    setup = train.make_setup(c, classes, c.dataset.num_train_examples or 1_281_167)
    state = train.create_train_state(setup, jax.random.key(0))
    batch = setup.batch_layout.put(random_batch(c.batch_size, c.image_size, classes))
    new, m = jax.jit(functools.partial(train.train_step, setup=setup))(state, batch, key)
    delta = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), new.params,
                         state.params)
    results[name] = (float(m["loss"]) / float(m["count"]), delta)
  flat = lambda t: np.concatenate([np.ravel(v) for v in jax.tree.leaves(t)])  # noqa: E731
  return dict(mesh=dict(setup.mesh.shape), dtype=config.dtype, batch=config.batch_size, loss_xla=results["xla"][0],
              loss_kernels=results[backend][0],
              update_rel_error=kernel_checks.rel(flat(results[backend][1]), flat(results["xla"][1])))


def main(argv):
  del argv
  args = flags.FLAGS
  config = paper_config() if args.config is None else args.config
  apply_process_settings(config)
  if args.config is None:  # the paper's two towers in bfloat16, on as many devices as there are
    config.dtype, config.mesh.model = "bfloat16", min(2, jax.device_count())
  key = jax.random.key(0)
  table = network_table(config, config.dataset.num_classes or 1000)
  rows = [row for case in kernel_checks.table_cases(table, config.image_size, args.batch)
          for row in kernel_checks.check(case, args.backend, key)]
  model = None if args.skip_model else check_model(config, args.backend, key)
  print(f"\n{'layer':8} {'precision':9} {'fwd':>9} {'dx':>9} {'dw':>9} {'db':>9}  ok")
  for r in rows:
    e = r["errors"]
    cells = " ".join(f"{e[k]:9.2e}" if k in e else f"{'':9}" for k in ("fwd", "dx", "dw", "db"))
    print(f"{r['layer']:8} {r['precision']:9} {cells}  {'yes' if r['ok'] else 'NO'}")
  if model:
    print(f"\ntrain step, {model['dtype']}, batch {model['batch']}, mesh {model['mesh']}: loss xla "
          f"{model['loss_xla']:.5f} {args.backend} {model['loss_kernels']:.5f}; parameter update "
          f"‖{args.backend} − xla‖/‖xla‖ = {model['update_rel_error']:.2e}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(ops=rows, model=model, backend=args.backend, device=jax.devices()[0].device_kind), f, indent=1)
  model_ok = model is None or (abs(model["loss_xla"] - model["loss_kernels"]) < 1e-2 * abs(model["loss_xla"])
                               and model["update_rel_error"] < 5e-2)
  sys.exit(0 if all(r["ok"] for r in rows) and model_ok else 1)


if __name__ == "__main__":
  cli.run(main)
