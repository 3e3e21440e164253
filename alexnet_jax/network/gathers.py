"""A bfloat16 all-gather across the towers whose transpose, the gradient's reduce-scatter, runs in float32 on CPU.

XLA:CPU (jaxlib 0.11.2) aborts compiling a bf16 reduce-scatter. The transpose chooses per lowering platform, so that
a program exported for GPU or TPU from a CPU host keeps bf16 (`wide`, model.float32_scatters, widens it everywhere);
and it chooses inside the backward pass: around the whole gather, platform_dependent's transposed branch index would
be a forward residual, which XLA does not fold away, leaving a conditional in the compiled backward pass.

A linear primitive rather than a custom VJP, which forward mode cannot go through: its JVP is itself on the tangent,
so jvp, linearize and Hessian-vector products of the split network compose with it.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

GATHER = Primitive("tower_all_gather")


def all_gather(x, axis_name: str, axis: int, *, wide: bool = False):
  """lax.all_gather(x, axis_name, axis=axis, tiled=True, to='varying'); transposed, a reduce-scatter in float32 on
  CPU and in x's dtype elsewhere (wide: in float32 everywhere)."""
  if axis_name not in jax.typeof(x).manual_axis_type.varying:  # a collective's operand varies over its axis
    x = lax.pcast(x, axis_name, to="varying")
  return GATHER.bind(x, axis_name=axis_name, axis=axis, size=lax.axis_size(axis_name), wide=wide)


def _abstract_eval(x, *, axis, size, **_):
  shape = list(x.shape)
  shape[axis] *= size
  return x.update(shape=tuple(shape), weak_type=False)  # it varies over the axes x does


def _gather(x, *, axis_name, axis, **_):
  return lax.all_gather(x, axis_name, axis=axis, tiled=True, to="varying")


def _transpose(ct, x, *, axis_name, axis, wide, **_):
  scatter = lambda c: lax.psum_scatter(c, axis_name, scatter_dimension=axis, tiled=True)  # noqa: E731
  widened = lambda c: scatter(c.astype(jnp.float32)).astype(c.dtype)  # noqa: E731
  return [widened(ct) if wide else lax.platform_dependent(ct, cpu=widened, default=scatter)]


def _batch(operands, dims, *, axis, **params):
  ((x,), (d,)) = operands, dims
  return GATHER.bind(jnp.moveaxis(x, d, 0), axis=axis + 1, **params), 0


GATHER.def_abstract_eval(_abstract_eval)
mlir.register_lowering(GATHER, mlir.lower_fun(_gather, multiple_results=False))
ad.deflinear2(GATHER, _transpose)
batching.primitive_batchers[GATHER] = _batch
