"""The network of a layer table as a flax module, executing its placement plan (placement.py) on one device's share.

Every weight carries a leading tower axis: conv kernels are (towers, C_in, KH, KW, F/towers), fc kernels
(towers, F_in, F_out/towers), biases (towers, F/towers) (shapes.py). Under `jax.shard_map` that axis is split over
the mesh axis `tower_axis`, so each device holds and computes its own towers; with `tower_axis=None` one device
holds them all and runs them as grouped convolutions. Both run the same code on the same parameters, and give the
same numbers. Under 'model' placement an fc kernel keeps its global shape and is split on its output axis
(split='sum': its input rows), so parameters are the same arrays whatever the strategy.

Activations are batch-last: CHWN in the conv stack, (features, N) after it; a tower-split activation holds the
local towers' channels one block after another. The plan says, layer by layer, what is read across devices and
what is summed; nothing else moves.
"""

import contextlib
import contextvars
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.network import layers, placement
from alexnet_jax.network.placement import GATHER, GATHER_SLICES, OWN_SLICES, OWN_TOWERS, LayerPlan
from alexnet_jax.network.table import Layer, Table, initial_weights


def _fans(shape, split: str) -> tuple[int, int]:
  if len(shape) == 5:  # conv (towers, C_in, KH, KW, F)
    return shape[1] * shape[2] * shape[3], shape[2] * shape[3] * shape[4]
  return (shape[0] * shape[1] if split == "sum" else shape[1]), shape[-1]


class TowerWeights(nn.Module):
  """Kernel and bias of one layer; the bias of a split='sum' layer has no tower axis."""

  layer: Layer
  kernel_shape: tuple[int, ...]
  weight_init: str

  @nn.compact
  def __call__(self):
    split = self.layer.split
    std, bias_init = initial_weights(self.layer, *_fans(self.kernel_shape, split), self.weight_init)
    kernel = self.param("kernel", lambda key, s: std * jax.random.normal(key, s, jnp.float32), self.kernel_shape)
    bias_shape = (self.kernel_shape[-1],) if split == "sum" else (self.kernel_shape[0], self.kernel_shape[-1])
    bias = self.param("bias", lambda _, s: jnp.full(s, bias_init, jnp.float32), bias_shape)
    return kernel, bias.reshape(-1)


