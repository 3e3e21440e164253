"""2-D convolution, CHWN in and out: forward (cuda-convnet's filter_acts), data gradient (img_acts) and filter
gradient (weight_acts), each a Triton kernel wrapped as a JAX primitive, with the XLA reference beside them.

Layouts: images x (C, H, W, N); filters w (C/groups, KH, KW, F) — cuda-convnet's (colors, filter pixels, filters)
order, filters last so that one loaded patch serves many filters; bias b (F,); output (F, H', W', N).
Groups split C and F into equal consecutive blocks: group g reads channels [g·C/G, (g+1)·C/G) and owns filters
[g·F/G, (g+1)·F/G). That is how the towers of the paper run side by side on one device.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.ops.backend import dispatch, dot_precision
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec, same_varying_axes, triton_kernels
from triton_kernels.launch import out_size

_DIMS = ("CHWN", "IHWO", "CHWN")


def conv2d_reference(x, w, b=None, *, stride=1, padding=0, groups=1, relu=False):
  """XLA reference, computed in x's dtype as plain XLA computes: filters, bias and result in that dtype, and
  cuDNN (or the platform's convolution) accumulates in float32 inside. float32 and float64 inputs make it the
  accurate reference the kernels are checked against; a float32 result, asked of bfloat16 operands, would turn
  every convolution of the step, forward and backward, into a float32 one on the GPU (the cotangents follow it).
  The bias added in x's dtype is the pattern XLA:GPU fuses into cuDNN's convolution (with the ReLU), and XLA:GPU
  sums its gradient over H·W·N in float32 (it widens bfloat16 reductions; XLA:CPU does not). The CHWN dimension
  numbers leave the physical layouts to XLA: our code transposes no activation."""
  y = lax.conv_general_dilated(
      x, w.astype(x.dtype), window_strides=(stride, stride), padding=((padding, padding), (padding, padding)),
      dimension_numbers=_DIMS, feature_group_count=groups)
  if b is not None:
    y = y + b.astype(x.dtype)[:, None, None, None]
  return jax.nn.relu(y) if relu else y


def _out_shape(x_shape, w_shape, stride, padding):
  _, h, w, n = x_shape
  _, kh, kw, f = w_shape
  return f, out_size(h, kh, stride, padding), out_size(w, kw, stride, padding), n


# `tiles` (a triton_kernels.conv.Tiles) overrides the kernel's tiles: scripts/dev/tune_kernels.py binds the primitives
# with it; the ops leave it out and get the tuned table's.
def _fwd_launch(x, w, b, *, stride, padding, groups, relu, has_bias, precision, tiles=None):
  return triton_kernels().conv.conv_fwd_launch(x.shape, w.shape, stride, padding, groups, relu, has_bias,
                                               x.dtype.name, precision, tiles=tiles)


def _dgrad_launch(dy, w, *, x_shape, stride, padding, groups, precision, tiles=None):
  return triton_kernels().conv.conv_dgrad_launch(x_shape, w.shape, stride, padding, groups, dy.dtype.name, precision,
                                                 tiles=tiles)


def _wgrad_launch(x, dy, *, w_shape, stride, padding, groups, precision, tiles=None):
  return triton_kernels().conv.conv_wgrad_launch(x.shape, w_shape, stride, padding, groups, x.dtype.name, precision,
                                                 tiles=tiles)


CONV_FWD = KernelPrimitive("chwn_conv_fwd", KernelSpec(
    launch=_fwd_launch, batch_last=(0,),
    outputs=lambda x, w, b, **p: [jax.ShapeDtypeStruct(_out_shape(x.shape, w.shape, p["stride"], p["padding"]),
                                                       x.dtype)]))
CONV_DGRAD = KernelPrimitive("chwn_conv_dgrad", KernelSpec(
    launch=_dgrad_launch, batch_last=(0,),
    outputs=lambda dy, w, **p: [jax.ShapeDtypeStruct(p["x_shape"], dy.dtype)]))
CONV_WGRAD = KernelPrimitive("chwn_conv_wgrad", KernelSpec(
    launch=_wgrad_launch,
    outputs=lambda x, dy, **p: [jax.ShapeDtypeStruct(p["w_shape"], jnp.float32)],
    # The kernel writes float32 partial sums over slices of the reduction: adding them is deterministic.
    kernel_outputs=lambda x, dy, **p: [jax.ShapeDtypeStruct(
        (_wgrad_launch(x, dy, **p).constexprs["SPLIT"], *p["w_shape"]), jnp.float32)],
    finish=lambda partials, **p: [partials.sum(axis=0)]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7, 8))
def _conv_kernel(x, w, b, stride, padding, groups, relu, has_bias, mode):
  return _conv_kernel_fwd(x, w, b, stride, padding, groups, relu, has_bias, mode)[0]


def _conv_kernel_fwd(x, w, b, stride, padding, groups, relu, has_bias, mode):
  (y,) = CONV_FWD(x, w.astype(x.dtype), b.astype(jnp.float32), mode=mode, stride=stride, padding=padding,
                  groups=groups, relu=relu, has_bias=has_bias, precision=dot_precision(x.dtype))
  return y, (x, w, b, y)


def _conv_kernel_bwd(stride, padding, groups, relu, has_bias, mode, residuals, dy):
  x, w, b, y = residuals
  if relu:  # the fused ReLU passes gradient where its output was positive
    dy = jnp.where(y > 0, dy, jnp.zeros_like(dy))
  geometry = dict(stride=stride, padding=padding, groups=groups, precision=dot_precision(x.dtype))
  (dx,) = CONV_DGRAD(dy, w.astype(dy.dtype), mode=mode, x_shape=x.shape, **geometry)
  (dw,) = CONV_WGRAD(x, dy.astype(x.dtype), mode=mode, w_shape=w.shape, **geometry)
  db = dy.astype(jnp.float32).sum(axis=(1, 2, 3)) if has_bias else jnp.zeros_like(b)
  return dx, dw.astype(w.dtype), db.astype(b.dtype)


_conv_kernel.defvjp(_conv_kernel_fwd, _conv_kernel_bwd)


def conv2d(x, w, b=None, *, stride=1, padding=0, groups=1, relu=False, backend="auto"):
  """Convolution with fused bias and optional ReLU; see the module docstring for layouts."""
  c, _, _, _ = x.shape
  cin, kh, kw, f = w.shape
  if c != cin * groups or f % groups:
    raise ValueError(f"conv2d: input has {c} channels and filters {w.shape} with groups={groups}; need "
                     f"channels == {cin}·groups and filters divisible by groups")
  if b is not None and b.shape != (f,):
    raise ValueError(f"conv2d: bias shape {b.shape} does not match {f} filters")
  geometry = dict(stride=stride, padding=padding, groups=groups, relu=relu)

  def kernel(x, w, b, *, mode):
    has_bias = b is not None
    b = b if has_bias else jnp.zeros((f,), jnp.float32)
    x, w, b = same_varying_axes((x, w, b))
    return _conv_kernel(x, w, b, stride, padding, groups, relu, has_bias, mode)

  return dispatch(backend, functools.partial(conv2d_reference, **geometry), kernel, x, w, b)
