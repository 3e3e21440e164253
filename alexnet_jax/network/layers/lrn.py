"""lrn: local response normalisation across channels, a / (k + α·Σa²)^β over `size` neighbouring channels, each
tower's channels apart (the paper's GPUs never saw each other's maps here), its constants in the layer as
cuda-convnet2's `[rnorm]` section has them; before a max-pool, one op with it (ops.lrn_max_pool)."""

import functools

import jax.numpy as jnp
from jax import lax

from alexnet_jax import ops
from alexnet_jax.network.layers.kind import Kind, register_kind


def check(layer):
  if layer.size < 1 or layer.k <= 0 or layer.beta <= 0:
    raise ValueError(f"layer {layer.name}: an LRN layer needs size ≥ 1, k > 0 and beta > 0")


def constants(layer) -> dict:
  """ops.lrn's keywords of the layer's constants."""
  return dict(k=layer.k, n=layer.size, alpha=layer.alpha, beta=layer.beta, alpha_over_n=layer.alpha_over_n)


def run(net, step, x, train):
  del train
  return ops.lrn(x, groups=step.plan.blocks, relu=step.relu_in, backend=net.backend, **constants(step.layer))


def with_max_pool(net, step, x):
  """The LRN and the max-pool after it as one op: the normalised map, the largest array of the step, never leaves
  its kernels. The LRN's output alone is computed only where the intermediates are kept."""
  lrn = dict(groups=step.plan.blocks, relu=step.relu_in, backend=net.backend, **constants(step.layer))
  pool = step.plans[1].layer
  pooled = ops.lrn_max_pool(x, size=pool.size, stride=pool.stride, **lrn)
  return (ops.lrn(x, **lrn) if net.is_mutable_collection("intermediates") else None), pooled


def plain(net, p, x, train):
  """The paper's LRN across channels (NHWC), each of the towers' channel blocks on its own, in the activation
  dtype."""
  del net, train
  layer, n, groups = p.layer, p.layer.size, p.blocks
  squares = jnp.square(x).reshape(*x.shape[:-1], groups, x.shape[-1] // groups)
  sums = lax.reduce_window(squares, 0.0, lax.add, (1, 1, 1, 1, n), (1,) * 5,
                           ((0, 0),) * 4 + ((n // 2, (n - 1) // 2),)).reshape(x.shape)
  alpha = layer.alpha / n if layer.alpha_over_n else layer.alpha
  return x * (layer.k + alpha * sums) ** -layer.beta


def torch(layer, nn, shape, towers):
  """torch.nn.LocalResponseNorm divides α by the window: undone where the layer's α is not."""
  del shape
  import torch as th  # noqa: PLC0415

  alpha = layer.alpha if layer.alpha_over_n else layer.alpha * layer.size
  lrn = nn.LocalResponseNorm(layer.size, alpha, layer.beta, layer.k)

  class TowerLRN(nn.Module):
    """LRN over each tower's channels apart, as the paper's GPUs normalised their own maps."""

    def forward(self, x):
      return th.cat([lrn(t) for t in x.chunk(towers, dim=1)], dim=1)

  return [TowerLRN() if towers > 1 else lrn]


LRN = register_kind(Kind("lrn", run, plain, torch, check=check, takes_relu=True, fuses={"pool": with_max_pool},
                         op=lambda layer, **kw: functools.partial(ops.lrn, **constants(layer), **kw)))
