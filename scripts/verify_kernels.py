"""Checks the Triton kernels on a GPU through the JAX primitives (kernel_backend='triton') against float64.

  python scripts/verify_kernels.py [--batch 128] [--json OUT.json]

For every AlexNet layer shape (one tower's share): conv forward, data and filter gradient, max-pool and LRN
forward and backward, in bfloat16 and float32 (float32 with tf32 tensor cores, JAX's default, and with 'highest'
= exact float32 products), error ‖out − ref‖/‖ref‖ against XLA in float64. Then the whole model's train step on the
devices present (two GPUs: the paper's split) with kernel_backend='triton' against 'xla'. Prints a table; writes
JSON; exits non-zero when a bound is missed (bf16 ≤ 1e-2, tf32 ≤ 5e-3, float32 ≤ 1e-3).
"""

import argparse
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from alexnet_jax import ops
from alexnet_jax.layer_shapes import alexnet_convs, alexnet_maps

BACKEND = "triton"
BOUNDS = {"bfloat16": 1e-2, "tf32": 5e-3, "float32": 1e-3}


def rel(out, ref):
  out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def op_cases(batch):
  for s in alexnet_convs(batch):
    # No ReLU here: where a float32 output lands within rounding of zero, its mask (and so its gradient) may
    # differ from float64's, which measures the mask, not the kernels. The fused ReLU is tested on the CPU.
    conv = functools.partial(ops.conv2d, stride=s.stride, padding=s.padding)
    yield s.name, conv, (s.x, s.w, (s.w[-1],))
  for name, shape in alexnet_maps(batch).items():
    if name.startswith("pool"):
      yield name, ops.max_pool, (shape,)
    else:
      yield name, functools.partial(ops.lrn, groups=1), (shape,)


def check_ops(batch, key):
  """Each op in each precision against float64 XLA on the same inputs, rounded to the precision first: what is
  left is the kernels' own arithmetic (and, for bf16, which max a window picks or where a ReLU cuts)."""
  rows = []
  for name, op, shapes in op_cases(batch):
    keys = jax.random.split(key, len(shapes) + 1)
    scales = [30.0 if name.startswith("lrn") else 1.0, 0.05, 1.0]  # LRN inputs large enough to be normalised
    args = [jax.random.normal(k, s, jnp.float32) * c for k, s, c in zip(keys, shapes, scales)]
    out_shape = jax.eval_shape(lambda *a: op(*a, backend="xla"), *args).shape
    cot = jax.random.normal(keys[-1], out_shape, jnp.float32)
    for dtype, precision in (("bfloat16", "default"), ("float32", "default"), ("float32", "highest")):
      label = "bfloat16" if dtype == "bfloat16" else ("tf32" if precision == "default" else "float32")
      # The image and the filters go in at the compute dtype (conv2d casts filters to the image's dtype).
      rounded = [a.astype(dtype) if i < 2 else a for i, a in enumerate(args)]
      with jax.default_matmul_precision(precision):
        y, vjp = jax.vjp(lambda *a: op(*a, backend=BACKEND), *rounded)
        grads = vjp(cot.astype(dtype))
      with jax.enable_x64(True):
        as64 = lambda a: jnp.asarray(np.asarray(a, np.float64))  # noqa: E731
        ref_y, ref_vjp = jax.vjp(lambda *a: op(*a, backend="xla"), *map(as64, rounded))
        ref_g = ref_vjp(as64(cot.astype(dtype)))
      errs = {"fwd": rel(y, ref_y)}
      names = ["dx", "dw", "db"] if name.startswith("conv") else ["dx"]
      errs |= {n: rel(g, r) for n, g, r in zip(names, grads, ref_g)}
      finite = all(np.isfinite(np.asarray(v, np.float32)).all() for v in [y, *grads])
      worst = max(errs.values())
      rows.append(dict(layer=name, precision=label, errors=errs, worst=worst, finite=finite,
                       ok=bool(finite and worst <= BOUNDS[label])))
  return rows


def check_model(key):
  from alexnet_jax import train  # noqa: PLC0415
  from alexnet_jax.config import paper_config  # noqa: PLC0415

  results = {}
  for backend in ("xla", "triton"):
    config = paper_config()
    config.dataset.name, config.dtype, config.kernel_backend = "procedural", "bfloat16", backend if backend == "xla" else BACKEND
    config.mesh.model = min(2, jax.device_count())
    setup = train.make_setup(config, 1000, 1_281_167)
    state = train.create_train_state(setup, config, jax.random.key(0))
    batch = train.put_batch(setup.mesh, train.random_batch(128, 224, 1000))
    step = jax.jit(functools.partial(train.train_step, setup=setup))
    new, m = step(state, batch, key)
    delta = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), new.params,
                         state.params)
    results[backend] = (float(m["loss"]) / 128, delta)
  flat = lambda t: np.concatenate([np.ravel(v) for v in jax.tree.leaves(t)])  # noqa: E731
  return dict(mesh=dict(setup.mesh.shape), loss_xla=results["xla"][0], loss_triton=results["triton"][0],
              update_rel_error=rel(flat(results["triton"][1]), flat(results["xla"][1])))


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--json")
  parser.add_argument("--backend", default="triton", help="'auto' or 'interpret' check the plumbing off a GPU")
  parser.add_argument("--skip-model", action="store_true")
  args = parser.parse_args()
  global BACKEND
  BACKEND = args.backend
  key = jax.random.key(0)
  rows = check_ops(args.batch, key)
  model = None if args.skip_model else check_model(key)
  print(f"\n{'layer':8} {'precision':9} {'fwd':>9} {'dx':>9} {'dw':>9} {'db':>9}  ok")
  for r in rows:
    e = r["errors"]
    cells = " ".join(f"{e[k]:9.2e}" if k in e else f"{'':9}" for k in ("fwd", "dx", "dw", "db"))
    print(f"{r['layer']:8} {r['precision']:9} {cells}  {'yes' if r['ok'] else 'NO'}")
  if model:
    print(f"\ntrain step, bf16, mesh {model['mesh']}: loss xla {model['loss_xla']:.5f} triton "
          f"{model['loss_triton']:.5f}; parameter update ‖triton − xla‖/‖xla‖ = {model['update_rel_error']:.2e}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(ops=rows, model=model, device=jax.devices()[0].device_kind), f, indent=1)
  model_ok = model is None or (abs(model["loss_xla"] - model["loss_triton"]) < 1e-2 * abs(model["loss_xla"])
                               and model["update_rel_error"] < 5e-2)
  sys.exit(0 if all(r["ok"] for r in rows) and model_ok else 1)


if __name__ == "__main__":
  main()
