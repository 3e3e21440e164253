"""What a train step moves between devices, per layer: read from its compiled HLO, and derived from the layer table
and the mesh, side by side (scripts/comm_report.py, scripts/benchmark.py).

Bytes are what hlo.Collective counts, per step: the whole gathered tensor, the whole tensor before a reduce-scatter,
the reduced operand of an all-reduce; a combined gradient all-reduce is split by the layers whose gradients it
carries. Collectives of no layer are listed under 'input+loss': the crops gathered for a first layer whose towers
read the whole batch, the metrics, the logits' gradient moved to where the loss reads it.
"""

import dataclasses
import math

from alexnet_jax import hlo
from alexnet_jax.layer_shapes import traced_shapes
from alexnet_jax.networks import WEIGHTED, Table

F32 = 4  # parameters, their gradients and the summed partial logits are float32 whatever the compute dtype


@dataclasses.dataclass(frozen=True)
class Traffic:
  layer: str
  kind: str  # hlo.COLLECTIVES
  participants: int  # devices in each group
  bytes: int  # per step, from the compiled HLO (0: the table expects it, the program has none)
  analytic_bytes: int | None  # from the table (None: not the network's: 'input+loss')


def measured(table: Table, hlo_text: str) -> dict[tuple[str, str, int], int]:
  """{(layer, kind, participants): bytes} of every cross-device collective of a compiled step."""
  names, out = [layer.name for layer in table.layers], {}
  for c in hlo.collectives(hlo_text):
    if c.group_size > 1:
      for layer, size in c.by_layer(names).items():
        out[layer, c.kind, c.group_size] = out.get((layer, c.kind, c.group_size), 0) + size
  return out


def analytic(table: Table, image_size: int, batch: int, data: int, model: int,
             dtype_bytes: int = F32) -> dict[tuple[str, str, int], int]:
  """{(layer, kind, participants): bytes} that the table's placement implies for a global batch on a data × model
  mesh: where an activation moves to the next layer's place, its all-gather forward and reduce-scatter backward (of
  the whole tensor of a data shard's rows), the all-reduce of split='sum' partial outputs, and each weight's gradient
  summed over the devices that split its batch."""
  params, inputs = traced_shapes(table, image_size, batch // data)
  out = {}

  def add(layer, kind, group, size):
    if group > 1:
      out[layer, kind, group] = out.get((layer, kind, group), 0) + size

  def moved(layer):
    size = math.prod(inputs[layer.name]) * dtype_bytes
    add(layer.name, "all-gather", model, size)
    add(layer.name, "reduce-scatter", model, size)

  where, split_batch = "local", model > 1 and table.layers[0].place == "data"
  for layer, blocks in zip(table.layers, table.tower_blocks()):
    if split_batch and layer.place != "data":
      moved(layer)
      split_batch = False
    if model > 1 and layer.kind == "conv":
      if blocks and layer.inputs == "all" and where != "local":
        moved(layer)
      where = "towers" if layer.place == "tower" else "local"
    elif model > 1 and layer.kind == "fc" and layer.split == "out":
      if where != "local":
        moved(layer)
      where = {"tower": "towers", "model": "slices"}.get(layer.place, "local")
    elif model > 1 and layer.kind == "fc":
      if (layer.place, where) in (("tower", "slices"), ("model", "towers")):
        moved(layer)
      if layer.place != "data":
        add(layer.name, "all-reduce", model, layer.filters * (batch // data) * F32)
      where = "local"
    if layer.kind in WEIGHTED:
      shares = {leaf: 1 if layer.place == "data" or (layer.split == "sum" and leaf == "bias") else model
                for leaf in params[layer.name]}
      gradient = sum(math.prod(shape) * F32 // shares[leaf] for leaf, shape in params[layer.name].items())
      add(layer.name, "all-reduce", data * model if layer.place == "data" else data, gradient)
  if where != "local":  # the last layer's split outputs gathered whole
    add(table.layers[-1].name, "all-gather", model, table.layers[-1].filters * (batch // data) * dtype_bytes)
  return out


def report(table: Table, hlo_text: str, image_size: int, batch: int, data: int, model: int,
           dtype_bytes: int = F32) -> list[Traffic]:
  """Every collective of the compiled step beside the table's expectation, in layer order (then 'input+loss')."""
  found = measured(table, hlo_text)
  expected = analytic(table, image_size, batch, data, model, dtype_bytes)
  order = {layer.name: i for i, layer in enumerate(table.layers)}
  keys = sorted(set(found) | set(expected), key=lambda k: (order.get(k[0], len(order)), k[1], k[2]))
  return [Traffic(layer, kind, group, found.get((layer, kind, group), 0),
                  expected.get((layer, kind, group)) if layer in order else None) for layer, kind, group in keys]
