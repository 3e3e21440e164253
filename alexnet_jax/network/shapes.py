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

from alexnet_jax.network.layers import kind_of
from alexnet_jax.network.table import Table


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
    if layer.weighted:
      if layer.split == "sum":
        features = math.prod(shape[:-1])
        params[layer.name] = dict(kernel=(towers, features // towers, layer.filters), bias=(layer.filters,))
      else:
        reads_own = blocks and layer.inputs == "tower"
        read = (shape[0] // towers, *shape[1:]) if reads_own else shape
        params[layer.name] = dict(kernel=(towers, *kind_of(layer).fan(layer, read), layer.filters // towers),
                                  bias=(towers, layer.filters // towers))
    shape = outputs[layer.name] = kind_of(layer).output_shape(layer, shape)
  return Shapes(inputs, outputs, params)
