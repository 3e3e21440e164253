"""The per-tower shapes of a table's layers at a batch size, traced from the model: what the kernel checks and
benchmarks run on (AlexNet's), and what tests compare with the paper."""

import dataclasses

import jax
import jax.numpy as jnp

from alexnet_jax.model import Network
from alexnet_jax.networks import Layer, Table, alexnet


@dataclasses.dataclass(frozen=True)
class ConvShape:
  name: str
  x: tuple[int, int, int, int]  # (C, H, W, N)
  w: tuple[int, int, int, int]  # (C/G, KH, KW, F)
  stride: int
  padding: int
  groups: int = 1  # towers side by side on one device: each reads its own block of x

  @property
  def flops(self) -> int:
    """Multiply-adds × 2 of the forward pass (the data and filter gradients cost the same)."""
    c, h, w, n = self.x
    cg, kh, kw, f = self.w
    oh, ow = (h + 2 * self.padding - kh) // self.stride + 1, (w + 2 * self.padding - kw) // self.stride + 1
    return 2 * f * oh * ow * n * cg * kh * kw


def traced_shapes(table: Table, image_size: int | tuple[int, int] = 224, batch: int = 1):
  """(parameter shapes {layer: {'kernel', 'bias'}}, input shapes {layer: (C, H, W, N) or (F, N)} of all towers)."""
  h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
  image = jax.ShapeDtypeStruct((3, h, w, batch), jnp.float32)
  variables = jax.eval_shape(lambda x: Network(table).init(jax.random.key(0), x, mutable=True), image)
  outputs = {name: a.shape for name, a in variables["intermediates"]["activations"][0].items()}
  inputs, previous = {}, image.shape
  for layer in table.layers:
    inputs[layer.name], previous = tuple(previous), outputs[layer.name]
  params = {name: {leaf: tuple(a.shape) for leaf, a in p.items()} for name, p in variables["params"].items()}
  return params, inputs


def tower_convs(table: Table, image_size: int = 224, batch: int = 128) -> list[ConvShape]:
  """One tower's share of each conv layer of a table (a layer reading every tower, as AlexNet's conv3, reads all of
  their maps)."""
  params, inputs = traced_shapes(table, image_size, batch)
  convs = []
  for layer in table.layers:
    if layer.kind == "conv":
      w = params[layer.name]["kernel"][1:]  # the tower's kernel: its input channels are what it reads
      convs.append(ConvShape(layer.name, (w[0], *inputs[layer.name][1:]), w, layer.stride, layer.padding))
  return convs


def grouped_convs(table: Table, image_size: int = 224, batch: int = 128) -> list[ConvShape]:
  """Each conv layer with every tower on one device, as grouped convolution: a tower that reads only its own maps is
  a group; a layer reading every tower's maps (or the image) is one convolution with all towers' filters."""
  params, inputs = traced_shapes(table, image_size, batch)
  convs = []
  for layer in table.layers:
    if layer.kind == "conv":
      towers, cin, kh, kw, f = params[layer.name]["kernel"]
      x = inputs[layer.name]
      convs.append(ConvShape(layer.name, x, (cin, kh, kw, towers * f), layer.stride, layer.padding, x[0] // cin))
  return convs


def tower_maps(table: Table, image_size: int = 224, batch: int = 128) -> dict[str, tuple[Layer, tuple]]:
  """One tower's inputs of a table's pools and LRNs, with their layers."""
  _, inputs = traced_shapes(table, image_size, batch)
  maps = {}
  for layer, blocks in zip(table.layers, table.tower_blocks()):
    if layer.kind in ("lrn", "pool"):
      c, *rest = inputs[layer.name]
      maps[layer.name] = (layer, (c // table.towers if blocks else c, *rest))
  return maps


def alexnet_convs(batch: int = 128) -> list[ConvShape]:
  """One tower's share of each conv layer (conv3 reads both towers' 256 maps)."""
  return tower_convs(alexnet(), 224, batch)


def alexnet_maps(batch: int = 128) -> dict[str, tuple[int, int, int, int]]:
  """One tower's inputs of the pools and LRNs."""
  return {name: shape for name, (_, shape) in tower_maps(alexnet(), 224, batch).items()}
