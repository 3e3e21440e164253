"""Average pooling and global average pooling, CHWN in; Network in Network's pools (Lin, Chen & Yan 2013).

avg_pool divides every window by size², the padding's zeros counted (PyTorch's default count_include_pad; Caffe's
AVE pooling too, as no window here reaches past the padded map): one divisor for every output, so the gradient is
dy/size² spread over each window. padding < size keeps every window on the map. global_avg_pool is the mean of each
channel's whole map, (C, H, W, N) → (C, N): the fully-connected layout (features, images), which a classifier's
softmax reads as it is (NiN's last layer; a 4-D caller adds the two unit axes with y[:, None, None]).

Both are computed in float32 (float64 for float64 input) and rounded to x's dtype, by the XLA references
(reduce_window's sum, mean) and by the kernels (triton_kernels/avg_pool.py), whose backward passes gather each
input's gradient from the windows that cover it. Both pools are linear, and each backward kernel is its forward's
transpose (and back): JAX primitives with those rules, so forward mode (jvp, jacfwd, Hessian-vector products) pools
the tangent and reverse mode runs the same two kernels as ever.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from alexnet_jax.ops.backend import accumulator, dispatch
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec, triton_kernels
from triton_kernels.launch import out_size

MAX_SIZE = 16  # triton_kernels/avg_pool.py unrolls a window into size² loads


def avg_pool_reference(x, *, size, stride, padding=0):
  """XLA reference: reduce_window's sum over the zero-padded map, / size², in float32 (float64 for float64 x)."""
  acc = accumulator(x.dtype)
  pads = ((0, 0), (padding, padding), (padding, padding), (0, 0))
  total = lax.reduce_window(x.astype(acc), np.zeros((), acc), lax.add, (1, size, size, 1), (1, stride, stride, 1),
                            pads)
  return (total / (size * size)).astype(x.dtype)


def global_avg_pool_reference(x):
  """XLA reference: each channel's mean over H and W, in float32 (float64 for float64 x): (C, H, W, N) → (C, N)."""
  return jnp.mean(x.astype(accumulator(x.dtype)), axis=(1, 2)).astype(x.dtype)


def _fwd_launch(x, *, size, stride, padding, launch=()):
  """launch: (name, value) pairs overriding the kernel's launch rule (per_thread, num_warps); the network passes
  none."""
  return triton_kernels().avg_pool.avg_pool_fwd_launch(x.shape, size, stride, padding, x.dtype.name, **dict(launch))


def _bwd_launch(dy, *, size, stride, padding, height, width, launch=()):
  c, _, _, n = dy.shape
  return triton_kernels().avg_pool.avg_pool_bwd_launch((c, height, width, n), size, stride, padding, dy.dtype.name,
                                                       **dict(launch))


def _pooled(x, size, stride, padding):
  c, h, w, n = x.shape
  return [jax.ShapeDtypeStruct((c, out_size(h, size, stride, padding), out_size(w, size, stride, padding), n),
                               x.dtype)]


AVG_POOL_FWD = KernelPrimitive("chwn_avg_pool_fwd", KernelSpec(
    launch=_fwd_launch, batch_last=(0,),
    outputs=lambda x, size, stride, padding, **_: _pooled(x, size, stride, padding)))
AVG_POOL_BWD = KernelPrimitive("chwn_avg_pool_bwd", KernelSpec(
    launch=_bwd_launch, batch_last=(0,),
    outputs=lambda dy, height, width, **_: [
        jax.ShapeDtypeStruct((dy.shape[0], height, width, dy.shape[3]), dy.dtype)]))
GLOBAL_AVG_POOL_FWD = KernelPrimitive("chwn_global_avg_pool_fwd", KernelSpec(
    launch=lambda x, launch=(): triton_kernels().avg_pool.global_avg_pool_fwd_launch(x.shape, x.dtype.name,
                                                                                      **dict(launch)),
    batch_last=(0,), outputs=lambda x, **_: [jax.ShapeDtypeStruct((x.shape[0], x.shape[3]), x.dtype)]))
