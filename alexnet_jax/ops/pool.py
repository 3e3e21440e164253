"""Max-pooling, CHWN in and out; the paper's overlapping pool is size 3, stride 2 (55 → 27 → 13 → 6).

Both paths keep, per output, the position of its maximum inside the window (int8, the first maximum on ties, as
XLA's own gradient does; ties are common after ReLU). The kernel's backward pass then gathers, for each input, the
gradients of the windows that picked it, so overlapping windows add without atomics; the XLA reference's routes
each window offset's gradients with a strided pad, one fusion, where XLA's own gradient is a select-and-scatter, a
slow scatter fusion on a GPU (docs/BENCHMARKS.md).

The pool is piecewise linear: its tangent is dx gathered at the chosen offsets, linear in dx, and the backward kernel
is that gather's transpose. The kernels are JAX primitives with those rules, so forward mode (jvp, jacfwd,
Hessian-vector products) gathers the tangent and reverse mode runs the same two kernels as ever. The XLA reference
keeps its custom gradient: reverse mode, and forward mode over it (a Hessian-vector product), but no jvp of its own.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from alexnet_jax.ops.backend import dispatch
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec, same_varying_axes, triton_kernels, zero_tangent
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


def _window_max(x, size, stride):
  return lax.reduce_window(x, -jnp.inf, lax.max, (1, size, size, 1), (1, stride, stride, 1), "VALID")


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _max_pool_xla(x, size, stride):
  return _window_max(x, size, stride)


@_max_pool_xla.defjvp
def _max_pool_xla_jvp(size, stride, primals, tangents):
  """The tangent gathered at each window's first maximum (its first NaN, if any) — the choice of XLA's
  select-and-scatter (and of the kernel), which routes a tied window's gradient to its first maximum; ties are
  common after ReLU. The offsets (int8 for any window up to 11×11) are all that reverse mode keeps; its backward is
  the gather's transpose in XLA (_spread)."""
  (x,), (t,) = primals, tangents
  y = _window_max(x, size, stride)  # not the custom_jvp: a Hessian-vector product differentiates this
  first = jnp.zeros(y.shape, jnp.int8 if size * size <= 127 else jnp.int32)
  for k, i, j in reversed(_offsets(size)):
    view = _at_offset(x, i, j, y.shape, stride)
    first = jnp.where((view == y) | jnp.isnan(view), jnp.asarray(k, first.dtype), first)
  return y, gather(t, first, mode="xla", size=size, stride=stride)


def _spread(dy, first, size, stride, height, width):
  """The gather's transpose in XLA: each offset's windows send dy to the input at that offset, a select then an
  interior-padded (strided) pad back to x's shape, summed over the offsets — one fusion that XLA lays out freely,
  where select-and-scatter is a scatter. Added in reverse offset order, so that an input shared by several windows
  sums their gradients in the windows' row-major order, as select-and-scatter does (float32 results equal bit for
  bit)."""
  _, oh, ow, _ = dy.shape
  dx = None
  for k, i, j in reversed(_offsets(size)):
    routed = jnp.where(first == k, dy, jnp.zeros_like(dy))
    pads = ((0, 0, 0), (i, height - i - (oh - 1) * stride - 1, stride - 1),
            (j, width - j - (ow - 1) * stride - 1, stride - 1), (0, 0, 0))
    routed = lax.pad(routed, jnp.zeros((), dy.dtype), pads)
    dx = routed if dx is None else dx + routed
  return dx


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


def _gather(dx, idx, *, size, stride):
  """dx at each window's chosen offset, 0 where there is none (idx −1: ReLU's windows with no positive maximum)."""
  out = jnp.zeros(idx.shape, dx.dtype)
  for k, i, j in _offsets(size):
    out = jnp.where(idx == k, _at_offset(dx, i, j, idx.shape, stride), out)
  return out


# The max pool's tangent: linear in dx, the offsets a constant. Its transpose is the backward kernel (mode 'xla', the
# reference's: _spread), so reverse mode runs the kernels it always has and never this; forward mode runs it as XLA
# (a select per offset, one fusion).
GATHER = Primitive("chwn_max_pool_gather")
GATHER.def_impl(lambda dx, idx, *, size, stride, **_: _gather(dx, idx, size=size, stride=stride))
GATHER.def_abstract_eval(lambda dx, idx, **_: dx.update(shape=idx.shape, weak_type=False))
mlir.register_lowering(GATHER, mlir.lower_fun(lambda dx, idx, *, size, stride, **_: _gather(dx, idx, size=size,
                                                                                              stride=stride),
                                              multiple_results=False))


def gather(dx, idx, *, mode, size, stride):
  return GATHER.bind(*same_varying_axes((dx, idx)), mode=mode, size=size, stride=stride)


def _fold(x, d, size):
  """x with its vmapped axis d (None: unbatched, broadcast) folded into the image axis N, the last."""
  x = jnp.moveaxis(x, d, -2) if d is not None else jnp.broadcast_to(x[..., None, :], (*x.shape[:-1], size,
                                                                                         x.shape[-1]))
  return x.reshape(*x.shape[:-2], -1)


def _gather_batch(operands, dims, **params):
  size = next(x.shape[d] for x, d in zip(operands, dims) if d is not None)
  out = GATHER.bind(*(_fold(x, d, size) for x, d in zip(operands, dims)), **params)
  return out.reshape(*out.shape[:-1], size, -1), out.ndim - 1


def _gather_jvp(primals, tangents, **params):
  (dx, idx), (t, _) = primals, tangents
  out = GATHER.bind(dx, idx, **params)
  return out, zero_tangent(out) if type(t) is ad.Zero else GATHER.bind(t, idx, **params)


def _gather_transpose(ct, dx, idx, *, mode, size, stride):
  if not ad.is_undefined_primal(dx) or ad.is_undefined_primal(idx):
    raise ValueError("chwn_max_pool_gather is linear in its first operand alone")
  if type(ct) is ad.Zero:
    return [None, None]
  _, height, width, _ = dx.aval.shape
  if mode == "xla":  # the reference's: XLA's own
    return [_spread(ct, idx, size, stride, height, width), None]
  return [POOL_BWD(ct, idx, mode=mode, size=size, stride=stride, height=height, width=width)[0], None]


batching.primitive_batchers[GATHER] = _gather_batch
ad.primitive_jvps[GATHER] = _gather_jvp
ad.primitive_transposes[GATHER] = _gather_transpose
# dx = bwd(dy, idx) routes dy to the offsets that the gather reads: each is the other's transpose.
POOL_BWD.def_linear(lambda ct, dy, idx, *, mode, size, stride, **_: gather(ct, idx, mode=mode, size=size,
                                                                          stride=stride))


def _fwd_jvp(primals, tangents, **params):
  """The kernel for y and the offsets (constants: no tangent); y's tangent is dx gathered at them."""
  ((x,), (dx,)) = primals, tangents
  y, idx = POOL_FWD(x, **params)
  dy = (zero_tangent(y) if type(dx) is ad.Zero
        else gather(dx, idx, mode=params["mode"], size=params["size"], stride=params["stride"]))
  return [y, idx], [dy, zero_tangent(idx)]


ad.primitive_jvps[POOL_FWD.prim] = _fwd_jvp


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
                  lambda x, *, mode: POOL_FWD(x, mode=mode, size=size, stride=stride, relu=bool(relu))[0], x)
