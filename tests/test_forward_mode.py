"""Forward-mode differentiation of the conv and dense ops: jvp, linearize, jacfwd and Hessian-vector products of the
Triton kernels under the interpreter ('interpret') against the XLA reference ('xla'), and reverse mode still one
kernel of each kind. float32: the kernels take float64 to the reference, and the interpreter's bf16 dot is wrong."""

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

from alexnet_jax import ops


def rand(rng, *shape, scale=1.0):
  return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)


def like(*args):
  """Tangents: random, not all ones, so that a transposed or misplaced term shows."""
  rng = np.random.default_rng(1)
  return tuple(rand(rng, *a.shape) for a in args)


CONVS = {
    # name: (conv2d keywords, with a bias or not); small ragged shapes
    "plain": (dict(), False),
    "bias_relu_groups2_pad2": (dict(padding=2, groups=2, relu=True), True),
    "bias_groups2_stride2_pad1": (dict(stride=2, padding=1, groups=2), True),
    "relu_groups2_stride2": (dict(stride=2, padding=1, groups=2, relu=True), False),
}


def conv_case(name, backend):
  """(f, args) for one conv of CONVS: x (4, 7, 7, 3), 3×3 filters."""
  kw, bias = CONVS[name]
  rng = np.random.default_rng(0)  # the same numbers whichever tests run
  x, w = rand(rng, 4, 7, 7, 3), rand(rng, 4 // kw.get("groups", 1), 3, 3, 6, scale=0.3)
  if bias:
    return (lambda x, w, b: ops.conv2d(x, w, b, backend=backend, **kw)), (x, w, rand(rng, 6))
  return (lambda x, w: ops.conv2d(x, w, backend=backend, **kw)), (x, w)


def close(got, want, rtol=1e-4):
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(jnp.abs(w).max())),
               got, want)


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_jvp_matches_the_reference(name):
  args = conv_case(name, "xla")[1]
  tangents = like(*args)
  with jax.default_matmul_precision("highest"):
    want = jax.jvp(conv_case(name, "xla")[0], args, tangents)
    got = jax.jit(lambda a, t: jax.jvp(conv_case(name, "interpret")[0], a, t))(args, tangents)
  close(got, want)


def test_conv_second_order_in_both_modes():
  # Finite differences in float32 (float64 takes the reference): a step of 1e-3 is far above float32's rounding, and
  # a central difference is exact for what is bilinear. Not through a ReLU: its kinks fail the reference alike;
  # the ReLU's second order is the Hessian-vector product's below. (84 kernel runs: ~10 s.)
  f, args = conv_case("bias_groups2_stride2_pad1", "interpret")
  with jax.default_matmul_precision("highest"):
    check_grads(jax.jit(f), args, order=2, modes=("fwd", "rev"), eps=1e-3, atol=1e-2, rtol=1e-2)


def tiny_net(backend):
  """conv → ReLU → dense → squared loss."""
  def loss(x, w, b, w2):
    y = ops.conv2d(x, w, b, stride=2, padding=1, groups=2, relu=True, backend=backend)
    z = ops.dense(y.reshape(-1, y.shape[-1]), w2, relu=True, backend=backend)
    return (z ** 2).sum()

  return loss


def tiny_net_args():
  rng = np.random.default_rng(2)
  return rand(rng, 4, 7, 7, 3), rand(rng, 2, 3, 3, 6, scale=0.3), rand(rng, 6), rand(rng, 6 * 4 * 4, 5, scale=0.2)


def test_hessian_vector_product_matches_the_reference():
  args = tiny_net_args()
  tangents = like(*args)
  hvp = lambda loss, a, t: jax.jvp(jax.grad(loss, (0, 1, 2, 3)), a, t)  # noqa: E731
  with jax.default_matmul_precision("highest"):
    want = hvp(tiny_net("xla"), args, tangents)
    got = jax.jit(functools.partial(hvp, tiny_net("interpret")))(args, tangents)
  close(got, want)


def test_linearize_and_jacfwd_match_the_reference():
  f, (x, w, b) = conv_case("bias_relu_groups2_pad2", "interpret")
  reference = conv_case("bias_relu_groups2_pad2", "xla")[0]
  tangents = like(x, w, b)
  # jacfwd vmaps the JVP over a basis of tangents: the images' fold into the image axis N (here 32 · 2), the
  # filters' are mapped, a kernel each; so a small conv, and one operand at a time (jointly, every operand's tangent
  # is batched over all 42 directions).
  rng = np.random.default_rng(7)
  small = rand(rng, 2, 4, 4, 2), rand(rng, 1, 2, 2, 2), rand(rng, 2)
  tiny = lambda backend: lambda x, w, b: ops.conv2d(x, w, b, groups=2, relu=True, backend=backend)  # noqa: E731
  with jax.default_matmul_precision("highest"):
    y, f_jvp = jax.linearize(f, x, w, b)
    close((y, f_jvp(*tangents)), jax.jvp(reference, (x, w, b), tangents))
    for argnum in (0, 1, 2):
      close(*(jax.jit(jax.jacfwd(tiny(backend), argnum))(*small) for backend in ("interpret", "xla")))


