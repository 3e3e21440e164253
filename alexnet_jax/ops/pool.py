"""Max-pooling, CHWN in and out; the paper's overlapping pool is size 3, stride 2 (55 → 27 → 13 → 6).

The kernel path keeps, per output, the position of its maximum inside the window (int8, the first maximum on
ties, as XLA's own gradient does; ties are common after ReLU); the backward pass then gathers, for each input, the
gradients of the windows that picked it, so overlapping windows add without atomics.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.ops.backend import check_backend
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec


def max_pool_reference(x, *, size=3, stride=2):
  """XLA reference. Windows that overlap share inputs, so the gradient adds their contributions."""
  return lax.reduce_window(x, -jnp.inf, lax.max, (1, size, size, 1), (1, stride, stride, 1), "VALID")


def _pooled(shape, size, stride):
  c, h, w, n = shape
  return c, (h - size) // stride + 1, (w - size) // stride + 1, n


def _fwd_reference(x, *, size, stride):
  """(y, position of the first maximum in each window)."""
  _, oh, ow, _ = _pooled(x.shape, size, stride)
  windows = jnp.stack([x[:, kh:kh + (oh - 1) * stride + 1:stride, kw:kw + (ow - 1) * stride + 1:stride]
                       for kh in range(size) for kw in range(size)], axis=-1)
  idx = jnp.argmax(windows, axis=-1)  # the first maximum; a NaN counts as the maximum
  return [jnp.take_along_axis(windows, idx[..., None], axis=-1)[..., 0], idx.astype(jnp.int8)]


def _bwd_reference(dy, idx, *, size, stride, height, width):
  _, oh, ow, _ = dy.shape
  dx = 0.0
  for kh in range(size):
    for kw in range(size):
      picked = jnp.where(idx == kh * size + kw, dy.astype(jnp.float32), 0.0)
      # Window (i, j) read input (i·stride + kh, j·stride + kw): spread the window grid back onto the input grid.
      dx = dx + lax.pad(picked, 0.0, ((0, 0, 0), (kh, height - kh - (oh - 1) * stride - 1, stride - 1),
                                      (kw, width - kw - (ow - 1) * stride - 1, stride - 1), (0, 0, 0)))
  return [dx.astype(dy.dtype)]


def _launcher(name):
  def launch(first, *_, size, stride, **p):
    from triton_kernels import pool as k  # noqa: PLC0415

    if name == "fwd":
      return k.max_pool_fwd_launch(first.shape, size, stride, first.dtype.name)
    c, _, _, n = first.shape
    return k.max_pool_bwd_launch((c, p["height"], p["width"], n), size, stride, first.dtype.name)

  return launch


POOL_FWD = KernelPrimitive("chwn_max_pool_fwd", KernelSpec(
    kernel="pool:max_pool_fwd_kernel", launch=_launcher("fwd"), reference=_fwd_reference, batch_last=(0,),
    outputs=lambda x, size, stride: [jax.ShapeDtypeStruct(_pooled(x.shape, size, stride), x.dtype),
                                     jax.ShapeDtypeStruct(_pooled(x.shape, size, stride), jnp.int8)]))
POOL_BWD = KernelPrimitive("chwn_max_pool_bwd", KernelSpec(
    kernel="pool:max_pool_bwd_kernel", launch=_launcher("bwd"), reference=_bwd_reference, batch_last=(0, 1),
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
  mode = check_backend(backend, x.dtype)
  if mode == "xla":
    return max_pool_reference(x, size=size, stride=stride)
  return _max_pool_kernel(x, size, stride, mode)