GLOBAL_AVG_POOL_BWD = KernelPrimitive("chwn_global_avg_pool_bwd", KernelSpec(
    launch=lambda dy, height, width, launch=(): triton_kernels().avg_pool.global_avg_pool_bwd_launch(
        (dy.shape[0], height, width, dy.shape[1]), dy.dtype.name, **dict(launch)),
    batch_last=(0,),
    outputs=lambda dy, height, width, **_: [jax.ShapeDtypeStruct((dy.shape[0], height, width, dy.shape[1]),
                                                                 dy.dtype)]))


def _window(params):
  """The window and mode, which each of a pool's two kernels takes alike (not `launch`, one kernel's own)."""
  return {k: params[k] for k in ("size", "stride", "padding", "mode")}


# Both pools are linear in x and each one's backward kernel is its transpose: the JVP pools the tangent with the
# forward kernel, which reverse mode transposes into the backward kernel without running it (the backward needs no
# input, only the map's size, which the pooled shape does not give back: rounding down).
AVG_POOL_FWD.def_linear(lambda ct, x, **p: AVG_POOL_BWD(ct, height=x.aval.shape[1], width=x.aval.shape[2],
                                                        **_window(p))[0])
AVG_POOL_BWD.def_linear(lambda ct, dy, **p: AVG_POOL_FWD(ct, **_window(p))[0])
GLOBAL_AVG_POOL_FWD.def_linear(lambda ct, x, *, mode, **_: GLOBAL_AVG_POOL_BWD(
    ct, mode=mode, height=x.aval.shape[1], width=x.aval.shape[2])[0])
GLOBAL_AVG_POOL_BWD.def_linear(lambda ct, dy, *, mode, **_: GLOBAL_AVG_POOL_FWD(ct, mode=mode)[0])


def _check_input(name, x):
  if x.ndim != 4 or not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{name}: expected a floating-point (C, H, W, N) map, got {x.dtype} of shape {x.shape}")


def check_window(shape, size, stride, padding):
  """One clear line for a window the op cannot pool: the kernels' rule (triton_kernels/avg_pool.py, whose import
  needs Triton, which the XLA path must not), which the reference keeps too."""
  _, h, w, _ = shape
  if not all(isinstance(v, int | np.integer) for v in (size, stride, padding)):
    raise ValueError(f"avg_pool: size, stride and padding must be integers, got {size!r}, {stride!r}, {padding!r}")
  if not (1 <= size <= MAX_SIZE and stride >= 1 and 0 <= padding < size):
    raise ValueError(f"avg_pool: size {size}, stride {stride}, padding {padding}: need 1 ≤ size ≤ {MAX_SIZE}, "
                     "stride ≥ 1 and 0 ≤ padding < size (a larger window is a global pool)")
  if min(h, w) + 2 * padding < size:
    raise ValueError(f"avg_pool: a {h}×{w} map padded by {padding} is smaller than the {size}×{size} window")


def avg_pool(x, *, size, stride, padding=0, backend="auto"):
  """x (C, H, W, N) → (C, (H + 2·padding − size)//stride + 1, (W + 2·padding − size)//stride + 1, N): each window's
  mean over size² elements, the zero padding counted (count_include_pad); padding < size."""
  _check_input("avg_pool", x)
  check_window(x.shape, size, stride, padding)
  size, stride, padding = int(size), int(stride), int(padding)
  return dispatch(backend, functools.partial(avg_pool_reference, size=size, stride=stride, padding=padding),
                  lambda x, *, mode: AVG_POOL_FWD(x, mode=mode, size=size, stride=stride, padding=padding)[0], x)


def global_avg_pool(x, *, backend="auto"):
  """x (C, H, W, N) → (C, N): each channel's mean over its whole map, in the fully-connected layout."""
  _check_input("global_avg_pool", x)
  return dispatch(backend, global_avg_pool_reference, lambda x, *, mode: GLOBAL_AVG_POOL_FWD(x, mode=mode)[0], x)
