"""2-D convolution, CHWN in and out: forward (cuda-convnet's filter_acts), data gradient (img_acts) and filter
gradient (weight_acts), each a Triton kernel wrapped as a JAX primitive, with the XLA reference beside them.

As lax's convolution, each kernel is linear in each of its two operands, and each one's transpose is another of the
three: JAX differentiates them in either mode, to any order. The forward kernel's fused ReLU is left out of that: its
JVP runs it whole for the output, and the tangent is linear convolutions of the tangents through the ReLU's mask;
reverse mode transposes those into the data and filter gradients without running them. The filters' and the bias's
tangents go through one forward kernel, linear in both, whose transpose is the filter gradient's kernel summing the
bias gradient from the cotangent it reads anyway.

Layouts: images x (C, H, W, N); filters w (C/groups, KH, KW, F) — cuda-convnet's (colors, filter pixels, filters)
order, filters last so that one loaded patch serves many filters; bias b (F,); output (F, H', W', N).
Groups split C and F into equal consecutive blocks: group g reads channels [g·C/G, (g+1)·C/G) and owns filters
[g·F/G, (g+1)·F/G). That is how the towers of the paper run side by side on one device.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.interpreters import ad

from alexnet_jax.ops import conv_choice
from alexnet_jax.ops.backend import dispatch, dot_precision
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec, triton_kernels, zero_tangent
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


def _wgrad_launch(x, dy, *, w_shape, stride, padding, groups, precision, bias=False, tiles=None):
  return triton_kernels().conv.conv_wgrad_launch(x.shape, w_shape, stride, padding, groups, x.dtype.name, precision,
                                                 tiles=tiles, bias=bias)


# What XLA computes in a kernel's place where the measured table has it faster (ops/conv_choice.py): the reference
# convolution, and its transposes for the gradients, on the operands as the kernels read them.
def _fwd_xla(x, w, b, *, stride, padding, groups, relu, has_bias, **_):
  return [conv2d_reference(x, w, b if has_bias else None, stride=stride, padding=padding, groups=groups, relu=relu)]


def _dgrad_xla(dy, w, *, x_shape, stride, padding, groups, **_):
  conv = functools.partial(conv2d_reference, w=w, stride=stride, padding=padding, groups=groups)
  return list(jax.linear_transpose(conv, jax.ShapeDtypeStruct(x_shape, dy.dtype))(dy))


def _wgrad_xla(x, dy, *, w_shape, stride, padding, groups, bias=False, **_):
  conv = functools.partial(conv2d_reference, x, stride=stride, padding=padding, groups=groups)
  (dw,) = jax.linear_transpose(conv, jax.ShapeDtypeStruct(w_shape, x.dtype))(dy)
  return [dw.astype(jnp.float32), *_bias_gradient(dy, bias)]


def _bias_gradient(dy, bias):
  """[dy summed over H·W·N in float32] with `bias`, else []."""
  return [dy.astype(jnp.float32).sum(axis=(1, 2, 3))] if bias else []


def _faster(kernel, image_shape, filter_shape):
  """The spec's xla_faster for `kernel`, from the images' and filters' shapes as it finds them in (avals, params)."""
  return lambda *avals, **p: conv_choice.xla_faster(
      kernel, image_shape(avals, p), filter_shape(avals, p), p["stride"], p["padding"], p["groups"],
      avals[0].dtype.name)


# Filters (and the filter gradient's dy) may come in another dtype than the images: the kernels read them in the
# images' (dy's), and the bias in float32.
CONV_FWD = KernelPrimitive("chwn_conv_fwd", KernelSpec(
    launch=_fwd_launch, batch_last=(0,), reads=lambda x, w, b, **p: (x.dtype, x.dtype, jnp.float32),
    outputs=lambda x, w, b, **p: [jax.ShapeDtypeStruct(_out_shape(x.shape, w.shape, p["stride"], p["padding"]),
                                                       x.dtype)],
    xla=_fwd_xla, xla_faster=_faster("fwd", lambda a, p: a[0].shape, lambda a, p: a[1].shape)))
