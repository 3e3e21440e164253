"""The benchmark's yardstick: a layer table as a JAX user would write it with plain XLA, no kernels of ours.

NHWC activations and HWIO kernels (XLA's and cuDNN's favourite layouts), `lax.conv_general_dilated` in the compute
dtype, `reduce_window` for max-pooling and LRN's channel sum, `jnp.dot` for the fc layers, and the paper's tower
split with `jax.shard_map`: all-gathers where a layer reads every tower (conv3, fc6, fc7), a psum where each tower's
partial outputs are summed (fc8). On one device the towers are grouped convolutions (`feature_group_count`); data
parallelism is the same shard_map over 'data', the gradients summed by differentiating through it. (Left to
itself, XLA:CPU partitioned the grouped convolutions of the jitted one-device program over 'data' with
all-gathers of activations.) Parameters are float32 and cast where they are used.

Each weight is one array as a plain model holds it, the towers' filters one block after another on its output
axis: conv kernels (KH, KW, C_in/groups, F), fc kernels (F_in, F_out) with the first fc reading the maps flattened in
(H, W, C) order, biases (F,). A tower split shards the output axis over 'model' (split='sum': the input axis).
`from_ours` maps `Network`'s parameters across, so both compute the same function (tests/test_baseline.py).
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from alexnet_jax.network import placement
from alexnet_jax.network.interchange import to_torch
from alexnet_jax.network.layers import kind_of
from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.network.table import Layer, Table, initial_weights


class PlainNetwork(nn.Module):
  """Applies a layer table to NHWC images (N, H, W, 3) and returns logits (N, classes) in float32."""

  table: Table
  dtype: Any = jnp.float32
  tower_axis: str | None = None  # mesh axis the towers are spread over (inside shard_map); None: all towers here
  weight_init: str = "paper"  # as Network's (table.initial_weights)

  @nn.compact
  def __call__(self, x, *, train: bool = False):
    plan = placement.plan(self.table, model=lax.axis_size(self.tower_axis) if self.tower_axis else 1)
    x = x.astype(self.dtype)
    for p in plan.layers:
      layer = p.layer
      if p.split_batch or p.weights == placement.SLICES or set(p.read) - {placement.GATHER}:
        raise ValueError(f"layer {layer.name}: the plain network places layers on towers or data only")
      with jax.named_scope(layer.name):
        if p.read:  # every tower's maps or features, gathered over the devices
          x = lax.all_gather(x, self.tower_axis, axis=x.ndim - 1, tiled=True)
        x = kind_of(layer).plain(self, p, x, train)
    if plan.gather_output:  # the last layer split its outputs over towers: every device needs all
      x = lax.all_gather(x, self.tower_axis, axis=x.ndim - 1, tiled=True, to="invarying")
    return x.astype(jnp.float32)

  def weights(self, layer: Layer, shape: tuple[int, ...]):
    """The layer's kernel of `shape` and its bias, in the compute dtype."""
    kernel, bias = Weights(layer, shape, self.weight_init, name=layer.name)()
    return kernel.astype(self.dtype), bias.astype(self.dtype)


class Weights(nn.Module):
  """A layer's kernel of `shape` and its bias (F,)."""

  layer: Layer
  shape: tuple[int, ...]
  weight_init: str

  @nn.compact
  def __call__(self):
    fan_out = int(np.prod(self.shape[1:])) if len(self.shape) == 4 else self.shape[-1]  # conv (C_in, KH, KW, F)
    std, bias_init = initial_weights(self.layer, int(np.prod(self.shape[:-1])), fan_out, self.weight_init)
    kernel = self.param("kernel", lambda key, s: std * jax.random.normal(key, s, jnp.float32), self.shape)
    return kernel, self.param("bias", lambda _, s: jnp.full(s, bias_init, jnp.float32), (self.shape[-1],))


def param_specs(plan: placement.Plan, params, tower_axis: str | None = "model"):
  """Each weight as the plan places it over `tower_axis` (None: every weight whole): one split over the towers on
  its output axis, or a split='sum' kernel on its input axis; a split='sum' bias, and a whole weight, replicated."""

  def spec(path, leaf):
    name, kind = (k.key for k in path[-2:])
    p = plan[name]
    if tower_axis is None or not p.split_weights[kind]:
      return P()
    if p.layer.split == "sum":
      return P(tower_axis, None)
    return P(*(None,) * (len(leaf.shape) - 1), tower_axis)

  return jax.tree_util.tree_map_with_path(spec, params)


def sharded_apply(net: PlainNetwork, mesh):
  """apply(params, images_nhwc, dropout_key, train) → logits (N, classes), the towers over the mesh axis 'model' and
  the batch over 'data' under shard_map (axes of one device are left out); on one device, just the network."""
  plan = placement.plan(net.table, model=mesh.shape["model"], data=mesh.shape["data"])
  manual = {axis for axis in ("data", "model") if mesh.shape[axis] > 1}
  batch = "data" if "data" in manual else None
  node = net.clone(tower_axis="model" if "model" in manual else None)

  def apply(params, images, key, train):
    if batch:  # each data shard draws its own dropout masks
      key = jax.random.fold_in(key, lax.axis_index("data"))
    return node.apply({"params": params}, images, train=train, rngs={"dropout": key})

  def run(params, images, key, train=False):
    if not manual:
      return apply(params, images, key, train)
    specs = param_specs(plan, params, node.tower_axis)
    fn = jax.shard_map(functools.partial(apply, train=train), mesh=mesh, axis_names=manual,
                       in_specs=(specs, P(batch), P()), out_specs=P(batch))
    return fn(params, images, key)

  return run


def init_params(net: PlainNetwork, key, image_size: int):
  return net.init(key, jnp.zeros((1, image_size, image_size, 3)), train=False)["params"]


def param_shardings(mesh, table: Table, params):
  plan = placement.plan(table, model=mesh.shape["model"], data=mesh.shape["data"])
  return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(plan, params))


def from_ours(params, table: Table, image_size: int = 224) -> dict:
  """`Network`'s parameters (host or sharded) → PlainNetwork's, float32 numpy: through the PyTorch layout
  (interchange.py), conv kernels OIHW → HWIO, fc kernels transposed, and the first fc's rows from (C, H, W) order to
  NHWC's (H, W, C)."""
  torch = to_torch(params, table)
  inputs = layer_shapes(table, image_size).inputs
  out = {}
  for layer in table.weighted():
    w = torch[f"{layer.name}.weight"]
    if w.ndim == 4:
      kernel = w.transpose(2, 3, 1, 0)
    elif len(inputs[layer.name]) == 4:  # the first fc: it reads (C, H, W, N) maps
      c, h, wd, _ = inputs[layer.name]
      kernel = w.reshape(-1, c, h, wd).transpose(2, 3, 1, 0).reshape(h * wd * c, -1)
    else:
      kernel = w.T
    out[layer.name] = {"kernel": np.ascontiguousarray(kernel), "bias": torch[f"{layer.name}.bias"]}
  return out
