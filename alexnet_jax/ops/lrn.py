"""Local response normalisation across channels, CHWN in and out.

  b[c] = a[c] / (k + α · Σ_{c' = c−n/2}^{c+n/2} a[c']²)^β

with the sum clipped at the first and last channel. The paper writes α without dividing by n (k=2, n=5, α=1e-4,
β=0.75); Caffe and cuda-convnet's code use α/n. `alpha_over_n` chooses. In CHWN neighbouring channels are H·W·N
elements apart, so the window is a sum over the leading axis; the kernel slides it along the channels, reading each
input once; the backward recomputes the denominators k + α·Σa² from the input rather than keeping them from the
forward as cuda-convnet did (float32 denominators cost more memory traffic than recomputing them). Groups (towers)
are normalised separately: the paper's GPUs never saw each other's maps in this layer.

The forward kernel has no transpose, being nonlinear; its tangent J(x)·t is XLA's JVP of the reference, a primitive
of its own whose transpose is the backward kernel (kernel.def_nonlinear). Forward mode (jvp, jacfwd, Hessian-vector
products) thus runs XLA's tangent while reverse mode transposes it into the backward kernel, never running it: the
same two kernels, keeping x alone, as a custom VJP would, which forward mode cannot go through.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.ops.backend import accumulator, dispatch
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec, def_nonlinear, triton_kernels


def _window_sum(v, n, groups):
  """Σ over each channel's window within its group: a reduce_window over each group's channels, the groups
  concatenated back; slices and a concatenate leave XLA every layout, where a reshape to (groups, C/groups, …)
  could pin one."""
  before, after, size = n // 2, (n - 1) // 2, v.shape[0] // groups
  window = lambda g: lax.reduce_window(g, 0.0, lax.add, (n, 1, 1, 1), (1,) * 4,  # noqa: E731
                                       ((before, after), (0, 0), (0, 0), (0, 0)))
  return jnp.concatenate([window(v[i * size:(i + 1) * size]) for i in range(groups)]) if groups > 1 else window(v)


@functools.partial(jax.checkpoint, static_argnums=(1, 2, 3, 4, 5, 6, 7))
def _lrn(x, k, n, alpha, beta, alpha_over_n, groups, relu):
  # Computed in float32 (float64 for float64 input): in bfloat16, k + α·Σa² would round α·Σa² away (k = 2 leaves
  # steps of 2^-6). Memory-bound, so the wider arithmetic costs nothing; what would cost is autodiff's float32
  # residuals (the powers of the normaliser), so the backward pass recomputes the forward from x instead
  # (jax.checkpoint): only x is kept, in its own dtype (with relu, the ReLU's input: its mask is recomputed too).
  a = (jax.nn.relu(x) if relu else x).astype(accumulator(x.dtype))
  scale = alpha / n if alpha_over_n else alpha
  return (a * (k + scale * _window_sum(a * a, n, groups)) ** -beta).astype(x.dtype)


def lrn_reference(x, *, k=2.0, n=5, alpha=1e-4, beta=0.75, alpha_over_n=False, groups=1, relu=False):
  """XLA reference, computed in float32 (float64 for float64 input) and rounded to x's dtype; its gradient
  recomputes the forward pass rather than keeping float32 intermediates. relu: of ReLU(x)."""
  return _lrn(x, k, n, alpha, beta, alpha_over_n, groups, relu)


def _fwd_launch(x, *, groups, n, k, alpha, beta, relu, launch=()):
  """launch: (name, value) pairs overriding the kernel's launch rule (block, chunks, unroll), as
  scripts/dev/tune_kernels.py times them; the network passes none."""
  return triton_kernels().lrn.lrn_fwd_launch(x.shape, groups, n, k, alpha, beta, x.dtype.name, relu, **dict(launch))


def _bwd_launch(x, dy, *, groups, n, k, alpha, beta, relu, launch=()):
  return triton_kernels().lrn.lrn_bwd_launch(x.shape, groups, n, k, alpha, beta, x.dtype.name, relu, **dict(launch))


LRN_FWD = KernelPrimitive("chwn_lrn_fwd", KernelSpec(
    launch=_fwd_launch, batch_last=(0,), outputs=lambda x, **p: [jax.ShapeDtypeStruct(x.shape, x.dtype)]))
LRN_BWD = KernelPrimitive("chwn_lrn_bwd", KernelSpec(
    launch=_bwd_launch, batch_last=(0, 1), outputs=lambda x, dy, **p: [jax.ShapeDtypeStruct(x.shape, dy.dtype)]))


def normalised(x, *, groups, n, k, alpha, beta, relu):
  """The reference, in the kernels' parameters (alpha already divided by n where asked)."""
  return _lrn(x, k, n, alpha, beta, False, groups, relu)


# y's tangent, J(x)·t, in XLA; reverse mode runs its transpose, the backward kernel, instead.
LRN_TANGENT = def_nonlinear(LRN_FWD, LRN_BWD, normalised, "chwn_lrn_tangent")


def check_groups(shape, groups):
  if shape[0] % groups:
    raise ValueError(f"lrn: {shape[0]} channels do not split into {groups} groups")


def lrn(x, *, k=2.0, n=5, alpha=1e-4, beta=0.75, alpha_over_n=False, groups=1, relu=False, backend="auto"):
  """x (C, H, W, N) → same shape; each of `groups` consecutive channel blocks is normalised on its own. relu:
  normalise ReLU(x), the ReLU of the conv before (which then leaves it out): its gradient comes from the LRN's
  backward kernel, sparing the conv's backward a pass over its output to mask the gradient."""
  check_groups(x.shape, groups)
  reference = functools.partial(lrn_reference, k=k, n=n, alpha=alpha, beta=beta, alpha_over_n=alpha_over_n,
                                groups=groups, relu=relu)
  params = (("groups", groups), ("n", n), ("k", float(k)), ("alpha", alpha / n if alpha_over_n else alpha),
            ("beta", float(beta)), ("relu", bool(relu)))
  return dispatch(backend, reference, lambda x, *, mode: LRN_FWD(x, mode=mode, **dict(params))[0], x)