CONV_DGRAD = KernelPrimitive("chwn_conv_dgrad", KernelSpec(
    launch=_dgrad_launch, batch_last=(0,), reads=lambda dy, w, **p: (dy.dtype, dy.dtype),
    outputs=lambda dy, w, **p: [jax.ShapeDtypeStruct(p["x_shape"], dy.dtype)],
    xla=_dgrad_xla, xla_faster=_faster("dgrad", lambda a, p: p["x_shape"], lambda a, p: a[1].shape)))
# The filter gradient, and with `bias` the bias gradient from the same pass over dy (the kernel's first row tile sums
# the dy tiles it loads anyway): one output or two.
CONV_WGRAD = KernelPrimitive("chwn_conv_wgrad", KernelSpec(
    launch=_wgrad_launch, reads=lambda x, dy, **p: (x.dtype, x.dtype),
    outputs=lambda x, dy, **p: [jax.ShapeDtypeStruct(p["w_shape"], jnp.float32)] + (
        [jax.ShapeDtypeStruct(dy.shape[:1], jnp.float32)] if p.get("bias") else []),
    # The kernel writes float32 partial sums over slices of the reduction: adding them is deterministic. Without
    # bias its bias output is one unwritten element, dropped.
    kernel_outputs=lambda x, dy, **p: [
        jax.ShapeDtypeStruct((split := _wgrad_launch(x, dy, **p).constexprs["SPLIT"], *p["w_shape"]), jnp.float32),
        jax.ShapeDtypeStruct((split, dy.shape[0]) if p.get("bias") else (1,), jnp.float32)],
    finish=lambda dw, db, **p: [dw.sum(axis=0)] + ([db.sum(axis=0)] if p.get("bias") else []),
    xla=_wgrad_xla, xla_faster=_faster("wgrad", lambda a, p: a[0].shape, lambda a, p: p["w_shape"])))


def _geometry(params):
  """A kernel's parameters that every other of the three takes alike (not tuned tiles: those are one kernel's)."""
  return {k: params[k] for k in ("stride", "padding", "groups", "precision", "mode")}


def _conv(x, w, **geometry):
  """The linear convolution: the forward kernel without bias or ReLU."""
  return CONV_FWD(x, w, jnp.zeros(w.shape[-1:], jnp.float32), relu=False, has_bias=False, **geometry)[0]


def _fwd_jvp(primals, tangents, *, relu, has_bias, **params):
  """The fused kernel for y; the tangent's convolutions are linear in the tangents, which is what reverse mode
  transposes (into img_acts and weight_acts), so it never runs them."""
  (x, w, b), (dx, dw, db) = primals, tangents
  (y,) = CONV_FWD(x, w, b, relu=relu, has_bias=has_bias, **params)
  geometry = _geometry(params)
  terms = [_conv(dx, w, **geometry)] if type(dx) is not ad.Zero else []
  if has_bias and type(db) is not ad.Zero and type(dw) is not ad.Zero:
    # The filters' and the bias's tangents in one kernel, linear in both: transposed, one weight_acts pass over the
    # cotangent gives both gradients.
    terms.append(CONV_FWD(x, dw, db, relu=False, has_bias=True, **geometry)[0])
  else:
    terms += [_conv(x, dw, **geometry)] if type(dw) is not ad.Zero else []
    if has_bias and type(db) is not ad.Zero:
      # Broadcast, then narrowed: transposed, the cotangent is widened before it is summed over H·W·N.
      terms.append(lax.broadcast_in_dim(db, y.shape, (0,)).astype(y.dtype))
  if not terms:
    return [y], [zero_tangent(y)]
  dy = sum(terms[1:], terms[0])
  if relu:  # the fused ReLU passes the tangent where its output was positive
    dy = jnp.where(y > 0, dy, jnp.zeros_like(dy))
  return [y], [dy]


