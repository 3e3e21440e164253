"""Max-pooling, CHWN in and out; the paper's overlapping pool is size 3, stride 2 (55 → 27 → 13 → 6)."""

import jax.numpy as jnp
from jax import lax

from alexnet_jax.ops.backend import check_backend


def max_pool_reference(x, *, size=3, stride=2):
  """XLA reference. Windows that overlap share inputs, so the gradient adds their contributions."""
  return lax.reduce_window(x, -jnp.inf, lax.max, (1, size, size, 1), (1, stride, stride, 1), "VALID")


def max_pool(x, *, size=3, stride=2, backend="auto"):
  """x (C, H, W, N) → (C, (H−size)//stride+1, (W−size)//stride+1, N), no padding, as cuda-convnet."""
  _, h, w, _ = x.shape
  if h < size or w < size:
    raise ValueError(f"max_pool: a {h}×{w} map is smaller than the {size}×{size} window; the input image is too "
                     "small for this network")
  check_backend(backend)
  return max_pool_reference(x, size=size, stride=stride)
