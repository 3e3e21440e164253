"""An LRN and the max-pool after it as one op, CHWN in and out: max_pool(lrn(x)), AlexNet's first two layers' tail.

The kernel path runs one kernel each way (triton_kernels/lrn_pool.py), so the normalised map, the largest array of
the step, is neither written nor read back; it keeps x and the pool's choices for the backward, as the two ops apart
keep between them. The reference is the two ops' references, one after the other.

The pool is piecewise linear and the LRN smooth: the tangent is the LRN's (XLA's JVP of its reference) gathered at
the forward kernel's choices, a primitive linear in the input's tangent whose transpose is the backward kernel
(kernel.def_nonlinear). Reverse mode runs the two kernels and keeps x and the choices, as a custom VJP would; forward
mode (jvp, Hessian-vector products) goes through it too.
"""

import functools

import jax

from alexnet_jax.ops.backend import dispatch
from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec, def_nonlinear, triton_kernels
from alexnet_jax.ops.lrn import check_groups, lrn_reference, normalised
from alexnet_jax.ops.pool import _gather, check_window, max_pool_reference, pooled_outputs


def lrn_max_pool_reference(x, *, k=2.0, n=5, alpha=1e-4, beta=0.75, alpha_over_n=False, groups=1, relu=False, size=3,
                           stride=2):
  """XLA reference: ops.max_pool_reference of ops.lrn_reference."""
  y = lrn_reference(x, k=k, n=n, alpha=alpha, beta=beta, alpha_over_n=alpha_over_n, groups=groups, relu=relu)
  return max_pool_reference(y, size=size, stride=stride)


def _fwd_launch(x, *, groups, n, k, alpha, beta, relu, size, stride, launch=()):
  """launch: (name, value) pairs overriding the kernel's launch rule (block, chunks, unroll), as
  scripts/dev/tune_kernels.py times them; the network passes none."""
  return triton_kernels().lrn_pool.lrn_pool_fwd_launch(x.shape, groups, n, k, alpha, beta, size, stride,
                                                       x.dtype.name, relu, **dict(launch))


def _bwd_launch(x, dy, idx, *, groups, n, k, alpha, beta, relu, size, stride, launch=()):
  return triton_kernels().lrn_pool.lrn_pool_bwd_launch(x.shape, groups, n, k, alpha, beta, size, stride,
                                                       x.dtype.name, relu, **dict(launch))


LRN_POOL_FWD = KernelPrimitive("chwn_lrn_max_pool_fwd", KernelSpec(
    launch=_fwd_launch, batch_last=(0,),
    outputs=lambda x, size, stride, **_: pooled_outputs(x, size, stride)))
LRN_POOL_BWD = KernelPrimitive("chwn_lrn_max_pool_bwd", KernelSpec(
    launch=_bwd_launch, batch_last=(0, 1, 2),
    outputs=lambda x, dy, idx, **_: [jax.ShapeDtypeStruct(x.shape, dy.dtype)]))


def _pooled(x, idx, *, size, stride, **lrn):
  """The reference with the pool's choices fixed: the normalised map at each window's chosen offset."""
  return _gather(normalised(x, **lrn), idx, size=size, stride=stride)


# y's tangent, the LRN's gathered at the chosen offsets, in XLA; reverse mode runs its transpose, the backward kernel.
LRN_POOL_TANGENT = def_nonlinear(LRN_POOL_FWD, LRN_POOL_BWD, _pooled, "chwn_lrn_max_pool_tangent")


def lrn_max_pool(x, *, k=2.0, n=5, alpha=1e-4, beta=0.75, alpha_over_n=False, groups=1, relu=False, size=3, stride=2,
                 backend="auto"):
  """max_pool(lrn(x)): x (C, H, W, N) → (C, (H−size)//stride+1, (W−size)//stride+1, N). k, n, alpha, beta,
  alpha_over_n, groups and relu are ops.lrn's; size and stride ops.max_pool's."""
  check_groups(x.shape, groups)
  check_window(x.shape, size)
  reference = functools.partial(lrn_max_pool_reference, k=k, n=n, alpha=alpha, beta=beta, alpha_over_n=alpha_over_n,
                                groups=groups, relu=relu, size=size, stride=stride)
  params = (("groups", groups), ("n", n), ("k", float(k)), ("alpha", alpha / n if alpha_over_n else alpha),
            ("beta", float(beta)), ("relu", bool(relu)), ("size", size), ("stride", stride))
  return dispatch(backend, reference, lambda x, *, mode: LRN_POOL_FWD(x, mode=mode, **dict(params))[0], x)
