"""The network of a layer table (networks.py) as a flax module, with its towers local or spread over a mesh axis.

Every weight carries a leading tower axis: conv kernels are (towers, C_in, KH, KW, F/towers), fc kernels
(towers, F_in, F_out/towers), biases (towers, F/towers). Under `jax.shard_map` that axis is split over the mesh axis
`tower_axis`, so each device holds and computes its own towers; with `tower_axis=None` one device holds them all and
runs them as grouped convolutions. Both run the same code on the same parameters, and give the same numbers.

Activations are batch-last: CHWN in the conv stack, (features, N) after it; a tower-split activation holds the
local towers' channels one block after another. Cross-device traffic happens only where a layer has
`inputs='all'` (all-gather of every tower's maps) or `split='sum'` (all-reduce of partial outputs).
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax import ops
from alexnet_jax.networks import Layer, Table

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

  table: Table
  tower_axis: str | None = None  # mesh axis the towers are spread over; None: all towers on this device
  dtype: Any = jnp.float32  # compute dtype; parameters stay float32
  # 'paper': N(0, 0.01) and the table's biases; 'he': N(0, 2/fan_in) and zero biases, which trains small nets faster
  weight_init: str = "paper"
  backend: str = "auto"

  def _local_towers(self) -> int:
    return self.table.towers // lax.axis_size(self.tower_axis) if self.tower_axis else self.table.towers

  def _gather(self, x, to="varying"):
    """Every tower's maps, tower by tower: the all-gather that makes a layer read across devices."""
    if not self.tower_axis:
      return x
    if x.dtype == jnp.bfloat16 and to == "varying":
      return _gather_bf16(x, self.tower_axis)
    return lax.all_gather(x, self.tower_axis, axis=0, tiled=True, to=to)

  @nn.compact
  def __call__(self, x, *, train: bool = False):
    local = self._local_towers()
    activations = {}
    x = x.astype(self.dtype)
    in_blocks = self.table.tower_blocks()  # does x hold one block of maps per tower, layer by layer?
    for layer, blocks in zip(self.table.layers, in_blocks):
      groups = local if blocks else 1  # an op on tower blocks treats each block on its own
      with jax.named_scope(layer.name):
        if layer.kind == "conv":
          x = self._conv(layer, x, blocks, local)
        elif layer.kind == "fc" and layer.split == "sum":
          x = self._fc_sum(layer, x, local)
        elif layer.kind == "fc":
          x = self._fc(layer, x, blocks, local)
        elif layer.kind == "lrn":
          x = ops.lrn(x, k=layer.k, n=layer.size, alpha=layer.alpha, beta=layer.beta,
                      alpha_over_n=layer.alpha_over_n, groups=groups, backend=self.backend)
        elif layer.kind == "pool":
          x = ops.max_pool(x, size=layer.size, stride=layer.stride, backend=self.backend)
        elif layer.kind == "dropout" and train:
          x = self._dropout(x, layer.rate, groups)
      activations[layer.name] = x
    self.sow("intermediates", "activations", activations)  # kept when applied with mutable=["intermediates"]
    if in_blocks[-1]:  # the last layer split its outputs over towers: every device needs all logits
      x = self._gather(x, to="invarying")
    return x.astype(jnp.float32).T

  def _weights(self, layer: Layer, kernel_shape: tuple[int, ...]):
    return TowerWeights(layer, kernel_shape, self.weight_init, name=layer.name)()

  def _conv(self, layer: Layer, x, blocks: bool, local: int):
    """Towers side by side: filters of tower t become output block t, as grouped convolution where each tower reads
    its own block."""
    if blocks and layer.inputs == "all":
      x, blocks = self._gather(x), False
    groups = local if blocks else 1
    out = layer.filters // self.table.towers
    kernel, bias = self._weights(layer, (local, x.shape[0] // groups, layer.size, layer.size, out))
    return ops.conv2d(x, _side_by_side(kernel), bias, stride=layer.stride, padding=layer.padding, groups=groups,
                      relu=layer.relu, backend=self.backend)

  def _fc(self, layer: Layer, x, blocks: bool, local: int):
    """Every tower reads the same inputs (the table refuses an fc with split='out' on its own tower's block)."""
    if blocks:
      x = self._gather(x)
    x = _flat(x)
    kernel, bias = self._weights(layer, (local, x.shape[0], layer.filters // self.table.towers))
    return ops.dense(x, _side_by_side(kernel), bias, relu=layer.relu, backend=self.backend)

  def _fc_sum(self, layer: Layer, x, local: int):
    """Each tower multiplies its own block by its own rows; the partial outputs are summed across towers."""
    x = _flat(x)
    c_in = x.shape[0] // local
    kernel, bias = self._weights(layer, (local, c_in, layer.filters))
    # Partial logits are summed across towers in float32: bf16 would round each tower's share first.
    y = ops.dense(x.astype(jnp.float32), kernel.reshape(local * c_in, layer.filters), backend=self.backend)
    if self.tower_axis:
      y = lax.psum(y, self.tower_axis)
    y = y + bias.astype(y.dtype)[:, None]
    return jax.nn.relu(y) if layer.relu else y

  def _dropout(self, x, rate: float, local: int):
    """One mask per tower, keyed by the global tower index, so split and local towers drop the same units."""
    key = self.make_rng("dropout")
    first = lax.axis_index(self.tower_axis) * local if self.tower_axis else 0
    blocks = x.reshape(local, -1, *x.shape[1:])
    keys = jax.vmap(lambda t: jax.random.fold_in(key, first + t))(jnp.arange(local))
    return jax.vmap(lambda b, k: ops.dropout(b, rate, k))(blocks, keys).reshape(x.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _gather_bf16(x, axis: str):
  """A bfloat16 all-gather whose gradient, the reduce-scatter, runs in float32 on CPU: XLA:CPU (jaxlib 0.11.2)
  aborts compiling a bf16 reduce-scatter. Chosen per lowering platform, so that a program exported for GPU or TPU
  from a CPU host keeps bf16. (Around the whole gather, platform_dependent leaves a conditional in the compiled
  backward pass: its transposed branch index is a forward residual, which XLA does not fold away.)"""
  return lax.all_gather(x, axis, axis=0, tiled=True, to="varying")


def _gather_bf16_fwd(x, axis):
  return _gather_bf16(x, axis), None


def _gather_bf16_bwd(axis, _, cotangent):
  scatter = lambda c: lax.psum_scatter(c, axis, scatter_dimension=0, tiled=True)  # noqa: E731
  return (lax.platform_dependent(cotangent, cpu=lambda c: scatter(c.astype(jnp.float32)).astype(c.dtype),
                                 default=scatter),)


_gather_bf16.defvjp(_gather_bf16_fwd, _gather_bf16_bwd)


def _flat(x):
  """CHWN → (C·H·W, N): the (C, H, W) order of Caffe and PyTorch; tower blocks stay contiguous."""
  return x.reshape(-1, x.shape[-1]) if x.ndim == 4 else x


def _side_by_side(kernel):
  """(towers, …, F) → (…, towers·F): the towers' filters as one weight whose output block t is tower t's."""
  return jnp.moveaxis(kernel, 0, -2).reshape(*kernel.shape[1:-1], kernel.shape[0] * kernel.shape[-1])
