"""Local response normalisation across channels, CHWN in and out.

  b[c] = a[c] / (k + α · Σ_{c' = c−n/2}^{c+n/2} a[c']²)^β

with the sum clipped at the first and last channel. The paper writes α without dividing by n (k=2, n=5, α=1e-4,
β=0.75); Caffe and cuda-convnet's code use α/n. `alpha_over_n` chooses. In CHWN neighbouring channels are H·W·N
elements apart, so the window is a sum over the leading axis; the kernel slides it along the channels, reading each
input about once, and keeps the denominators k + α·Σa² for the backward pass, as cuda-convnet did. Groups (towers)
are normalised separately: the paper's GPUs never saw each other's maps in this layer.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.ops.backend import accumulator, check_backend
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec

LRN_PAPER = dict(k=2.0, n=5, alpha=1e-4, beta=0.75)


def _window_sum(v, n, groups, mirror=False):
  """Σ over each channel's window within its group; `mirror` sums over the channels whose window holds it."""
  before, after = n // 2, (n - 1) // 2
  if mirror:
    before, after = after, before
  g = v.reshape(groups, v.shape[0] // groups, *v.shape[1:])
  s = lax.reduce_window(g, 0.0, lax.add, (1, n, 1, 1, 1), (1,) * 5,
                        ((0, 0), (before, after), (0, 0), (0, 0), (0, 0)))
  return s.reshape(v.shape)


def lrn_reference(x, *, k=2.0, n=5, alpha=1e-4, beta=0.75, alpha_over_n=False, groups=1):
  """XLA reference, computed in float32 (float64 for float64 input)."""
  a = x.astype(accumulator(x.dtype))
  scale = alpha / n if alpha_over_n else alpha
  return (a * (k + scale * _window_sum(a * a, n, groups)) ** -beta).astype(x.dtype)


def _fwd_reference(x, *, groups, n, k, alpha, beta):
  a = x.astype(jnp.float32)
  scale = k + alpha * _window_sum(a * a, n, groups)
  return [(a * scale ** -beta).astype(x.dtype), scale]


def _bwd_reference(x, dy, scale, *, groups, n, k, alpha, beta):
  a, g = x.astype(jnp.float32), dy.astype(jnp.float32)
  spread = _window_sum(g * a * scale ** (-beta - 1), n, groups, mirror=True)
  return [(g * scale ** -beta - 2 * alpha * beta * a * spread).astype(dy.dtype)]


def _launcher(name):
  def launch(x, *_, groups, n, k, alpha, beta):
    from triton_kernels import lrn as kernels  # noqa: PLC0415

    fn = kernels.lrn_fwd_launch if name == "fwd" else kernels.lrn_bwd_launch
    return fn(x.shape, groups, n, k, alpha, beta, x.dtype.name)

  return launch


LRN_FWD = KernelPrimitive("chwn_lrn_fwd", KernelSpec(
    kernel="lrn:lrn_fwd_kernel", launch=_launcher("fwd"), reference=_fwd_reference, batch_last=(0,),
    outputs=lambda x, **p: [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape, jnp.float32)]))
LRN_BWD = KernelPrimitive("chwn_lrn_bwd", KernelSpec(
    kernel="lrn:lrn_bwd_kernel", launch=_launcher("bwd"), reference=_bwd_reference, batch_last=(0, 1, 2),
    outputs=lambda x, dy, scale, **p: [jax.ShapeDtypeStruct(x.shape, dy.dtype)]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _lrn_kernel(x, params, mode):
  return LRN_FWD(x, mode=mode, **dict(params))[0]


def _lrn_kernel_fwd(x, params, mode):
  y, scale = LRN_FWD(x, mode=mode, **dict(params))
  return y, (x, scale)


def _lrn_kernel_bwd(params, mode, residuals, dy):
  x, scale = residuals
  return tuple(LRN_BWD(x, dy, scale, mode=mode, **dict(params)))


_lrn_kernel.defvjp(_lrn_kernel_fwd, _lrn_kernel_bwd)


def lrn(x, *, k=2.0, n=5, alpha=1e-4, beta=0.75, alpha_over_n=False, groups=1, backend="auto"):
  """x (C, H, W, N) → same shape; each of `groups` consecutive channel blocks is normalised on its own."""
  if x.shape[0] % groups:
    raise ValueError(f"lrn: {x.shape[0]} channels do not split into {groups} groups")
  mode = check_backend(backend, x.dtype)
  if mode == "xla":
    return lrn_reference(x, k=k, n=n, alpha=alpha, beta=beta, alpha_over_n=alpha_over_n, groups=groups)
  params = (("groups", groups), ("n", n), ("k", float(k)), ("alpha", alpha / n if alpha_over_n else alpha),
            ("beta", float(beta)))
  return _lrn_kernel(x, params, mode)
