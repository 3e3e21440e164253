"""The shapes of a layer table's activations and parameters, computed from the table: what the placement plan counts
bytes with, what the weight converters expect, and what the kernel checks and benchmarks run on.

Activations are batch-last and hold every tower: (C, H, W, N) in the conv stack, (F, N) from the first fc layer on.
Parameters are `Network`'s, every tower's: conv kernels (towers, C_in, KH, KW, F/towers), fc kernels
(towers, F_in, F/towers), biases (towers, F/towers); a split='sum' layer's kernel is (towers, F_in/towers, F) and its
one bias (F,). C_in is what each tower reads: every tower's maps where the layer reads all of them (or the image),
its own block where it reads its own tower.
"""

import dataclasses
import math

from alexnet_jax.network.table import WEIGHTED, Layer, Table
from triton_kernels.launch import out_size


def output_shape(layer: Layer, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The shape of `layer`'s output for an input of `shape` (every tower's)."""
  if layer.kind == "conv":
    _, h, w, n = shape
    if min(h, w) + 2 * layer.padding < layer.size:
      raise ValueError(f"layer {layer.name}'s {layer.size}×{layer.size} filters do not fit the {h}×{w} map that "
                       "reaches it")
    return (layer.filters, out_size(h, layer.size, layer.stride, layer.padding),
            out_size(w, layer.size, layer.stride, layer.padding), n)
  if layer.kind == "pool":
    c, h, w, n = shape
    if h < layer.size or w < layer.size:
      raise ValueError(f"layer {layer.name}'s {layer.size}×{layer.size} window does not fit the {h}×{w} map that "
                       "reaches it")
    return c, out_size(h, layer.size, layer.stride), out_size(w, layer.size, layer.stride), n
  if layer.kind == "fc":
    return layer.filters, shape[-1]
  return shape


@dataclasses.dataclass(frozen=True)
class Shapes:
  """inputs[layer]: the layer's input (every tower's, `batch` images); params[layer]: {'kernel', 'bias'} shapes."""

  inputs: dict[str, tuple[int, ...]]
  outputs: dict[str, tuple[int, ...]]
  params: dict[str, dict[str, tuple[int, ...]]]


def layer_shapes(table: Table, image_size: int | tuple[int, int] = 224, batch: int = 1) -> Shapes:
  h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
  shape, towers = (3, h, w, batch), table.towers
  inputs, outputs, params = {}, {}, {}
  for layer, blocks in zip(table.layers, table.tower_blocks()):
    inputs[layer.name] = shape
    if layer.kind in WEIGHTED:
      features = math.prod(shape[:-1])  # the fc layers read the maps flattened
      reads_own = blocks and layer.inputs == "tower"
      if layer.split == "sum":
        params[layer.name] = dict(kernel=(towers, features // towers, layer.filters), bias=(layer.filters,))
      else:
        c_in = shape[0] // towers if reads_own else shape[0]
        fan = (c_in, layer.size, layer.size) if layer.kind == "conv" else (features,)
        params[layer.name] = dict(kernel=(towers, *fan, layer.filters // towers),
                                  bias=(towers, layer.filters // towers))
    shape = outputs[layer.name] = output_shape(layer, shape)
  return Shapes(inputs, outputs, params)