def _fwd_transpose(cts, x, w, b, *, relu, has_bias, **params):
  """Without its ReLU the forward kernel is linear in the images (without the bias), or in the filters and the bias
  together: img_acts, or weight_acts with the bias gradient."""
  unknown = tuple(map(ad.is_undefined_primal, (x, w, b)))
  if relu or unknown not in ((True, False, False), (False, True, False), (False, True, True)) or (
      unknown[0] and has_bias):
    raise ValueError(f"chwn_conv_fwd: transposed with respect to operands {list(unknown)}; without its ReLU it is "
                     "linear in the images (without the bias), or in the filters and the bias together")
  (ct,) = cts
  if type(ct) is ad.Zero:
    return [None] * 3
  geometry = _geometry(params)
  if unknown[0]:
    return [CONV_DGRAD(ct, w, x_shape=x.aval.shape, **geometry)[0].astype(x.aval.dtype), None, None]
  with_bias = has_bias and unknown[2]
  grads = CONV_WGRAD(x, ct, w_shape=w.aval.shape, bias=with_bias, **geometry)
  return [None, grads[0].astype(w.aval.dtype), grads[1].astype(b.aval.dtype) if with_bias else None]


def _wgrad_jvp(primals, tangents, *, bias=False, **params):
  """Bilinear in x and dy, but the bias gradient reads dy alone: x's tangent term runs without it."""
  (x, dy), (dx, ddy) = primals, tangents
  outs = CONV_WGRAD(x, dy, bias=bias, **params)
  dw_terms, db = [], None
  if type(ddy) is not ad.Zero:
    dw_dy, *db_dy = CONV_WGRAD(x, ddy, bias=bias, **params)
    dw_terms.append(dw_dy)
    db = db_dy[0] if bias else None
  if type(dx) is not ad.Zero:
    dw_terms.append(CONV_WGRAD(dx, dy, bias=False, **params)[0])
  dw = sum(dw_terms[1:], dw_terms[0]) if dw_terms else zero_tangent(outs[0])
  return outs, [dw] + ([zero_tangent(outs[1]) if db is None else db] if bias else [])


def _wgrad_transpose(cts, x, dy, *, w_shape, bias=False, **params):
  """dw's cotangent: img_acts for x; for dy, the forward kernel on it, plus the bias gradient's cotangent as its
  bias."""
  unknown = (ad.is_undefined_primal(x), ad.is_undefined_primal(dy))
  if unknown not in ((True, False), (False, True)):
    raise ValueError(f"chwn_conv_wgrad: transposed with respect to operands {list(unknown)}; it is linear in operand "
                     "0 or 1 alone")
  ct_dw, ct_db = cts[0], cts[1] if bias and type(cts[1]) is not ad.Zero else None
  geometry = _geometry(params)
  if unknown[0]:
    if type(ct_dw) is ad.Zero:
      return [None, None]
    return [CONV_DGRAD(dy, ct_dw, x_shape=x.aval.shape, **geometry)[0].astype(x.aval.dtype), None]
  if type(ct_dw) is ad.Zero and ct_db is None:
    return [None, None]
  ct_dw = jnp.zeros(w_shape, jnp.float32) if type(ct_dw) is ad.Zero else ct_dw
  if ct_db is None:
    ct_dy = _conv(x, ct_dw, **geometry)
  else:
    ct_dy = CONV_FWD(x, ct_dw, ct_db, relu=False, has_bias=True, **geometry)[0]
  return [None, ct_dy.astype(dy.aval.dtype)]


ad.primitive_jvps[CONV_FWD.prim] = _fwd_jvp
ad.primitive_transposes[CONV_FWD.prim] = _fwd_transpose
# dx = img_acts(dy, w) and dw = weight_acts(x, dy) are the transposes of y = conv(x, w); theirs are the others.
CONV_DGRAD.def_bilinear((
    lambda ct, dy, w, **p: _conv(ct, w, **_geometry(p)),
    lambda ct, dy, w, **p: CONV_WGRAD(ct, dy, w_shape=w.aval.shape, **_geometry(p))[0]))
ad.primitive_jvps[CONV_WGRAD.prim] = _wgrad_jvp
ad.primitive_transposes[CONV_WGRAD.prim] = _wgrad_transpose

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
    # The bias in float32 before the kernel, so that its gradient is summed in float32 and then rounded to b's dtype.
    bias = jnp.zeros((f,), jnp.float32) if b is None else b.astype(jnp.float32)
    return CONV_FWD(x, w, bias, mode=mode, has_bias=b is not None, precision=dot_precision(x.dtype), **geometry)[0]

  return dispatch(backend, functools.partial(conv2d_reference, **geometry), kernel, x, w, b)
