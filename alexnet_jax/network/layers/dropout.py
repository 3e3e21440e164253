"""dropout: units dropped at `rate` in training, the kept ones scaled by 1/(1 − rate); one mask per tower over its
units and the global batch, so that every placement drops the same units of the same examples."""

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.network.layers.kind import Kind, register_kind


def run(net, step, x, train):
  """Each device applies its units and rows of the masks, keyed by the global tower index."""
  p, rate = step.plan, step.layer.rate
  if not train or rate == 0.0:
    return x
  key = net.make_rng("dropout")
  k, towers = net.slices(), p.blocks
  first = net.device_index() * towers if p.input == "towers" else 0
  units = x.shape[0] // towers
  unit0 = net.device_index() * units if p.input == "slices" else 0
  row0, rows = net.rows(x.shape[-1], p.split_batch)
  full = (units * (k if p.input == "slices" else 1), *x.shape[1:-1], rows)

  def drop(block, t):
    keep = jax.random.bernoulli(jax.random.fold_in(key, first + t), 1.0 - rate, full)
    keep = lax.dynamic_slice(keep, (unit0, *(0,) * (x.ndim - 2), row0), block.shape)
    return jnp.where(keep, block / (1.0 - rate), jnp.zeros_like(block))

  return jax.vmap(drop)(x.reshape(towers, units, *x.shape[1:]), jnp.arange(towers)).reshape(x.shape)


def plain(net, p, x, train):
  rate = p.layer.rate
  if not train or rate == 0.0:
    return x
  key = net.make_rng("dropout")
  key = jax.random.fold_in(key, lax.axis_index(net.tower_axis)) if net.tower_axis else key
  return jnp.where(jax.random.bernoulli(key, 1.0 - rate, x.shape), x / (1.0 - rate), 0)


def torch(layer, nn, shape, towers):
  del shape, towers
  return [nn.Dropout(layer.rate)]


DROPOUT = register_kind(Kind("dropout", run, plain, torch, maps=False, sliced=True))
