"""Forward-mode differentiation of the conv, dense, pool and LRN ops: jvp, linearize, jacfwd and Hessian-vector
products of the Triton kernels under the interpreter ('interpret') against the XLA reference ('xla'), and reverse mode
still one kernel of each kind. float32: the kernels take float64 to the reference, and the interpreter's bf16 dot is
wrong (tests/test_forward_mode_network.py: the whole network)."""

import collections
import contextlib
import functools
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals
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
    # a ReLU's output (x ≥ 0, zeros where its input was negative) with that ReLU's mask left to the conv
    "relu_in_bias_groups2_pad1": (dict(padding=1, groups=2, relu_in=True), True),
}


def conv_case(name, backend):
  """(f, args) for one conv of CONVS: x (4, 7, 7, 3), 3×3 filters."""
  kw, bias = CONVS[name]
  rng = np.random.default_rng(0)  # the same numbers whichever tests run
  x, w = rand(rng, 4, 7, 7, 3), rand(rng, 4 // kw.get("groups", 1), 3, 3, 6, scale=0.3)
  x = jnp.maximum(x, 0) if kw.get("relu_in") else x
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


def equations(jaxpr):
  """The program's equations, those of its inner programs (jit, shard_map, …) included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jaxprs_in_params(eqn.params):
      yield from equations(sub)


def kernels_bound(jaxpr):
  """How many times the program binds each conv kernel: the filter gradient's with the bias gradient as wgrad+bias,
  a forward kernel that leaves its ReLU's mask to the next as +relu_left, one reading a ReLU's output whose mask it
  applies as +relu_in, one taking a mask source (the data gradient's masks dx) as +mask."""
  def name(eqn):
    kind, images = eqn.primitive.name.removeprefix("chwn_conv_"), eqn.params.get("images", "plain")
    masked = images == "masked" or (kind == "dgrad" and len(eqn.invars) == 3)
    return kind + ("+bias" if eqn.params.get("bias") else "") + (
        "+relu_left" if eqn.params.get("relu_left") else "") + ("+relu_in" if images == "clamped" else "") + (
        "+mask" if masked else "")

  return dict(collections.Counter(name(e) for e in equations(jaxpr) if e.primitive.name.startswith("chwn_conv")))


def test_reverse_mode_runs_one_kernel_of_each_kind():
  # The JVP's tangent convolutions are transposed into the data and filter gradients, never run; an input that is
  # not differentiated (the first layer's images) takes no data gradient.
  # The bias gradient comes out of the filter gradient's kernel, from the cotangent it reads anyway: no reduction
  # of the cotangent over H·W·N of its own.
  args = tiny_net_args()
  loss = tiny_net("interpret")
  grad = jax.make_jaxpr(jax.grad(loss, (0, 1, 2, 3)))(*args).jaxpr
  assert kernels_bound(grad) == {"fwd": 1, "dgrad": 1, "wgrad+bias": 1}
  assert not [e for e in equations(grad) if e.primitive.name == "reduce_sum" and e.invars[0].aval.ndim == 4]
  assert kernels_bound(jax.make_jaxpr(jax.grad(loss, (1, 2, 3)))(*args).jaxpr) == {"fwd": 1, "wgrad+bias": 1}
  assert kernels_bound(jax.make_jaxpr(jax.grad(loss, (1, 3)))(*args).jaxpr) == dict(fwd=1, wgrad=1)
  # the bias alone: its gradient summed by XLA, no filter gradient
  assert kernels_bound(jax.make_jaxpr(jax.grad(loss, 2))(*args).jaxpr) == dict(fwd=1)
  # Forward mode: the fused forward kernel once, and one linear convolution per nonzero tangent
  jvp = jax.make_jaxpr(lambda a, t: jax.jvp(loss, a, t))(args, like(*args)).jaxpr
  assert kernels_bound(jvp) == dict(fwd=3)


def two_convs(backend, deferred):
  """conv → ReLU → conv → squared loss; `deferred`: the first conv leaves its ReLU's mask to the second, as a
  network's conv before another does."""
  def loss(x, w1, b1, w2, b2):
    y = ops.conv2d(x, w1, b1, padding=1, groups=2, relu="left" if deferred else True, backend=backend)
    return (ops.conv2d(y, w2, b2, stride=2, padding=1, relu_in=deferred, backend=backend) ** 2).sum()

  rng = np.random.default_rng(7)
  return loss, (rand(rng, 4, 7, 7, 3), rand(rng, 2, 3, 3, 6, scale=0.3), rand(rng, 6), rand(rng, 6, 3, 3, 5, scale=0.3),
                rand(rng, 5))


def test_a_relu_left_to_the_next_conv_is_the_same_function_and_masks_in_the_kernels():
  # The first conv clamps its output, the second applies the ReLU's mask: the same loss, gradient and
  # Hessian-vector product as the ReLU between the convs in XLA; in reverse mode the data gradient's kernel masks
  # dx, and no select of a cotangent is left to XLA (the ReLU fused whole into the first conv leaves one: the test
  # can tell).
  loss, args = two_convs("interpret", deferred=True)
  grad = jax.value_and_grad(loss, range(5))
  hvp = lambda f, a, t: jax.jvp(jax.grad(f, range(5)), a, t)  # noqa: E731
  with jax.default_matmul_precision("highest"):
    close(jax.jit(grad)(*args), jax.value_and_grad(two_convs("xla", deferred=False)[0], range(5))(*args))
    close(jax.jit(functools.partial(hvp, loss))(args, like(*args)), hvp(two_convs("xla", False)[0], args, like(*args)))
  selects = lambda f: [e for e in equations(jax.make_jaxpr(jax.grad(f, range(5)))(*args).jaxpr)  # noqa: E731
                       if e.primitive.name == "select_n" and e.invars[-1].aval.ndim == 4]
  assert selects(loss) == [] and len(selects(two_convs("interpret", deferred=False)[0])) == 1
  assert kernels_bound(jax.make_jaxpr(jax.grad(loss, range(5)))(*args).jaxpr) == {
      "fwd+relu_left": 1, "fwd+relu_in": 1, "dgrad": 1, "dgrad+mask": 1, "wgrad+bias": 1, "wgrad+bias+relu_in": 1}


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


def pool_counts(jaxpr, kind):
  """How many times the program binds each kernel of one pool kind, by the rest of its name ('fwd', 'bwd')."""
  counts = collections.Counter()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name.startswith(f"chwn_{kind}_"):
      counts[eqn.primitive.name.removeprefix(f"chwn_{kind}_")] += 1
    for sub in jaxprs_in_params(eqn.params):
      counts.update(pool_counts(sub, kind))
  return dict(counts)


AVG_POOLS = {
    # name: op on x (3, 7, 7, 4), with its backend
    "avg_3s2p1": lambda backend: functools.partial(ops.avg_pool, size=3, stride=2, padding=1, backend=backend),
    "avg_2s2": lambda backend: functools.partial(ops.avg_pool, size=2, stride=2, backend=backend),
    "global_avg": lambda backend: functools.partial(ops.global_avg_pool, backend=backend),
}


def pool_input(seed=8):
  return rand(np.random.default_rng(seed), 3, 7, 7, 4)


@pytest.mark.parametrize("name", sorted(AVG_POOLS))
def test_avg_pool_jvp_and_jacfwd_match_the_reference(name):
  x, (t,) = pool_input(), like(pool_input())
  got = jax.jit(lambda x, t: jax.jvp(AVG_POOLS[name]("interpret"), (x,), (t,)))(x, t)
  close(got, jax.jvp(AVG_POOLS[name]("xla"), (x,), (t,)))
  small = x[:2, :4, :4, :2]  # jacfwd: 64 directions fold into the image axis N, one kernel
  close(*(jax.jit(jax.jacfwd(AVG_POOLS[name](backend)))(small) for backend in ("interpret", "xla")))


@pytest.mark.parametrize("name", sorted(AVG_POOLS))
def test_avg_pool_second_order_in_both_modes(name):
  # Linear: a central difference is exact up to float32's rounding, so a loose tolerance finds a wrong rule.
  f = AVG_POOLS[name]("interpret")
  check_grads(jax.jit(lambda x: f(x) ** 2), (pool_input(),), order=2, modes=("fwd", "rev"), eps=1e-2, atol=1e-2,
              rtol=1e-2)


@pytest.mark.parametrize("name,kind", [("avg_3s2p1", "avg_pool"), ("global_avg", "global_avg_pool")])
def test_avg_pool_reverse_mode_runs_its_two_kernels(name, kind):
  # The tangent's pool is transposed into the backward kernel, never run; forward mode pools the tangent alone.
  loss = lambda x: (AVG_POOLS[name]("interpret")(x) ** 2).sum()  # noqa: E731
  x = pool_input()
  assert pool_counts(jax.make_jaxpr(jax.grad(loss))(x).jaxpr, kind) == dict(fwd=1, bwd=1)
  assert pool_counts(jax.make_jaxpr(lambda x, t: jax.jvp(loss, (x,), (t,)))(x, x).jaxpr, kind) == dict(fwd=2)


def separated(*shape, seed=9):
  """Distinct values 0.1 apart, shuffled: no window's maximum changes under a finite difference's step."""
  values = np.random.default_rng(seed).permutation(np.prod(shape)) * 0.1 - 0.05 * np.prod(shape)
  return jnp.asarray(values.reshape(shape), jnp.float32)


def lax_max_pool(x, relu):
  """lax's own max pool, differentiable both ways (the op's reference has a custom gradient: reverse mode only)."""
  x = jax.nn.relu(x) if relu else x
  return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "VALID")


@pytest.mark.parametrize("relu", [False, True])
def test_max_pool_jvp_and_jacfwd_match_lax(relu):
  # The tangent is dx at each window's maximum (none where ReLU leaves no positive one); jacfwd's directions fold
  # into the image axis N of one gather.
  f = functools.partial(ops.max_pool, relu=relu, backend="interpret")
  x, (t,) = separated(3, 7, 7, 4), like(separated(3, 7, 7, 4))
  got = jax.jit(lambda x, t: jax.jvp(f, (x,), (t,)))(x, t)
  np.testing.assert_array_equal(got[1], jax.jvp(functools.partial(lax_max_pool, relu=relu), (x,), (t,))[1])
  small = x[:2, :5, :5, :2]
  want = jax.jacfwd(functools.partial(lax_max_pool, relu=relu))(small)
  np.testing.assert_array_equal(jax.jit(jax.jacfwd(f))(small), want)
  # Reverse over forward: the gather's transpose is the backward kernel.
  transposed = lambda f: jax.grad(lambda t: (jax.jvp(f, (x,), (t,))[1] ** 2).sum())(t)  # noqa: E731
  close(jax.jit(lambda: transposed(f))(), transposed(functools.partial(lax_max_pool, relu=relu)))


def test_max_pool_second_order_in_both_modes():
  f = lambda x: ops.max_pool(x, relu=True, backend="interpret") ** 2  # noqa: E731
  check_grads(jax.jit(f), (separated(3, 7, 7, 4),), order=2, modes=("fwd", "rev"), eps=1e-2, atol=1e-2, rtol=1e-2)


def pooled_net(backend):
  """conv → ReLU → max pool → dense → squared loss."""
  def loss(x, w, b, w2):
    y = ops.conv2d(x, w, b, padding=1, backend=backend)
    y = ops.max_pool(y, relu=True, backend=backend)
    return (ops.dense(y.reshape(-1, y.shape[-1]), w2, backend=backend) ** 2).sum()

  rng = np.random.default_rng(10)
  return loss, (rand(rng, 4, 7, 7, 3), rand(rng, 4, 3, 3, 6, scale=0.3), rand(rng, 6), rand(rng, 6 * 3 * 3, 5))


def hvp_against_the_reference(net):
  """A Hessian-vector product (forward over reverse) of net('interpret')'s loss against net('xla')'s."""
  loss, args = net("interpret")
  tangents = like(*args)
  hvp = lambda loss, a, t: jax.jvp(jax.grad(loss, (0, 1, 2, 3)), a, t)  # noqa: E731
  with jax.default_matmul_precision("highest"):
    want = jax.jit(functools.partial(hvp, net("xla")[0]))(args, tangents)
    got = jax.jit(functools.partial(hvp, loss))(args, tangents)
  close(got, want)


def test_hessian_vector_product_through_max_pool_matches_the_reference():
  hvp_against_the_reference(pooled_net)


def test_max_pool_reverse_mode_runs_its_two_kernels():
  # The gather at the maxima is transposed into the backward kernel, never run: the gradient is that kernel's own
  # (equal bit for bit), and forward mode gathers instead of running it.
  loss, args = pooled_net("interpret")
  grad = jax.make_jaxpr(jax.grad(loss, (0, 1, 2, 3)))(*args).jaxpr
  assert pool_counts(grad, "max_pool") == dict(fwd=1, bwd=1)
  assert kernels_bound(grad) == {"fwd": 1, "dgrad": 1, "wgrad+bias": 1}
  jvp = jax.make_jaxpr(lambda a, t: jax.jvp(loss, a, t))(args, like(*args)).jaxpr
  assert pool_counts(jvp, "max_pool") == dict(fwd=1, gather=1)
  from alexnet_jax.ops.pool import POOL_BWD, POOL_FWD  # noqa: PLC0415
  x = args[0]
  y, idx = POOL_FWD(x, mode="interpret", size=3, stride=2, relu=True)
  own = POOL_BWD(2 * y, idx, mode="interpret", size=3, stride=2, height=7, width=7)[0]
  grad = jax.jit(jax.grad(lambda x: (ops.max_pool(x, relu=True, backend="interpret") ** 2).sum()))(x)
  np.testing.assert_array_equal(grad, own)


def lrn_case(name, backend, relu):
  """(op, x): the LRN over 4 channels in 2 groups, the LRN-pool over 2 (the interpreter walks its channels slowly);
  α large enough for the normaliser to bend; distinct values, none near the ReLU's kink, so that no window's maximum
  and no ReLU's side changes under a finite difference's step."""
  if name == "lrn":
    return functools.partial(ops.lrn, groups=2, alpha=1e-3, relu=relu, backend=backend), separated(4, 4, 4, 2) * 3 + 0.1
  return (functools.partial(ops.lrn_max_pool, alpha=1e-3, relu=relu, backend=backend),
          separated(2, 5, 5, 2) * 3 + 0.1)


def lrn_reference(name, relu):
  """The op in XLA, differentiable both ways: the LRN's reference, pooled by lax's max pool."""
  f = functools.partial(ops.lrn_reference, groups=2 if name == "lrn" else 1, alpha=1e-3, relu=relu)
  return f if name == "lrn" else lambda x: lax_max_pool(f(x), relu=False)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("name", ["lrn", "lrn_max_pool"])
def test_lrn_jvp_and_jacfwd_match_the_reference(name, relu):
  # The tangent is XLA's JVP of the reference (at the kernel's chosen maxima); jacfwd's directions fold into the image
  # axis N of one tangent, the forward kernel run once.
  f, x = lrn_case(name, "interpret", relu)
  (t,) = like(x)
  close(jax.jit(lambda x, t: jax.jvp(f, (x,), (t,)))(x, t), jax.jvp(lrn_reference(name, relu), (x,), (t,)))
  close(jax.jit(jax.jacfwd(f))(x), jax.jacfwd(lrn_reference(name, relu))(x))


@pytest.mark.parametrize("name", ["lrn", "lrn_max_pool"])
def test_lrn_bfloat16_jvp_matches_the_reference(name):
  # The LRN kernels' bfloat16 is right under the interpreter: the tangent in bfloat16, computed in float32 within.
  f, x = lrn_case(name, "interpret", relu=True)
  x, t = x.astype(jnp.bfloat16), like(x)[0].astype(jnp.bfloat16)
  y, ty = jax.jit(lambda x, t: jax.jvp(f, (x,), (t,)))(x, t)
  assert y.dtype == ty.dtype == jnp.bfloat16
  close((y, ty), jax.jvp(lrn_reference(name, relu=True), (x,), (t,)), rtol=2.0 ** -7)


@pytest.mark.parametrize("name,order", [("lrn", 2), ("lrn_max_pool", 1)])
def test_lrn_gradients_in_both_modes(name, order):
  # Second order: the tangent and the backward kernel, each the other's transpose, differentiated in x by XLA. The
  # LRN-pool to first order: its kernels are the interpreter's slowest (its second order: the Hessian-vector product
  # below). (LRN: 37 kernel runs, ~12 s.)
  f, x = lrn_case(name, "interpret", relu=True)
  check_grads(jax.jit(f), (x,), order=order, modes=("fwd", "rev"), eps=1e-2, atol=1e-2, rtol=1e-2)


def normalised_net(backend):
  """conv → ReLU → LRN → LRN-pool → dense → squared loss: conv1 and conv2's tails in one."""
  def loss(x, w, b, w2):
    y = ops.conv2d(x, w, b, padding=1, backend=backend)
    y = ops.lrn(y, alpha=1e-3, relu=True, backend=backend)
    y = ops.lrn_max_pool(y, alpha=1e-3, backend=backend)
    return (ops.dense(y.reshape(-1, y.shape[-1]), w2, backend=backend) ** 2).sum()

  rng = np.random.default_rng(11)
  return loss, (rand(rng, 3, 7, 7, 2), rand(rng, 3, 3, 3, 2, scale=10), rand(rng, 2), rand(rng, 2 * 3 * 3, 4))


def test_hessian_vector_product_through_lrn_matches_the_reference():
  hvp_against_the_reference(normalised_net)


def test_lrn_reverse_mode_runs_its_two_kernels_and_keeps_x():
  # The tangents are transposed into the backward kernels, never run; what the forward pass keeps for the backward is
  # x (and the LRN-pool's choices), as a custom VJP would: no float32 normaliser.
  loss, args = normalised_net("interpret")
  grad = jax.make_jaxpr(jax.grad(loss, (0, 1, 2, 3)))(*args).jaxpr
  assert pool_counts(grad, "lrn") == {"fwd": 1, "bwd": 1, "max_pool_fwd": 1, "max_pool_bwd": 1}
  jvp = jax.make_jaxpr(lambda a, t: jax.jvp(loss, a, t))(args, like(*args)).jaxpr
  assert pool_counts(jvp, "lrn") == {"fwd": 1, "tangent": 1, "max_pool_fwd": 1, "max_pool_tangent": 1}
  for name in ("lrn", "lrn_max_pool"):
    f, x = lrn_case(name, "interpret", relu=True)
    kept = io.StringIO()
    with contextlib.redirect_stdout(kept):
      print_saved_residuals(f, x)
    assert [line.split(" ")[0] for line in kept.getvalue().splitlines()] == (
        ["f32[4,4,4,2]"] if name == "lrn" else ["f32[2,5,5,2]", "i8[2,2,2,2]"])
