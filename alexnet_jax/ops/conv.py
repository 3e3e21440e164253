"""2-D convolution, CHWN in and out: forward (cuda-convnet's filter_acts), data gradient (img_acts) and filter
gradient (weight_acts), each a Triton kernel wrapped as a JAX primitive, with the XLA reference beside them.

As lax's convolution, each kernel is linear in each of its two operands, and each one's transpose is another of the
three: JAX differentiates them in either mode, to any order. The forward kernel's fused ReLU is left out of that: its
JVP runs it whole for the output, and the tangent is linear convolutions of the tangents through the ReLU's mask;
reverse mode transposes those into the data and filter gradients without running them. A conv before another splits
its ReLU with it, as cuda-convnet's layers did: the first clamps its output as it writes it but leaves the ReLU's mask
out of its tangent (`relu="left"`), the second reads those images as they are and applies the mask, x > 0, to their
tangent (`relu_in`): its data gradient's kernel writes zeros there, so that the mask costs no pass over the maps of
its own. The filters' and the bias's tangents go through one forward kernel, linear in both, whose transpose is the
filter gradient's kernel summing the bias gradient from the cotangent it reads anyway.

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


def conv2d_reference(x, w, b=None, *, stride=1, padding=0, groups=1, relu=False, relu_in=False):
  """XLA reference, computed in x's dtype as plain XLA computes: filters, bias and result in that dtype, and
  cuDNN (or the platform's convolution) accumulates in float32 inside. float32 and float64 inputs make it the
  accurate reference the kernels are checked against; a float32 result, asked of bfloat16 operands, would turn
  every convolution of the step, forward and backward, into a float32 one on the GPU (the cotangents follow it).
  The bias added in x's dtype is the pattern XLA:GPU fuses into cuDNN's convolution (with the ReLU), and XLA:GPU
  sums its gradient over H·W·N in float32 (it widens bfloat16 reductions; XLA:CPU does not). The CHWN dimension
  numbers leave the physical layouts to XLA: our code transposes no activation. relu_in: of ReLU(x)."""
  y = lax.conv_general_dilated(
      jax.nn.relu(x) if relu_in else x, w.astype(x.dtype), window_strides=(stride, stride),
      padding=((padding, padding), (padding, padding)), dimension_numbers=_DIMS, feature_group_count=groups)
  if b is not None:
    y = y + b.astype(x.dtype)[:, None, None, None]
  return jax.nn.relu(y) if relu else y


def _out_shape(x_shape, w_shape, stride, padding):
  _, h, w, n = x_shape
  _, kh, kw, f = w_shape
  return f, out_size(h, kh, stride, padding), out_size(w, kw, stride, padding), n


# The forward and filter-gradient primitives read the images as `images` says: 'plain'; 'clamped', a ReLU's output
# whose mask this layer applies (read as stored, x's tangent masked by x > 0); or 'masked' by a mask source m, their
# last operand, there alone. The data gradient, given m, is zero where m is not positive. `tiles` (a
# triton_kernels.conv.Tiles) overrides the kernel's tiles: scripts/dev/tune_kernels.py binds the primitives with it;
# the ops leave it out and get the tuned table's.
def _fwd_launch(x, w, b, *m, stride, padding, groups, relu, has_bias, precision, images="plain", relu_left=False,
                tiles=None):
  del relu_left  # the tangent's concern: the kernel clamps alike
  return triton_kernels().conv.conv_fwd_launch(x.shape, w.shape, stride, padding, groups, relu, has_bias,
                                               x.dtype.name, precision, tiles=tiles, images=_as_read(images))


def _dgrad_launch(dy, w, *m, x_shape, stride, padding, groups, precision, tiles=None):
  return triton_kernels().conv.conv_dgrad_launch(x_shape, w.shape, stride, padding, groups, dy.dtype.name, precision,
                                                 tiles=tiles, masked=bool(m))


def _wgrad_launch(x, dy, *m, w_shape, stride, padding, groups, precision, bias=False, images="plain", tiles=None):
  return triton_kernels().conv.conv_wgrad_launch(x.shape, w_shape, stride, padding, groups, x.dtype.name, precision,
                                                 tiles=tiles, bias=bias, images=_as_read(images))


def _as_read(images):
  """The kernels' INPUT for `images`: a clamped ReLU output is read as stored."""
  return "plain" if images == "clamped" else images


def _read(x, m, images):
  """The images as the kernels read them."""
  return jnp.where(m[0] > 0, x, jnp.zeros_like(x)) if images == "masked" else x


# What XLA computes in a kernel's place where the measured table has it faster (ops/conv_choice.py): the reference
# convolution, and its transposes for the gradients, on the operands as the kernels read them.
def _fwd_xla(x, w, b, *m, stride, padding, groups, relu, has_bias, images="plain", **_):
  return [conv2d_reference(_read(x, m, images), w, b if has_bias else None, stride=stride, padding=padding,
                           groups=groups, relu=relu)]


def _dgrad_xla(dy, w, *m, x_shape, stride, padding, groups, **_):
  conv = functools.partial(conv2d_reference, w=w, stride=stride, padding=padding, groups=groups)
  (dx,) = jax.linear_transpose(conv, jax.ShapeDtypeStruct(x_shape, dy.dtype))(dy)
  return [_read(dx, m, "masked" if m else "plain")]


def _wgrad_xla(x, dy, *m, w_shape, stride, padding, groups, bias=False, images="plain", **_):
  conv = functools.partial(conv2d_reference, _read(x, m, images), stride=stride, padding=padding, groups=groups)
  (dw,) = jax.linear_transpose(conv, jax.ShapeDtypeStruct(w_shape, x.dtype))(dy)
  return [dw.astype(jnp.float32), *([dy.astype(jnp.float32).sum(axis=(1, 2, 3))] if bias else [])]


def _faster(kernel, image_shape, filter_shape):
  """The spec's xla_faster for `kernel`, from the images' and filters' shapes as it finds them in (avals, params)."""
  return lambda *avals, **p: conv_choice.xla_faster(
      kernel, image_shape(avals, p), filter_shape(avals, p), p["stride"], p["padding"], p["groups"],
      avals[0].dtype.name)


# Filters (and the filter gradient's dy) may come in another dtype than the images: the kernels read them in the
# images' (dy's), and the bias in float32; a mask source in its own.
CONV_FWD = KernelPrimitive("chwn_conv_fwd", KernelSpec(
    launch=_fwd_launch, batch_last=(0, 3),
    reads=lambda x, w, b, *m, **p: (x.dtype, x.dtype, jnp.float32, *(a.dtype for a in m)),
    kernel_args=lambda x, w, b, *m, **p: (x, w, b, *(m or (x,))),
    outputs=lambda x, w, b, *m, **p: [jax.ShapeDtypeStruct(_out_shape(x.shape, w.shape, p["stride"], p["padding"]),
                                                           x.dtype)],
    xla=_fwd_xla, xla_faster=_faster("fwd", lambda a, p: a[0].shape, lambda a, p: a[1].shape)))
CONV_DGRAD = KernelPrimitive("chwn_conv_dgrad", KernelSpec(
    launch=_dgrad_launch, batch_last=(0, 2), reads=lambda dy, w, *m, **p: (dy.dtype, dy.dtype, *(a.dtype for a in m)),
    kernel_args=lambda dy, w, *m, **p: (dy, w, *(m or (dy,))),
    outputs=lambda dy, w, *m, **p: [jax.ShapeDtypeStruct(p["x_shape"], dy.dtype)],
    xla=_dgrad_xla, xla_faster=_faster("dgrad", lambda a, p: p["x_shape"], lambda a, p: a[1].shape)))
# The filter gradient, and with `bias` the bias gradient from the same pass over dy (summed by one row tile's
# programs as they read it: triton_kernels/conv.py): one output or two.
CONV_WGRAD = KernelPrimitive("chwn_conv_wgrad", KernelSpec(
    launch=_wgrad_launch, reads=lambda x, dy, *m, **p: (x.dtype, x.dtype, *(a.dtype for a in m)),
    kernel_args=lambda x, dy, *m, **p: (x, dy, *(m or (x,))),
    outputs=lambda x, dy, *m, **p: [jax.ShapeDtypeStruct(p["w_shape"], jnp.float32)] + (
        [jax.ShapeDtypeStruct(dy.shape[:1], jnp.float32)] if p.get("bias") else []),
    # The kernel writes float32 partial sums over slices of the reduction: adding them is deterministic. Without
    # bias its bias output is one unwritten element, dropped.
    kernel_outputs=lambda x, dy, *m, **p: [
        jax.ShapeDtypeStruct((split := _wgrad_launch(x, dy, **p).constexprs["SPLIT"], *p["w_shape"]), jnp.float32),
        jax.ShapeDtypeStruct((split, dy.shape[0]) if p.get("bias") else (1,), jnp.float32)],
    finish=lambda dw, db, **p: [dw.sum(axis=0)] + ([db.sum(axis=0)] if p.get("bias") else []),
    xla=_wgrad_xla, xla_faster=_faster("wgrad", lambda a, p: a[0].shape, lambda a, p: p["w_shape"])))


def _geometry(params):
  """A kernel's parameters that every other of the three takes alike (not tuned tiles: those are one kernel's)."""
  return {k: params[k] for k in ("stride", "padding", "groups", "precision", "mode")}


def _conv(x, w, *m, **geometry):
  """The linear convolution: the forward kernel without bias or ReLU, reading x where the mask source m (if given)
  is positive."""
  return CONV_FWD(x, w, jnp.zeros(w.shape[-1:], jnp.float32), *m, relu=False, has_bias=False,
                  images="masked" if m else "plain", **geometry)[0]


def _fwd_jvp(primals, tangents, *, relu, has_bias, images="plain", relu_left=False, **params):
  """The fused kernel for y; the tangent's convolutions are linear in the tangents, which is what reverse mode
  transposes (into img_acts and weight_acts), so it never runs them. A mask source has no tangent: the masks are
  piecewise constant. With `relu_left` the output's ReLU mask is the next layer's to apply (it reads y clamped)."""
  (x, w, b, *m), (dx, dw, db, *_) = primals, tangents
  (y,) = CONV_FWD(x, w, b, *m, relu=relu, has_bias=has_bias, images=images, relu_left=relu_left, **params)
  geometry = _geometry(params)
  terms = [_conv(dx, w, *_mask(x, m, images), **geometry)] if type(dx) is not ad.Zero else []
  if has_bias and type(db) is not ad.Zero and type(dw) is not ad.Zero:
    # The filters' and the bias's tangents in one kernel, linear in both: transposed, one weight_acts pass over the
    # cotangent gives both gradients.
    terms.append(CONV_FWD(x, dw, db, *m, relu=False, has_bias=True, images=images, **geometry)[0])
  else:
    if type(dw) is not ad.Zero:
      terms.append(CONV_FWD(x, dw, jnp.zeros_like(b), *m, relu=False, has_bias=False, images=images, **geometry)[0])
    if has_bias and type(db) is not ad.Zero:
      # Broadcast, then narrowed: transposed, the cotangent is widened before it is summed over H·W·N.
      terms.append(lax.broadcast_in_dim(db, y.shape, (0,)).astype(y.dtype))
  if not terms:
    return [y], [zero_tangent(y)]
  dy = sum(terms[1:], terms[0])
  if relu and not relu_left:  # the fused ReLU passes the tangent where its output was positive
    dy = jnp.where(y > 0, dy, jnp.zeros_like(dy))
  return [y], [dy]


def _mask(x, m, images):
  """The mask source of x's tangent as a kernel reads x: a clamped ReLU output's is x itself (that ReLU's mask, x > 0,
  is this layer's), a masked one's m; plain x has none."""
  return (x,) if images == "clamped" else tuple(m)


def _fwd_transpose(cts, x, w, b, *m, relu, has_bias, images="plain", **params):
  """Without its ReLU the forward kernel is linear in the images (without the bias, read as stored or masked), or in
  the filters and the bias together: img_acts (masked alike), or weight_acts with the bias gradient."""
  unknown = tuple(map(ad.is_undefined_primal, (x, w, b)))
  if relu or any(map(ad.is_undefined_primal, m)) or unknown not in (
      (True, False, False), (False, True, False), (False, True, True)) or (
      unknown[0] and (has_bias or images == "clamped")):
    raise ValueError(f"chwn_conv_fwd: transposed with respect to operands {list(unknown)}; without its ReLU it is "
                     "linear in the images (without the bias, not a ReLU's output), or in the filters and the bias "
                     "together")
  (ct,) = cts
  rest = [None] * len(m)
  if type(ct) is ad.Zero:
    return [None] * 3 + rest
  geometry = _geometry(params)
  if unknown[0]:
    return [CONV_DGRAD(ct, w, *m, x_shape=x.aval.shape, **geometry)[0].astype(x.aval.dtype), None, None, *rest]
  with_bias = has_bias and unknown[2]
  grads = CONV_WGRAD(x, ct, *m, w_shape=w.aval.shape, bias=with_bias, images=images, **geometry)
  return [None, grads[0].astype(w.aval.dtype), grads[1].astype(b.aval.dtype) if with_bias else None, *rest]


def _wgrad_jvp(primals, tangents, *, bias=False, images="plain", **params):
  """Bilinear in x (as read: masked alike) and dy, but the bias gradient reads dy alone: x's tangent term runs
  without it."""
  (x, dy, *m), (dx, ddy, *_) = primals, tangents
  outs = CONV_WGRAD(x, dy, *m, bias=bias, images=images, **params)
  dw_terms, db = [], None
  if type(ddy) is not ad.Zero:
    dw_dy, *db_dy = CONV_WGRAD(x, ddy, *m, bias=bias, images=images, **params)
    dw_terms.append(dw_dy)
    db = db_dy[0] if bias else None
  if type(dx) is not ad.Zero:
    mask = _mask(x, m, images)
    dw_terms.append(CONV_WGRAD(dx, dy, *mask, bias=False, images="masked" if mask else "plain", **params)[0])
  dw = sum(dw_terms[1:], dw_terms[0]) if dw_terms else zero_tangent(outs[0])
  return outs, [dw] + ([zero_tangent(outs[1]) if db is None else db] if bias else [])


def _wgrad_transpose(cts, x, dy, *m, w_shape, bias=False, images="plain", **params):
  """dw's cotangent: img_acts for x (masked as x is read); for dy, the forward kernel on it, plus the bias
  gradient's cotangent as its bias."""
  unknown = (ad.is_undefined_primal(x), ad.is_undefined_primal(dy))
  if unknown not in ((True, False), (False, True)) or any(map(ad.is_undefined_primal, m)) or (
      unknown[0] and images == "clamped"):
    raise ValueError(f"chwn_conv_wgrad: transposed with respect to operands {list(unknown)}; it is linear in dy, or "
                     "in x where x is not a ReLU's output")
  ct_dw, ct_db = cts[0], cts[1] if bias and type(cts[1]) is not ad.Zero else None
  geometry, rest = _geometry(params), [None] * len(m)
  if unknown[0]:
    if type(ct_dw) is ad.Zero:
      return [None, None, *rest]
    return [CONV_DGRAD(dy, ct_dw, *m, x_shape=x.aval.shape, **geometry)[0].astype(x.aval.dtype), None, *rest]
  if type(ct_dw) is ad.Zero and ct_db is None:
    return [None, None, *rest]
  ct_dw = jnp.zeros(w_shape, jnp.float32) if type(ct_dw) is ad.Zero else ct_dw
  bias_ct = jnp.zeros(w_shape[-1:], jnp.float32) if ct_db is None else ct_db
  ct_dy = CONV_FWD(x, ct_dw, bias_ct, *m, relu=False, has_bias=ct_db is not None, images=images, **geometry)[0]
  return [None, ct_dy.astype(dy.aval.dtype), *rest]


ad.primitive_jvps[CONV_FWD.prim] = _fwd_jvp
ad.primitive_transposes[CONV_FWD.prim] = _fwd_transpose
# dx = M ⊙ img_acts(dy, w), M the mask (1 without a mask source): transposed, the forward kernel on M ⊙ ct for dy,
# weight_acts of M ⊙ ct for w.
CONV_DGRAD.def_bilinear((
    lambda ct, dy, w, *m, **p: _conv(ct, w, *m, **_geometry(p)),
    lambda ct, dy, w, *m, **p: CONV_WGRAD(ct, dy, *m, w_shape=w.aval.shape, images="masked" if m else "plain",
                                          **_geometry(p))[0]))
ad.primitive_jvps[CONV_WGRAD.prim] = _wgrad_jvp
ad.primitive_transposes[CONV_WGRAD.prim] = _wgrad_transpose


def conv2d(x, w, b=None, *, stride=1, padding=0, groups=1, relu=False, relu_in=False, backend="auto"):
  """Convolution with fused bias and optional ReLU; see the module docstring for layouts.

  relu="left" and relu_in are the two halves of a ReLU between two convs (network/layers/kind.py gives them): the
  first conv, relu="left", writes its output clamped at 0 but leaves the ReLU's mask out of its gradient; the conv
  reading that output, relu_in=True, applies the mask (x > 0) to its images' gradient, in its data gradient's kernel.
  One without the other differentiates wrongly on the kernels, and the kernels read relu_in's images as they are: give
  it a ReLU's output only (the XLA reference takes the ReLU of any x)."""
  c, _, _, _ = x.shape
  cin, kh, kw, f = w.shape
  if c != cin * groups or f % groups:
    raise ValueError(f"conv2d: input has {c} channels and filters {w.shape} with groups={groups}; need "
                     f"channels == {cin}·groups and filters divisible by groups")
  if b is not None and b.shape != (f,):
    raise ValueError(f"conv2d: bias shape {b.shape} does not match {f} filters")
  if relu not in (False, True, "left"):
    raise ValueError(f"conv2d: relu must be False, True or 'left', not {relu!r}")
  geometry = dict(stride=stride, padding=padding, groups=groups)

  def kernel(x, w, b, *, mode):
    # The bias in float32 before the kernel, so that its gradient is summed in float32 and then rounded to b's dtype.
    bias = jnp.zeros((f,), jnp.float32) if b is None else b.astype(jnp.float32)
    return CONV_FWD(x, w, bias, mode=mode, has_bias=b is not None, precision=dot_precision(x.dtype),
                    relu=bool(relu), relu_left=relu == "left", images="clamped" if relu_in else "plain",
                    **geometry)[0]

  # XLA's ReLU masks its own gradient, and the mask applied again by relu_in changes nothing.
  reference = functools.partial(conv2d_reference, relu=bool(relu), relu_in=relu_in, **geometry)
  return dispatch(backend, reference, kernel, x, w, b)
