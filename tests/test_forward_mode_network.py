"""Forward mode through the whole network: jax.jvp and a Hessian-vector product of a two-tower AlexNet's loss, split
over the two simulated CPU devices under shard_map, the kernels under the interpreter against XLA; in bfloat16,
through the gathers across the towers, whose gradient is a float32 reduce-scatter on CPU.

The XLA max pool's custom gradient has no JVP of its own (ops/pool.py): 'xla' takes part in forward mode over reverse
alone, which gives the loss's tangent with the Hessian-vector product."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxprs_in_params

from alexnet_jax.network import model, sharding
from alexnet_jax.network.model import Network
from alexnet_jax.network.table import Layer, Table, alexnet

TABLE = alexnet(num_classes=10, width=0.03)
SIZE = 63  # the smallest image that keeps every layer: conv1 15, pool1 7, pool2 3, pool5 1


def split_logits(backend, dtype=jnp.float32, table=TABLE):
  """logits(params, images) of the network split over two devices, a tower each; dropout off."""
  apply = sharding.sharded_apply(Network(table, weight_init="he", backend=backend, dtype=dtype),
                                 sharding.make_mesh(model=2))
  return lambda params, x: apply(params, x, jax.random.key(2), False)


def split_loss(backend, dtype=jnp.float32, table=TABLE):
  logits = split_logits(backend, dtype, table)
  return lambda params, x: (logits(params, x) ** 2).mean()


@functools.cache
def point(table=TABLE):
  """(params, images) and tangents of both, random: the weights at 1/√fan-in (drawn here, not by the network's
  initialiser, whose compile costs seconds), so that every layer's activations stay of order one."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, SIZE, SIZE, 1)), jnp.float32)
  shapes = jax.eval_shape(Network(table).init, jax.random.key(0), x)["params"]
  scale = lambda shape: 1 / np.sqrt(np.prod(shape[1:-1])) if len(shape) > 2 else 0.1  # noqa: E731  (biases: 0.1)
  args = (jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * scale(s.shape), s.dtype), shapes), x)
  return args, jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype), args)


def close(got, want, rtol=1e-4):
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(jnp.abs(w).max())),
               got, want)


def test_jvp_and_hessian_vector_product_of_the_split_network_match_xla():
  # Forward mode alone (jax.jvp: the kernels' tangents), and forward over reverse (the kernels' backward passes
  # differentiated, the LRN-pools' in x by XLA): the parameters' gradient in the direction of parameters and images
  # (conv1's data gradient, stride 4, is the interpreter's slowest kernel). (~140 kernel runs: ~20 s.)
  args, tangents = point()
  with jax.default_matmul_precision("highest"):
    value_and_grad = lambda a: jax.value_and_grad(split_loss("xla"))(*a)  # noqa: E731
    want = jax.jit(lambda a, t: jax.jvp(value_and_grad, (a,), (t,)))(args, tangents)
    loss = split_loss("interpret")
    got_jvp = jax.jit(lambda a, t: jax.jvp(loss, a, t))(args, tangents)
    got_hvp = jax.jit(lambda a, t: jax.jvp(jax.grad(loss), a, t)[1])(args, tangents)
  (want_loss, _), (want_tangent, want_hvp) = want
  close(got_jvp, (want_loss, want_tangent))
  close(got_hvp, want_hvp)
  # Reverse mode: each LRN-pool's two kernels (lrn1, lrn2), the tangents transposed away.
  grad = str(jax.make_jaxpr(jax.grad(loss))(*args))
  assert grad.count("chwn_lrn_max_pool_fwd[") == grad.count("chwn_lrn_max_pool_bwd[") == 2 and "_tangent[" not in grad


# AlexNet's towers and their reads across devices (conv3, fc6, fc7) without the max pools, whose XLA reference has no
# JVP: the bfloat16 gathers in forward mode with XLA's own operations around them.
UNPOOLED = Table((Layer("conv1", "conv", filters=6, size=11, stride=4, padding=2),
                  Layer("lrn1", "lrn", size=5, k=2.0, alpha=1e-4, beta=0.75),
                  Layer("conv2", "conv", filters=16, size=5, stride=2, padding=2),
                  Layer("conv3", "conv", filters=24, size=3, padding=1, inputs="all"),
                  Layer("fc6", "fc", filters=32, inputs="all"),
                  Layer("fc7", "fc", filters=32, inputs="all"),
                  Layer("fc8", "fc", filters=10, split="sum", relu=False)), towers=2)


def operand_types(jaxpr, primitive):
  """The dtype of each operand of each binding of `primitive`, in the order they are bound."""
  found = []
  for eqn in jaxpr.eqns:
    found += [v.aval.dtype for v in eqn.invars] if eqn.primitive.name == primitive else []
    for sub in jaxprs_in_params(eqn.params):
      found += operand_types(sub, primitive)
  return found


def test_bfloat16_jvp_through_the_gathers_of_the_split_network():
  # conv3, fc6 and fc7 gather their inputs, and each its tangent, in bfloat16.
  args, tangents = point(UNPOOLED)
  want = jax.jit(lambda a, t: jax.jvp(split_logits("xla", table=UNPOOLED), a, t))(args, tangents)
  jvp = lambda a, t: jax.jvp(split_logits("xla", jnp.bfloat16, UNPOOLED), a, t)  # noqa: E731
  assert operand_types(jax.make_jaxpr(jvp)(args, tangents).jaxpr, "tower_all_gather") == [jnp.bfloat16] * 6
  close(jax.jit(jvp)(args, tangents), want, rtol=5e-2)
  # The kernels' rules in bfloat16 through the paper's network, LRN-pools' tangents and gathers in bfloat16; run, as
  # the interpreter's bf16 dot is wrong, not compared.
  args, tangents = point()
  jvp = lambda a, t: jax.jvp(split_loss("interpret", jnp.bfloat16), a, t)  # noqa: E731
  traced = jax.make_jaxpr(jvp)(args, tangents).jaxpr
  assert operand_types(traced, "tower_all_gather") == [jnp.bfloat16] * 6
  assert operand_types(traced, "chwn_lrn_max_pool_tangent") == [jnp.bfloat16, jnp.bfloat16, jnp.int8] * 2
  jax.block_until_ready(jax.jit(jvp)(args, tangents))


def scatter_types(text):
  """The element type of each reduce-scatter's result in a StableHLO module (its type follows its body, lines later)."""
  return re.findall(r'"stablehlo.reduce_scatter"\(.*?[)>] : \(tensor<[^>]*>\) -> tensor<[0-9x]*x(\w+)>', text, re.S)


def test_bfloat16_gradient_scatters_in_float32_on_cpu_without_a_conditional():
  # The gathers' transpose chooses by the platform it is lowered for, inside the backward pass, where XLA folds the
  # choice away: no conditional is left. float32_scatters, around the tracing, widens them for every platform.
  args, _ = point(UNPOOLED)
  grad = lambda: jax.jit(jax.grad(split_loss("xla", jnp.bfloat16, UNPOOLED)))  # noqa: E731  (traced afresh)
  lowered = grad().lower(*args)
  assert scatter_types(lowered.as_text()) == ["f32"] * 3
  compiled = lowered.compile().as_text()
  assert compiled.count(" reduce-scatter(") == 3 and " conditional(" not in compiled
  assert scatter_types(jax.export.export(grad(), platforms=["tpu"])(*args).mlir_module()) == ["bf16"] * 3
  with model.float32_scatters():
    assert scatter_types(jax.export.export(grad(), platforms=["tpu"])(*args).mlir_module()) == ["f32"] * 3
