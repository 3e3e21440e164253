"""Fully-connected layers and dropout on (features, images) activations, cuda-convnet's layout after the convs."""

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.ops.backend import check_backend


def dense_reference(x, w, b=None, *, relu=False):
  """XLA reference: y = wᵀx (+ b) in x's dtype, as conv2d_reference: the GEMM (cuBLAS) accumulates in float32
  inside; a caller that wants a float32 sum passes float32 x (the split='sum' layer does)."""
  y = lax.dot_general(w.astype(x.dtype), x, (((0,), (0,)), ((), ())))
  if b is not None:
    y = y + b.astype(x.dtype)[:, None]
  return jax.nn.relu(y) if relu else y


def dense(x, w, b=None, *, relu=False, backend="auto"):
  """x (F_in, N), w (F_in, F_out), b (F_out,) → (F_out, N)."""
  if x.shape[0] != w.shape[0]:
    raise ValueError(f"dense: input has {x.shape[0]} features but the weights expect {w.shape[0]}")
  check_backend(backend)
  return dense_reference(x, w, b, relu=relu)


def dropout(x, rate, key):
  """Inverted dropout: keeps each unit with probability 1 − rate and scales it by 1/(1 − rate), so evaluation
  needs no rescaling (the paper halved the outputs at test time instead: the same expectation)."""
  if rate == 0.0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))
