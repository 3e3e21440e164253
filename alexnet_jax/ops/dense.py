"""Fully-connected layers on (features, images) activations, cuda-convnet's layout after the convs."""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from alexnet_jax.ops.backend import check_backend


def dense_reference(x, w, b=None, *, relu=False, out_dtype=None):
  """XLA reference: y = wᵀx (+ b) in x's dtype, as conv2d_reference: the GEMM (cuBLAS) accumulates in float32
  inside. out_dtype (float32 for the split='sum' layer's partial sums) keeps the result wider than x: the GEMM still
  runs on x's dtype, and so do both GEMMs of its gradient (see _wide_dot).

  w (T, F_in, F_out) holds T towers that read the same x: y stacks their outputs, tower t's F_out rows after tower
  t − 1's. One batched GEMM: its filter gradient comes out stacked as the weights are, where T GEMMs' gradients would
  be concatenated into the float32 parameters' shape every step (fc6 and fc7 on one GPU: 218 MB)."""
  w = w.astype(x.dtype)
  out_dtype = x.dtype if out_dtype is None else jnp.promote_types(x.dtype, out_dtype)
  if w.ndim == 3:
    if out_dtype != x.dtype:
      raise ValueError("dense: towers' outputs come in x's dtype")
    y = lax.dot_general(w, jnp.broadcast_to(x, (w.shape[0], *x.shape)), _TOWERS).reshape(-1, x.shape[1])
  elif out_dtype == x.dtype:
    y = lax.dot_general(w, x, _FORWARD)
  else:
    y = _wide_dot(w, x, out_dtype)
  if b is not None:
    y = y + b.astype(y.dtype)[:, None]
  return jax.nn.relu(y) if relu else y


_FORWARD = (((0,), (0,)), ((), ()))  # w (F_in, F_out) · x (F_in, N) → (F_out, N)
_TOWERS = (((1,), (1,)), ((0,), (0,)))  # w (T, F_in, F_out) · x (T, F_in, N) → (T, F_out, N)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _wide_dot(w, x, out_dtype):
  """wᵀx on w's and x's dtype with a wider result. Differentiated as JAX would, the wide cotangent would meet the
  narrow operands in mixed-dtype GEMMs that XLA runs in float32 (TF32 on a GPU); rounded to x's dtype first, like
  every other layer's gradient, they run on its tensor cores."""
  return lax.dot_general(w, x, _FORWARD, preferred_element_type=out_dtype)


def _wide_dot_jvp(out_dtype, primals, tangents):
  # Each tangent GEMM on x's dtype, widened after: reverse mode transposes the widening into the rounding of the
  # cotangent to x's dtype before either gradient GEMM. A zero tangent (symbolic) costs no GEMM.
  (w, x), (dw, dx) = primals, tangents
  y = _wide_dot(w, x, out_dtype)
  narrow = lambda a, b: lax.dot_general(a, b, _FORWARD).astype(out_dtype)  # noqa: E731
  terms = [narrow(dw, x)] if not isinstance(dw, SymbolicZero) else []
  terms += [narrow(w, dx)] if not isinstance(dx, SymbolicZero) else []
  return y, sum(terms[1:], terms[0]) if terms else jnp.zeros_like(y)


_wide_dot.defjvp(_wide_dot_jvp, symbolic_zeros=True)


def dense(x, w, b=None, *, relu=False, out_dtype=None, backend="auto"):
  """x (F_in, N), w (F_in, F_out), b (F_out,) → (F_out, N), in out_dtype where wider than x's dtype; or w
  (T, F_in, F_out) for T towers reading x, b (T·F_out,) → (T·F_out, N), towers stacked."""
  if w.ndim not in (2, 3) or x.shape[0] != w.shape[-2]:
    raise ValueError(f"dense: input has {x.shape[0]} features but the weights {w.shape} expect {w.shape[-2]}")
  check_backend(backend)
  return dense_reference(x, w, b, relu=relu, out_dtype=out_dtype)