class Network(nn.Module):
  """Applies a layer table to CHWN images (3, H, W, N) and returns logits (N, classes) in float32.

  With `tower_axis` naming a manual mesh axis, each layer runs where the table's placement puts it on that axis
  (`plan`, made for the axis's size); without one, every tower runs here. Each layer runs as its kind says
  (network/layers), in the ops that layers.steps makes of the plan; the kinds use the services below: a layer's
  weights, the devices of the tower axis, this device's rows of the batch.
  """

  table: Table
  # mesh axis of the towers, fc slices and the second batch split of 'data' layers; None: every tower on this device
  tower_axis: str | None = None
  batch_axis: str | None = None  # mesh (or pmap) axis the batch is split over in every layer; None: not split
  dtype: Any = jnp.float32  # compute dtype; parameters stay float32
  # table.initial_weights: 'paper' N(0, 0.01) and the table's biases; 'he' He's scale, which trains small nets faster;
  # 'glorot' Glorot's, which keeps deep nets without normalisation (VGG) from diverging at the paper's rate
  weight_init: str = "paper"
  backend: str = "auto"  # the ops' backend (ops.BACKENDS); sharding.sharded_apply resolves 'auto' network-wide
  # The table's placement plan on the mesh it runs on (a setup's, made once: train.make_setup); None: made here for
  # the tower axis's size alone
  plan: placement.Plan | None = None

  @nn.compact
  def __call__(self, x, *, train: bool = False):
    plan = self.plan or placement.plan(self.table, model=self.slices())
    if plan.model != self.slices():
      raise ValueError(f"the network's plan is for a model axis of {plan.model} devices, but it runs on "
                       f"{self.slices()}")
    activations = {}
    x = x.astype(self.dtype)
    for step in layers.steps(plan.layers):
      p = step.plan
      with jax.named_scope(p.layer.name):
        if p.gather_batch:  # 'data' layers end: every device needs its data shard's batch
          x = self._gather(x, axis=x.ndim - 1)
        x = self._read(x, p.read)
        kind = layers.kind_of(p.layer)
        if len(step.plans) == 1:
          outputs = (kind.run(self, step, x, train),)
        else:
          outputs = kind.fuses[step.plans[1].layer.kind](self, step, x)
      x = outputs[-1]
      for q, out in zip(step.plans, outputs):  # what the layer table says each layer outputs
        activations[q.layer.name] = jax.nn.relu(out) if step.relu_out else out
    self.sow("intermediates", "activations", activations)  # kept when applied with mutable=["intermediates"]
    # The last layer split its outputs: every device needs all logits.
    x = self._read(x, placement.gather_reads(plan.layers[-1].output), to="invarying")
    return x.astype(jnp.float32).T

  def slices(self) -> int:
    """Devices on the tower axis (1 without one)."""
    return lax.axis_size(self.tower_axis) if self.tower_axis else 1

  def device_index(self):
    """This device's index on the tower axis."""
    return lax.axis_index(self.tower_axis)

  def weights(self, p: LayerPlan, kernel_shape: tuple[int, ...]):
    """The layer's kernel and bias, varying over the mesh axes that split its batch: their gradients are then summed
    over those devices as they are, in float32, not in the compute dtype they are converted to for reading."""
    weights = TowerWeights(p.layer, kernel_shape, self.weight_init, name=p.layer.name)()
    axes = (self.batch_axis,) + ((self.tower_axis,) if p.split_batch else ())
    axes = tuple(a for a in axes if a)
    return tuple(lax.pcast(w, axes, to="varying") for w in weights) if axes else weights

  def rows(self, n: int, split_batch: bool):
    """(first row, rows) of the global batch: where this device's n examples lie in it."""
    index, count = 0, 1
    for axis in (self.batch_axis, self.tower_axis if split_batch else None):
      if axis:
        index, count = index * lax.axis_size(axis) + lax.axis_index(axis), count * lax.axis_size(axis)
    return index * n, count * n

  def _gather(self, x, axis=0, to="varying"):
    """Every device's part of x along `axis` over the tower axis, in device order."""
    if x.dtype == jnp.bfloat16 and to == "varying":
      return _gather_bf16(x, self.tower_axis, axis)
    return lax.all_gather(x, self.tower_axis, axis=axis, tiled=True, to=to)

  def _read(self, x, read: tuple[str, ...], to="varying"):
    """x as the plan's reads leave it: gathered whole over the tower axis, or this device's part cut out."""
    for step in read:
      if step in (GATHER, GATHER_SLICES):
        x = self._gather(x, to=to)
        if step == GATHER_SLICES:  # device-major slices of each tower → tower-major
          t, k = self.table.towers, self.slices()
          x = jnp.swapaxes(x.reshape(k, t, -1, *x.shape[1:]), 0, 1).reshape(x.shape)
      elif step in (OWN_TOWERS, OWN_SLICES):
        x = self._own(x if step == OWN_TOWERS else _flat(x), per_tower=step == OWN_SLICES)
    return x

  def _own(self, x, per_tower: bool):
    """This device's part of local tower-blocked x: its towers' blocks (per_tower False) or its slice of each
    tower's block (True). No traffic."""
    t, k, i = self.table.towers, self.slices(), self.device_index()
    blocks = x.reshape(t, -1, *x.shape[1:])
    if per_tower:
      part = blocks.shape[1] // k
      return lax.dynamic_slice_in_dim(blocks, i * part, part, axis=1).reshape(-1, *x.shape[1:])
    return lax.dynamic_slice_in_dim(blocks, i * (t // k), t // k, axis=0).reshape(-1, *x.shape[1:])


_FLOAT32_SCATTERS = contextvars.ContextVar("float32_scatters", default=False)


@contextlib.contextmanager
def float32_scatters():
  """Within: every bfloat16 gather traced here has its gradient reduce-scattered in float32 on every platform. For a
  program lowered for the CPU and others at once: XLA:CPU compiles every platform's branch, and aborts on another's
  bf16 reduce-scatter."""
  token = _FLOAT32_SCATTERS.set(True)
  try:
    yield
  finally:
    _FLOAT32_SCATTERS.reset(token)


def _gather_bf16(x, axis_name: str, axis: int):
  """A bfloat16 all-gather whose gradient, the reduce-scatter, runs in float32 on CPU, where XLA:CPU aborts on a bf16
  one, and in bfloat16 elsewhere unless float32_scatters is entered where the gather is traced (network/gathers.py:
  a linear primitive, which forward mode goes through as reverse mode does)."""
  from alexnet_jax.network import gathers  # noqa: PLC0415

  return gathers.all_gather(x, axis_name, axis, wide=_FLOAT32_SCATTERS.get())


def _flat(x):
  """CHWN → (C·H·W, N): the (C, H, W) order of Caffe and PyTorch; tower blocks stay contiguous."""
  return x.reshape(-1, x.shape[-1]) if x.ndim == 4 else x

