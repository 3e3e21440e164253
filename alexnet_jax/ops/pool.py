"""Max-pooling, CHWN in and out; the paper's overlapping pool is size 3, stride 2 (55 → 27 → 13 → 6).

Both paths keep, per output, the position of its maximum inside the window (int8, the first maximum on ties, as
XLA's own gradient does; ties are common after ReLU). The kernel's backward pass then gathers, for each input, the
gradients of the windows that picked it, so overlapping windows add without atomics; the XLA reference's routes
each window offset's gradients with a strided pad, one fusion, where XLA's own gradient is a select-and-scatter, a
slow scatter fusion on a GPU (docs/BENCHMARKS.md).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.ops.backend import dispatch
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec, triton_kernels
from triton_kernels.launch import out_size


def max_pool_reference(x, *, size=3, stride=2, relu=False):
  """XLA reference: reduce_window's max, and a gradient without select-and-scatter (_max_pool_xla_bwd). relu: of
  ReLU(x)."""
  return _max_pool_xla(jax.nn.relu(x) if relu else x, size, stride)


def _offsets(size):
  """(k, i, j) for each offset (i, j) of a size×size window, k = i·size + j: the windows' row-major order."""
  return [(k, *divmod(k, size)) for k in range(size * size)]


def _at_offset(x, i, j, pooled, stride):
  """x at offset (i, j) of every window: a strided slice of the pooled shape."""
  _, oh, ow, _ = pooled
  limit = (x.shape[0], i + (oh - 1) * stride + 1, j + (ow - 1) * stride + 1, x.shape[3])
  return lax.slice(x, (0, i, j, 0), limit, (1, stride, stride, 1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _max_pool_xla(x, size, stride):
  return lax.reduce_window(x, -jnp.inf, lax.max, (1, size, size, 1), (1, stride, stride, 1), "VALID")


def _max_pool_xla_fwd(x, size, stride):
  """The max and, per window, the offset of its first maximum (its first NaN, if any) — the choice of XLA's
  select-and-scatter (and of the kernel), which routes a tied window's gradient to its first maximum; ties are
  common after ReLU. The offsets (int8 for any window up to 11×11) are all the backward pass keeps."""
  y = _max_pool_xla(x, size, stride)
  first = jnp.zeros(y.shape, jnp.int8 if size * size <= 127 else jnp.int32)
  for k, i, j in reversed(_offsets(size)):
    view = _at_offset(x, i, j, y.shape, stride)
    first = jnp.where((view == y) | jnp.isnan(view), jnp.asarray(k, first.dtype), first)
  return y, (first, x.shape)


def _max_pool_xla_bwd(size, stride, residuals, dy):
  """Each offset's windows send dy to the input at that offset: a select, then an interior-padded (strided) pad
  back to x's shape, summed over the offsets — one fusion that XLA lays out freely, where select-and-scatter is a
  scatter. Added in reverse offset order, so that an input shared by several windows sums their gradients in the
  windows' row-major order, as select-and-scatter does (float32 results equal bit for bit)."""
  first, (_, h, w, _) = residuals
  _, oh, ow, _ = dy.shape
  dx = None
  for k, i, j in reversed(_offsets(size)):
    routed = jnp.where(first == k, dy, jnp.zeros_like(dy))
    pads = ((0, 0, 0), (i, h - i - (oh - 1) * stride - 1, stride - 1), (j, w - j - (ow - 1) * stride - 1, stride - 1),
            (0, 0, 0))
    routed = lax.pad(routed, jnp.zeros((), dy.dtype), pads)
    dx = routed if dx is None else dx + routed
  return (dx,)


_max_pool_xla.defvjp(_max_pool_xla_fwd, _max_pool_xla_bwd)


def pooled_outputs(x, size, stride):
  """The pooled map of x (C, H, W, N) in x's dtype and its int8 choices: what a pool's forward kernel writes."""
  c, h, w, n = x.shape
  pooled = (c, out_size(h, size, stride), out_size(w, size, stride), n)
  return [jax.ShapeDtypeStruct(pooled, x.dtype), jax.ShapeDtypeStruct(pooled, jnp.int8)]


def _fwd_launch(x, *, size, stride, relu=False, launch=()):
  """launch: (name, value) pairs overriding the kernel's launch rule (per_thread, num_warps), as
  scripts/dev/tune_kernels.py times them; the network passes none."""
  return triton_kernels().pool.max_pool_fwd_launch(x.shape, size, stride, x.dtype.name, relu, **dict(launch))


def _bwd_launch(dy, idx, *, size, stride, height, width, launch=()):
  c, _, _, n = dy.shape
  return triton_kernels().pool.max_pool_bwd_launch((c, height, width, n), size, stride, dy.dtype.name, **dict(launch))


POOL_FWD = KernelPrimitive("chwn_max_pool_fwd", KernelSpec(
    launch=_fwd_launch, batch_last=(0,),
    outputs=lambda x, size, stride, **_: pooled_outputs(x, size, stride)))
POOL_BWD = KernelPrimitive("chwn_max_pool_bwd", KernelSpec(
    launch=_bwd_launch, batch_last=(0, 1),
    outputs=lambda dy, idx, size, stride, height, width, **_: [
        jax.ShapeDtypeStruct((dy.shape[0], height, width, dy.shape[3]), dy.dtype)]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _max_pool_kernel(x, size, stride, relu, mode):
  return POOL_FWD(x, mode=mode, size=size, stride=stride, relu=relu)[0]


def _max_pool_kernel_fwd(x, size, stride, relu, mode):
  y, idx = POOL_FWD(x, mode=mode, size=size, stride=stride, relu=relu)
  return y, (idx, x.shape[1], x.shape[2])


def _max_pool_kernel_bwd(size, stride, relu, mode, residuals, dy):
  idx, height, width = residuals
  return tuple(POOL_BWD(dy, idx, mode=mode, size=size, stride=stride, height=height, width=width))


_max_pool_kernel.defvjp(_max_pool_kernel_fwd, _max_pool_kernel_bwd)


def check_window(shape, size):
  _, h, w, _ = shape
  if h < size or w < size:
    raise ValueError(f"max_pool: a {h}×{w} map is smaller than the {size}×{size} window; the input image is too "
                     "small for this network")


def max_pool(x, *, size=3, stride=2, relu=False, backend="auto"):
  """x (C, H, W, N) → (C, (H−size)//stride+1, (W−size)//stride+1, N), no padding, as cuda-convnet. relu: pool
  ReLU(x), which the kernels do at no cost (the conv before the pool leaves its ReLU here: network/model.py)."""
  check_window(x.shape, size)
  return dispatch(backend, functools.partial(max_pool_reference, size=size, stride=stride, relu=relu),
                  lambda x, *, mode: _max_pool_kernel(x, size, stride, bool(relu), mode), x)
