"""fc: a fully-connected layer reading every tower's features flattened in (C, H, W) order; split='sum' is
cuda-convnet's fc layer with one input per tower, each tower's block by its own rows, the partial outputs summed
(AlexNet's fc8)."""

import math

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax import ops
from alexnet_jax.network.layers.kind import Kind, register_kind


def check(layer):
  if layer.split == "sum" and layer.inputs != "tower":
    raise ValueError(f"layer {layer.name}: split='sum' is for fc layers that read their own tower")


def _flat(x):
  """CHWN → (C·H·W, N): the (C, H, W) order of Caffe and PyTorch; tower blocks stay contiguous."""
  return x.reshape(-1, x.shape[-1]) if x.ndim == 4 else x


def run(net, step, x, train):
  del train
  p, layer, x = step.plan, step.layer, _flat(x)
  if layer.split == "sum":
    return _run_sum(net, p, x)
  # A layer on slices computes this device's slice of every tower's outputs.
  out = layer.filters // net.table.towers // (net.slices() if p.weights == "slices" else 1)
  kernel, bias = net.weights(p, (p.towers, x.shape[0], out))
  # The towers as a batch of GEMMs, outputs stacked: their weights side by side as one matrix would be a transposed
  # copy of them every step (fc6 on one GPU: 75 MB of bf16 read and written, and again in the backward pass),
  # where the outputs are a few MB.
  return ops.dense(x, kernel, bias, relu=layer.relu, backend=net.backend)


def _run_sum(net, p, x):
  """Each tower multiplies its own block by its own rows (on slices: this device's slice of every tower's block
  by those rows); the partial outputs are summed across devices."""
  layer = p.layer
  c_in = x.shape[0] // p.towers  # sharding.sharded_apply checks the split
  kernel, bias = net.weights(p, (p.towers, c_in, layer.filters))
  # Partial logits are summed across towers in float32: bf16 would round each tower's share first.
  y = ops.dense(x, kernel.reshape(p.towers * c_in, layer.filters), out_dtype=jnp.float32, backend=net.backend)
  if p.reduce:
    y = lax.psum(y, net.tower_axis)
  y = y + bias.astype(y.dtype)[:, None]
  return jax.nn.relu(y) if layer.relu else y


def plain(net, p, x, train):
  del train
  layer, x = p.layer, x.reshape(x.shape[0], -1)
  if layer.split == "sum":  # own tower's features by own rows, summed over towers
    kernel, bias = net.weights(layer, (x.shape[-1], layer.filters))
    x = jnp.dot(x, kernel, preferred_element_type=jnp.float32)
    x = (lax.psum(x, net.tower_axis) if p.reduce else x) + bias
  else:
    kernel, bias = net.weights(layer, (x.shape[-1], layer.filters // net.table.towers * p.towers))
    x = jnp.dot(x, kernel) + bias
  return jax.nn.relu(x) if layer.relu else x


def torch(layer, nn, shape, towers):
  del towers
  modules = [nn.Flatten()] if len(shape) == 4 else []
  modules.append(nn.Linear(math.prod(shape[:-1]), layer.filters))
  return modules + [nn.ReLU(inplace=True)] if layer.relu else modules


FC = register_kind(Kind("fc", run, plain, torch, output_shape=lambda layer, shape: (layer.filters, shape[-1]),
                        check=check, fan=lambda layer, shape: (math.prod(shape[:-1]),), flat=True, maps=False,
                        flattens=True, sliced=True))
