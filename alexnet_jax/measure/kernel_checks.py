"""The kernels' checks at AlexNet's shapes (or any table's), shared by scripts/dev/verify_kernels.py and
tests/test_gpu_*.py.

Each op of each layer (one tower's share) runs forward and backward through `ops` with a kernel backend, in
bfloat16, in float32 with tf32 tensor cores (JAX's default precision) and in float32 with 'highest' (exact float32
products), against XLA in float64 on the same inputs, rounded first to the precision's dtype. The float64 result is
rounded to the output's dtype too, so that the error ‖out − ref‖/‖ref‖ measures the kernels' arithmetic, not the
output's own rounding (which alone reads ~1.66e-3 in bfloat16 against an unrounded reference). Against a rounded
reference each bfloat16 element is either equal or one ulp (2^-8 to 2^-7 of its size) off, where the kernel's float32
result and the exact value round to different neighbours, so the error is at most 2^-7·√(share of such elements):
the bound 2^-8 fails a kernel for which a quarter of its elements round the other way, far more than float32
accumulation explains. Where a window's maximum is tied in bfloat16, the gradient may go to another input.
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from alexnet_jax import ops
from alexnet_jax.measure.kernel_shapes import tower_convs, tower_maps
from alexnet_jax.network import layers
from alexnet_jax.network.layers import kind_of
from alexnet_jax.network.table import Table, alexnet

BOUNDS = {"bfloat16": 2.0 ** -8, "tf32": 5e-3, "float32": 1e-3}
PRECISIONS = {"bfloat16": ("bfloat16", "default"), "tf32": ("float32", "default"), "float32": ("float32", "highest")}


@dataclasses.dataclass(frozen=True)
class Case:
  name: str  # the layer, e.g. 'conv1', 'pool2'
  op: Callable  # op(*arrays, backend=…)
  shapes: tuple  # the operands' shapes: image (and filters, bias)
  # reference(*arrays, dtype=…) in float64 where the kernel rounds an intermediate to the compute dtype before it
  # decides something: a pool after an LRN compares the normalised values as rounded. Default: op's XLA reference.
  reference: Callable | None = None


def cases(batch: int) -> list[Case]:
  return table_cases(alexnet(), 224, batch)


def table_cases(table: Table, image_size: int, batch: int) -> list[Case]:
  """Each conv, pool and LRN of a table at one tower's shapes, with the layer's own geometry and constants."""
  found = []
  following = {a.name: b for a, b in zip(table.layers, table.layers[1:])}
  preceding = {b.name: a for a, b in zip(table.layers, table.layers[1:])}
  for s in tower_convs(table, image_size, batch):
    # No ReLU here: where a float32 output lands within rounding of zero, its mask (and so its gradient) may
    # differ from float64's, which measures the mask, not the kernels. The fused ReLU is tested on the CPU.
    conv = functools.partial(ops.conv2d, stride=s.stride, padding=s.padding)
    found.append(Case(s.name, conv, (s.x, s.w, (s.w[-1],))))
    if s.name in preceding and preceding[s.name].kind == "conv":
      # As the model runs a conv after a conv: the images a ReLU's output, whose mask the data gradient's kernel
      # applies; the mask reads the images themselves, exact everywhere.
      found.append(Case(f"{s.name}+relu_in", functools.partial(_after_a_relu, conv), (s.x, s.w, (s.w[-1],))))
  for name, (layer, shape) in tower_maps(table, image_size, batch).items():
    kind = kind_of(layer)
    found.append(Case(name, kind.op(layer), (shape,)))
    if not kind.fuses:
      continue
    # With the ReLU of the conv before it, as the model runs it; its mask reads the input itself, exact everywhere.
    found.append(Case(f"{name}+relu", kind.op(layer, relu=True), (shape,)))
    pool = following.get(name)
    if pool is not None and pool.kind in kind.fuses:  # as the model runs them: one op (ops.lrn_max_pool)
      lrn = dict(layers.lrn.constants(layer), groups=1, relu=True)
      fused = functools.partial(ops.lrn_max_pool, size=pool.size, stride=pool.stride, **lrn)
      reference = functools.partial(_pool_of_rounded_lrn, lrn=lrn, size=pool.size, stride=pool.stride)
      found.append(Case(f"{name}+relu+{pool.name}", fused, (shape,), reference))
  return found


def _after_a_relu(conv, x, w, b, *, backend):
  """conv of ReLU(x) as the model runs a conv after a conv: the images clamped with their gradient passed whole, so
  that the mask x > 0 is the conv's alone to apply."""
  clamped = x + lax.stop_gradient(jax.nn.relu(x) - x)
  return conv(clamped, w, b, relu_in=True, backend=backend)


def _pool_of_rounded_lrn(x, *, dtype, lrn, size, stride):
  normalised = ops.lrn(x, backend="xla", **lrn)
  return ops.max_pool(normalised.astype(dtype).astype(x.dtype), size=size, stride=stride, backend="xla")


def rel(out, ref) -> float:
  out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def check(case: Case, backend: str, key, precisions=tuple(PRECISIONS)) -> list[dict]:
  """One row per precision (labels of PRECISIONS): errors of the forward and of each gradient, and whether all are
  finite and within the bound."""
  keys = jax.random.split(key, len(case.shapes) + 1)
  scales = [30.0 if case.name.startswith("lrn") else 1.0, 0.05, 1.0]  # LRN inputs large enough to be normalised
  args = [jax.random.normal(k, s, jnp.float32) * c for k, s, c in zip(keys, case.shapes, scales)]
  out_shape = jax.eval_shape(lambda *a: case.op(*a, backend="xla"), *args).shape
  cot = jax.random.normal(keys[-1], out_shape, jnp.float32)
  rows = []
  for label in precisions:
    dtype, precision = PRECISIONS[label]
    # The image and the filters go in at the compute dtype (conv2d casts filters to the image's dtype).
    rounded = [a.astype(dtype) if i < 2 else a for i, a in enumerate(args)]
    with jax.default_matmul_precision(precision):
      y, vjp = jax.vjp(lambda *a: case.op(*a, backend=backend), *rounded)
      grads = vjp(cot.astype(dtype))
    with jax.enable_x64(True):
      as64 = lambda a: jnp.asarray(np.asarray(a, np.float64))  # noqa: E731
      reference = (functools.partial(case.reference, dtype=dtype) if case.reference else
                   functools.partial(case.op, backend="xla"))
      ref_y, ref_vjp = jax.vjp(reference, *map(as64, rounded))
      ref_g = ref_vjp(as64(cot.astype(dtype)))
    outs = dict(zip(["fwd", "dx", "dw", "db"], [y, *grads]))
    refs = dict(zip(["fwd", "dx", "dw", "db"], [ref_y, *ref_g]))
    errors = {n: rel(o, np.asarray(refs[n]).astype(o.dtype)) for n, o in outs.items()}
    finite = all(np.isfinite(np.asarray(v, np.float32)).all() for v in outs.values())
    worst = max(errors.values())
    rows.append(dict(layer=case.name, precision=label, errors=errors, worst=worst, finite=finite,
                     ok=bool(finite and worst <= BOUNDS[label])))
  return rows
