"""The shapes the kernels run on in a network: each conv layer as one tower computes it or as one device computes
every tower side by side, and each pool's and LRN's input; what the kernel checks, the tuner and the kernel
benchmarks run on (AlexNet's by default)."""

import dataclasses

from alexnet_jax.network.layers import kind_of
from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.network.table import Layer, Table, alexnet
from triton_kernels.launch import out_size


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
    oh, ow = out_size(h, kh, self.stride, self.padding), out_size(w, kw, self.stride, self.padding)
    return 2 * f * oh * ow * n * cg * kh * kw


def _is_conv(layer: Layer) -> bool:
  return layer.weighted and not kind_of(layer).flat


def tower_convs(table: Table, image_size: int = 224, batch: int = 128) -> list[ConvShape]:
  """One tower's share of each conv layer of a table (a layer reading every tower, as AlexNet's conv3, reads all of
  their maps)."""
  shapes = layer_shapes(table, image_size, batch)
  convs = []
  for layer in table.layers:
    if _is_conv(layer):
      w = shapes.params[layer.name]["kernel"][1:]  # the tower's kernel: its input channels are what it reads
      convs.append(ConvShape(layer.name, (w[0], *shapes.inputs[layer.name][1:]), w, layer.stride, layer.padding))
  return convs


def grouped_convs(table: Table, image_size: int = 224, batch: int = 128) -> list[ConvShape]:
  """Each conv layer with every tower on one device, as grouped convolution: a tower that reads only its own maps is
  a group; a layer reading every tower's maps (or the image) is one convolution with all towers' filters."""
  shapes = layer_shapes(table, image_size, batch)
  convs = []
  for layer in table.layers:
    if _is_conv(layer):
      towers, cin, kh, kw, f = shapes.params[layer.name]["kernel"]
      x = shapes.inputs[layer.name]
      convs.append(ConvShape(layer.name, x, (cin, kh, kw, towers * f), layer.stride, layer.padding, x[0] // cin))
  return convs


def tower_maps(table: Table, image_size: int = 224, batch: int = 128) -> dict[str, tuple[Layer, tuple]]:
  """One tower's inputs of a table's layers that run kernels on maps (pools, LRNs: a kind with an `op`), with
  their layers."""
  inputs = layer_shapes(table, image_size, batch).inputs
  maps = {}
  for layer, blocks in zip(table.layers, table.tower_blocks()):
    if kind_of(layer).op:
      c, *rest = inputs[layer.name]
      maps[layer.name] = (layer, (c // table.towers if blocks else c, *rest))
  return maps


def grouped_maps(table: Table, image_size: int = 224, batch: int = 128) -> dict[str, tuple[Layer, tuple, int]]:
  """Each map layer's input (as tower_maps) with every tower on one device, with its layer and groups: an LRN
  normalises each tower's channels apart (towers groups); a layer after one that reads every tower sees one group."""
  inputs = layer_shapes(table, image_size, batch).inputs
  return {layer.name: (layer, inputs[layer.name], table.towers if blocks else 1)
          for layer, blocks in zip(table.layers, table.tower_blocks()) if kind_of(layer).op}


def pool_after(table: Table) -> dict[str, Layer]:
  """The max-pool right after a layer, by the layer's name: what an LRN runs with as one op (ops.lrn_max_pool)."""
  return {a.name: b for a, b in zip(table.layers, table.layers[1:]) if b.kind == "pool"}


def first_conv(table: Table) -> str:
  """The name of the conv layer that reads the images: its data gradient is never computed."""
  return next(layer.name for layer in table.layers if layer.kind == "conv")


def alexnet_convs(batch: int = 128) -> list[ConvShape]:
  """One tower's share of each conv layer (conv3 reads both towers' 256 maps)."""
  return tower_convs(alexnet(), 224, batch)


def alexnet_maps(batch: int = 128) -> dict[str, tuple[int, int, int, int]]:
  """One tower's inputs of the pools and LRNs."""
  return {name: shape for name, (_, shape) in tower_maps(alexnet(), 224, batch).items()}