def test_jvp_inside_shard_map_with_check_vma():
  # Images split over two devices, filters replicated: each tangent convolution's operands (its zero bias too) are
  # widened to the images' varying axis, as the fused one's are.
  mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  rng = np.random.default_rng(3)
  x, w, b = rand(rng, 4, 7, 7, 4), rand(rng, 4, 3, 3, 6, scale=0.3), rand(rng, 6)

  def net(backend):
    local = lambda x, w, b: ops.conv2d(x, w, b, padding=1, relu=True, backend=backend)  # noqa: E731
    return jax.shard_map(local, mesh=mesh, in_specs=(P(None, None, None, "data"), P(), P()),
                         out_specs=P(None, None, None, "data"), check_vma=True)

  tangents = like(x, w, b)
  with jax.default_matmul_precision("highest"):
    want = jax.jvp(net("xla"), (x, w, b), tangents)
    got = jax.jit(lambda a, t: jax.jvp(net("interpret"), a, t))((x, w, b), tangents)
  close(got, want)


def kernels_bound(jaxpr):
  """How many times the program binds each conv kernel."""
  counts = collections.Counter()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name.startswith("chwn_conv"):
      counts[eqn.primitive.name.removeprefix("chwn_conv_")] += 1
    for sub in jaxprs_in_params(eqn.params):
      counts.update(kernels_bound(sub))
  return dict(counts)


def test_reverse_mode_runs_one_kernel_of_each_kind():
  # The JVP's tangent convolutions are transposed into the data and filter gradients, never run; an input that is
  # not differentiated (the first layer's images) takes no data gradient.
  args = tiny_net_args()
  loss = tiny_net("interpret")
  assert kernels_bound(jax.make_jaxpr(jax.grad(loss, (0, 1, 2, 3)))(*args).jaxpr) == dict(fwd=1, dgrad=1, wgrad=1)
  assert kernels_bound(jax.make_jaxpr(jax.grad(loss, (1, 2, 3)))(*args).jaxpr) == dict(fwd=1, wgrad=1)
  # Forward mode: the fused forward kernel once, and one linear convolution per nonzero tangent
  jvp = jax.make_jaxpr(lambda a, t: jax.jvp(loss, a, t))(args, like(*args)).jaxpr
  assert kernels_bound(jvp) == dict(fwd=3)


def test_bfloat16_conv_keeps_a_float32_filter_gradient():
  # float32 filters read in bfloat16 by the kernel: their gradient is the filter-gradient kernel's float32 sums, not
  # rounded to bfloat16 on the way (the kernels' bf16 numbers are checked on GPUs: tests/test_gpu_kernels.py).
  rng = np.random.default_rng(4)
  x, w = rand(rng, 4, 7, 7, 3).astype(jnp.bfloat16), rand(rng, 4, 3, 3, 6, scale=0.3)
  grad = jax.grad(lambda w: ops.conv2d(x, w, padding=1, backend="interpret").astype(jnp.float32).sum())(w)
  assert grad.dtype == jnp.float32 and (grad != grad.astype(jnp.bfloat16).astype(jnp.float32)).any()


def test_dense_second_order_in_both_modes():
  rng = np.random.default_rng(5)
  with jax.enable_x64():
    x = jnp.float64(rng.normal(size=(8, 5)))
    for w in (jnp.float64(rng.normal(size=(8, 3))), jnp.float64(rng.normal(size=(2, 8, 3)))):  # one tower, two
      b = jnp.float64(rng.normal(size=w.shape[-1] * (w.shape[0] if w.ndim == 3 else 1)))
      check_grads(lambda x, w, b: ops.dense(x, w, b, relu=True, backend="interpret"), (x, w, b), order=2,
                  modes=("fwd", "rev"))


def test_dense_with_a_wider_output_in_forward_mode():
  # bfloat16 GEMMs with float32 partial sums (the split='sum' layer): the tangent's GEMMs on bfloat16, widened
  # after, so that reverse mode, their transpose, still runs every GEMM of the gradient on bfloat16.
  rng = np.random.default_rng(6)
  x, w, tx, tw = rand(rng, 16, 5), rand(rng, 16, 3, scale=0.3), rand(rng, 16, 5), rand(rng, 16, 3)
  x, tx = x.astype(jnp.bfloat16), tx.astype(jnp.bfloat16)
  f = lambda x, w: ops.dense(x, w, out_dtype=jnp.float32)  # noqa: E731
  y, ty = jax.jvp(f, (x, w), (tx, tw))
  assert y.dtype == ty.dtype == jnp.float32
  narrow = lambda a, b: (a.astype(jnp.bfloat16).T @ b).astype(jnp.float32)  # noqa: E731
  np.testing.assert_allclose(ty, narrow(tw, x) + narrow(w, tx), rtol=1e-6)
  grad = jax.make_jaxpr(lambda x, w: jax.vjp(f, x, w)[1](y))(x, w).jaxpr
  dots = [e for e in grad.eqns if e.primitive.name == "dot_general"]
  assert len(dots) == 2 and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
