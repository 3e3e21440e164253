"""The network of a layer table (networks.py) as a flax module, with its towers local or spread over a mesh axis.

Every weight carries a leading tower axis: conv kernels are (towers, C_in, KH, KW, F/towers), fc kernels
(towers, F_in, F_out/towers), biases (towers, F/towers). Under `jax.shard_map` that axis is split over the mesh axis
`tower_axis`, so each device holds and computes its own towers; with `tower_axis=None` one device holds them all and
runs them as grouped convolutions. Both run the same code on the same parameters, and give the same numbers.

Activations are batch-last: CHWN in the conv stack, (features, N) after it; a tower-split activation holds the
local towers' channels one block after another. Cross-device traffic happens only where a layer has
`inputs='all'` (all-gather of every tower's maps) or `split='sum'` (all-reduce of partial outputs).
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax import ops
from alexnet_jax.networks import Layer

INITS = ("paper", "he")


def _fan_in(shape, split: str) -> int:
  if len(shape) == 5:  # conv (towers, C_in, KH, KW, F)
    return shape[1] * shape[2] * shape[3]
  return shape[0] * shape[1] if split == "sum" else shape[1]


class TowerWeights(nn.Module):
  """Kernel and bias of one layer; the bias of a split='sum' layer has no tower axis."""

  layer: Layer
  kernel_shape: tuple[int, ...]
  weight_init: str

  @nn.compact
  def __call__(self):
    split = self.layer.split
    std = 0.01 if self.weight_init == "paper" else (2.0 / _fan_in(self.kernel_shape, split)) ** 0.5
    kernel = self.param("kernel", lambda key, s: std * jax.random.normal(key, s, jnp.float32), self.kernel_shape)
    bias_shape = (self.kernel_shape[-1],) if split == "sum" else (self.kernel_shape[0], self.kernel_shape[-1])
    bias_init = self.layer.bias_init if self.weight_init == "paper" else 0.0
    bias = self.param("bias", lambda _, s: jnp.full(s, bias_init, jnp.float32), bias_shape)
    return kernel, bias.reshape(-1)


class Network(nn.Module):
  """Applies a layer table to CHWN images (3, H, W, N) and returns logits (N, classes) in float32."""

  layers: tuple[Layer, ...]
  towers: int = 2
  tower_axis: str | None = None  # mesh axis the towers are spread over; None: all towers on this device
  dtype: Any = jnp.float32  # compute dtype; parameters stay float32
  # 'paper': N(0, 0.01) and the table's biases; 'he': N(0, 2/fan_in) and zero biases, which trains small nets faster
  weight_init: str = "paper"
  lrn_alpha_over_n: bool = False
  backend: str = "auto"

  def _local_towers(self) -> int:
    return self.towers // lax.axis_size(self.tower_axis) if self.tower_axis else self.towers

  def _gather(self, x, to="varying"):
    """Every tower's maps, tower by tower: the all-gather that makes a layer read across devices."""
    if not self.tower_axis:
      return x
    # XLA:CPU (jaxlib 0.11.2) aborts compiling a bfloat16 reduce-scatter, the gather's gradient; GPUs keep bf16.
    wide = x.dtype == jnp.bfloat16 and jax.default_backend() == "cpu"
    y = lax.all_gather(x.astype(jnp.float32) if wide else x, self.tower_axis, axis=0, tiled=True, to=to)
    return y.astype(x.dtype)

  @nn.compact
  def __call__(self, x, *, train: bool = False):
    local = self._local_towers()
    split = False  # does x hold per-tower blocks? The image is read whole by every tower.
    activations = {}
    x = x.astype(self.dtype)
    for layer in self.layers:
      with jax.named_scope(layer.name):
        if layer.kind in ("conv", "fc"):
          x, split = self._weighted(layer, x, split, local)
        elif layer.kind == "lrn":
          x = ops.lrn(x, **ops.LRN_PAPER | dict(n=layer.size), alpha_over_n=self.lrn_alpha_over_n,
                      groups=local if split else 1, backend=self.backend)
        elif layer.kind == "pool":
          x = ops.max_pool(x, size=layer.size, stride=layer.stride, backend=self.backend)
        elif layer.kind == "dropout" and train:
          x = self._dropout(x, layer.rate, local if split else 1)
      activations[layer.name] = x
    if x.ndim != 2:
      raise ValueError("a layer table must end with an fc layer")
    self.sow("intermediates", "activations", activations)  # kept when applied with mutable=["intermediates"]
    if split:  # the last layer split its outputs over towers: every device needs all logits
      x = self._gather(x, to="invarying")
    return x.astype(jnp.float32).T

  def _weighted(self, layer: Layer, x, split: bool, local: int):
    groups = 1
    if split and layer.inputs == "all":
      x = self._gather(x)
    elif split:
      groups = local
    if layer.kind == "fc" and x.ndim == 4:
      x = x.reshape(-1, x.shape[-1])  # CHWN → (C·H·W, N): the (C, H, W) order of Caffe and PyTorch
    c_in = x.shape[0] // groups
    out = layer.filters if layer.split == "sum" else layer.filters // self.towers
    if layer.kind == "conv":
      shape = (local, c_in, layer.size, layer.size, out)
    else:
      shape = (local, c_in, out)
    kernel, bias = TowerWeights(layer, shape, self.weight_init, name=layer.name)()
    if layer.split == "sum":
      if not split:
        raise ValueError(f"layer {layer.name}: split='sum' needs per-tower inputs, but its input is not split")
      # Partial logits are summed across towers in float32: bf16 would round each tower's share first.
      y = ops.dense(x.astype(jnp.float32), kernel.reshape(local * c_in, out), backend=self.backend)
      if self.tower_axis:
        y = lax.psum(y, self.tower_axis)
      y = y + bias.astype(y.dtype)[:, None]
      return (jax.nn.relu(y) if layer.relu else y), False
    # Towers side by side: filters of tower t become output block t (groups=local when each reads its own block).
    w = jnp.moveaxis(kernel, 0, -2).reshape(*shape[1:-1], local * out)
    if layer.kind == "conv":
      y = ops.conv2d(x, w, bias, stride=layer.stride, padding=layer.padding, groups=groups, relu=layer.relu,
                     backend=self.backend)
    else:
      if groups > 1:
        raise ValueError(f"layer {layer.name}: an fc layer reading its own tower needs split='sum'")
      y = ops.dense(x, w, bias, relu=layer.relu, backend=self.backend)
    return y, True

  def _dropout(self, x, rate: float, local: int):
    """One mask per tower, keyed by the global tower index, so split and local towers drop the same units."""
    key = self.make_rng("dropout")
    first = lax.axis_index(self.tower_axis) * local if self.tower_axis else 0
    blocks = x.reshape(local, -1, *x.shape[1:])
    keys = jax.vmap(lambda t: jax.random.fold_in(key, first + t))(jnp.arange(local))
    return jax.vmap(lambda b, k: ops.dropout(b, rate, k))(blocks, keys).reshape(x.shape)
