"""Max-pooling, CHWN in and out; the paper's overlapping pool is size 3, stride 2 (55 → 27 → 13 → 6).

The kernel path keeps, per output, the position of its maximum inside the window (int8, the first maximum on
ties, as XLA's own gradient does; ties are common after ReLU); the backward pass then gathers, for each input, the
gradients of the windows that picked it, so overlapping windows add without atomics.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.ops.backend import dispatch
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec, triton_kernels


def max_pool_reference(x, *, size=3, stride=2):
  """XLA reference. Windows that overlap share inputs, so the gradient adds their contributions."""
  return lax.reduce_window(x, -jnp.inf, lax.max, (1, size, size, 1), (1, stride, stride, 1), "VALID")


def _pooled(shape, size, stride):
  c, h, w, n = shape
  return c, (h - size) // stride + 1, (w - size) // stride + 1, n


def _fwd_launch(x, *, size, stride):
  return triton_kernels().pool.max_pool_fwd_launch(x.shape, size, stride, x.dtype.name)


def _bwd_launch(dy, idx, *, size, stride, height, width):
  c, _, _, n = dy.shape
  return triton_kernels().pool.max_pool_bwd_launch((c, height, width, n), size, stride, dy.dtype.name)


POOL_FWD = KernelPrimitive("chwn_max_pool_fwd", KernelSpec(
    launch=_fwd_launch, batch_last=(0,),
    outputs=lambda x, size, stride: [jax.ShapeDtypeStruct(_pooled(x.shape, size, stride), x.dtype),
                                     jax.ShapeDtypeStruct(_pooled(x.shape, size, stride), jnp.int8)]))
POOL_BWD = KernelPrimitive("chwn_max_pool_bwd", KernelSpec(
    launch=_bwd_launch, batch_last=(0, 1),
    outputs=lambda dy, idx, size, stride, height, width: [
        jax.ShapeDtypeStruct((dy.shape[0], height, width, dy.shape[3]), dy.dtype)]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _max_pool_kernel(x, size, stride, mode):
  return POOL_FWD(x, mode=mode, size=size, stride=stride)[0]


def _max_pool_kernel_fwd(x, size, stride, mode):
  y, idx = POOL_FWD(x, mode=mode, size=size, stride=stride)
  return y, (idx, x.shape[1], x.shape[2])


def _max_pool_kernel_bwd(size, stride, mode, residuals, dy):
  idx, height, width = residuals
  return tuple(POOL_BWD(dy, idx, mode=mode, size=size, stride=stride, height=height, width=width))


_max_pool_kernel.defvjp(_max_pool_kernel_fwd, _max_pool_kernel_bwd)


def max_pool(x, *, size=3, stride=2, backend="auto"):
  """x (C, H, W, N) → (C, (H−size)//stride+1, (W−size)//stride+1, N), no padding, as cuda-convnet."""
  _, h, w, _ = x.shape
  if h < size or w < size:
    raise ValueError(f"max_pool: a {h}×{w} map is smaller than the {size}×{size} window; the input image is too "
                     "small for this network")
  return dispatch(backend, functools.partial(max_pool_reference, size=size, stride=stride),
                  lambda x, *, mode: _max_pool_kernel(x, size, stride, mode), x)
