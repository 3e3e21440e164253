"""Local response normalisation across channels, CHWN in and out.

  b[c] = a[c] / (k + α · Σ_{c' = c−n/2}^{c+n/2} a[c']²)^β

with the sum clipped at the first and last channel. The paper writes α without dividing by n (k=2, n=5, α=1e-4,
β=0.75); Caffe and cuda-convnet's code use α/n. `alpha_over_n` chooses. In CHWN neighbouring channels are H·W·N
elements apart, so the window is a sum over the leading axis; the kernel slides it along the channels, reading each
input once; the backward recomputes the denominators k + α·Σa² from the input rather than keeping them from the
forward as cuda-convnet did (float32 denominators cost more memory traffic than recomputing them). Groups (towers)
are normalised separately: the paper's GPUs never saw each other's maps in this layer.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.ops.backend import accumulator, dispatch
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec, same_varying_axes, triton_kernels


def _window_sum(v, n, groups):
  """Σ over each channel's window within its group: a reduce_window over each group's channels, the groups
  concatenated back; slices and a concatenate leave XLA every layout, where a reshape to (groups, C/groups, …)
  could pin one."""
  before, after, size = n // 2, (n - 1) // 2, v.shape[0] // groups
  window = lambda g: lax.reduce_window(g, 0.0, lax.add, (n, 1, 1, 1), (1,) * 4,  # noqa: E731
                                       ((before, after), (0, 0), (0, 0), (0, 0)))
  return jnp.concatenate([window(v[i * size:(i + 1) * size]) for i in range(groups)]) if groups > 1 else window(v)


@functools.partial(jax.checkpoint, static_argnums=(2, 3, 4, 5, 6, 7, 8))
def _lrn(x, b, k, n, alpha, beta, alpha_over_n, groups, relu):
  # Computed in float32 (float64 for float64 input): in bfloat16, k + α·Σa² would round α·Σa² away (k = 2 leaves
  # steps of 2^-6). Memory-bound, so the wider arithmetic costs nothing; what would cost is autodiff's float32
  # residuals (the powers of the normaliser), so the backward pass recomputes the forward from x instead
  # (jax.checkpoint): only x is kept, in its own dtype (with relu, the ReLU's input: its mask is recomputed too).
  a = x.astype(accumulator(x.dtype))
  if b is not None:  # in float32, as the kernel adds it
    a = a + b.astype(a.dtype)[:, None, None, None]
  a = jax.nn.relu(a) if relu else a
  scale = alpha / n if alpha_over_n else alpha
  return (a * (k + scale * _window_sum(a * a, n, groups)) ** -beta).astype(x.dtype)


def lrn_reference(x, bias=None, *, k=2.0, n=5, alpha=1e-4, beta=0.75, alpha_over_n=False, groups=1, relu=False):
  """XLA reference, computed in float32 (float64 for float64 input) and rounded to x's dtype; its gradient
  recomputes the forward pass rather than keeping float32 intermediates. bias, relu: of ReLU(x + bias)."""
  return _lrn(x, bias, k, n, alpha, beta, alpha_over_n, groups, relu)


def _fwd_launch(x, b, *, groups, n, k, alpha, beta, relu, bias, launch=()):
  """launch: (name, value) pairs overriding the kernel's launch rule (block, chunks), as scripts/tune_kernels.py
  times them; the network passes none."""
  return triton_kernels().lrn.lrn_fwd_launch(x.shape, groups, n, k, alpha, beta, x.dtype.name, relu, bias,
                                             **dict(launch))


def _bwd_launch(x, b, dy, *, groups, n, k, alpha, beta, relu, bias, launch=()):
  return triton_kernels().lrn.lrn_bwd_launch(x.shape, groups, n, k, alpha, beta, x.dtype.name, relu, bias,
                                             **dict(launch))


def _bias_partials(x, b, dy, **params):
  return jax.ShapeDtypeStruct(triton_kernels().lrn.bias_partials(_bwd_launch(x, b, dy, **params)), jnp.float32)


LRN_FWD = KernelPrimitive("chwn_lrn_fwd", KernelSpec(
    launch=_fwd_launch, batch_last=(0,), outputs=lambda x, b, **p: [jax.ShapeDtypeStruct(x.shape, x.dtype)]))
LRN_BWD = KernelPrimitive("chwn_lrn_bwd", KernelSpec(
    launch=_bwd_launch, batch_last=(0, 2),
    outputs=lambda x, b, dy, **p: [jax.ShapeDtypeStruct(x.shape, dy.dtype)]  # dx, and with bias db
    + [jax.ShapeDtypeStruct(b.shape, b.dtype)] * p["bias"],
    # db's partial sums, a row per block of positions, added in order: deterministic, unlike atomic adds
    kernel_outputs=lambda x, b, dy, **p: [jax.ShapeDtypeStruct(x.shape, dy.dtype), _bias_partials(x, b, dy, **p)],
    finish=lambda dx, partials, **p: (dx, partials.sum(axis=0)) if p["bias"] else (dx,),
    folds=lambda **p: not p["bias"]))  # db sums over the images: a vmapped axis must not join them


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _lrn_kernel(x, b, params, mode):
  return LRN_FWD(x, b, mode=mode, **dict(params))[0]


def _lrn_kernel_fwd(x, b, params, mode):
  return LRN_FWD(x, b, mode=mode, **dict(params))[0], (x, b)


def _lrn_kernel_bwd(params, mode, residuals, dy):
  dx, *db = LRN_BWD(*residuals, dy, mode=mode, **dict(params))
  return dx, db[0] if db else jnp.zeros_like(residuals[1])


_lrn_kernel.defvjp(_lrn_kernel_fwd, _lrn_kernel_bwd)


def lrn(x, bias=None, *, k=2.0, n=5, alpha=1e-4, beta=0.75, alpha_over_n=False, groups=1, relu=False,
        backend="auto"):
  """x (C, H, W, N) → same shape; each of `groups` consecutive channel blocks is normalised on its own.

  bias (C,), relu: normalise ReLU(x + bias), the bias and ReLU of the conv before (which then leaves them out):
  their gradients come from the LRN's backward kernel, which masks dx as it writes it and sums db from it, sparing
  the conv's backward two passes over its output gradient."""
  if x.shape[0] % groups:
    raise ValueError(f"lrn: {x.shape[0]} channels do not split into {groups} groups")
  if bias is not None and bias.shape != x.shape[:1]:
    raise ValueError(f"lrn: bias shape {bias.shape} does not match {x.shape[0]} channels")
  reference = functools.partial(lrn_reference, k=k, n=n, alpha=alpha, beta=beta, alpha_over_n=alpha_over_n,
                                groups=groups, relu=relu)
  params = (("groups", groups), ("n", n), ("k", float(k)), ("alpha", alpha / n if alpha_over_n else alpha),
            ("beta", float(beta)), ("relu", bool(relu)), ("bias", bias is not None))

  def kernel(x, b, *, mode):
    b = jnp.zeros(x.shape[:1], jnp.float32) if b is None else b.astype(jnp.float32)
    return _lrn_kernel(*same_varying_axes((x, b)), params, mode)

  return dispatch(backend, reference, kernel, x, bias)
