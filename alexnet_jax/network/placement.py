"""The placement plan: which device holds each layer's activations and weights, and which collective moves them.

`plan(table, strategy, model, data)` is the one place where this is decided, from the layer table (each layer's
`place`, or a named strategy that places them all: table.with_strategy) and the shape of the (data, model) mesh.
`Network` executes it inside shard_map, the parameter shardings of ours and of the plain-XLA baseline are read from
it, and `traffic` sums what its collectives move, which the comm report sets beside the compiled program's.

Features of an activation lie in one of three states over 'model':
  whole    every tower's maps on every device of the axis
  towers   each device its own towers' blocks (the paper: a GPU per tower)
  slices   each device a slice of every tower's block ('model' fc layers: Krizhevsky 2014)
and the batch is split over 'data', and over 'model' too while layers are placed 'data'. Before a layer its input is
`read`: gathered whole over 'model' (an all-gather forward, its reduce-scatter backward), or the device's own part
cut out of whole maps (no traffic). After a split='sum' layer spread over devices, its partial outputs are summed
(an all-reduce). Each weight's gradient is summed over the devices that split its batch.
"""

import dataclasses
import math

from alexnet_jax.network.layers import kind_of
from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.network.table import STRATEGIES, Layer, Table, with_strategy

WHOLE, TOWERS, SLICES = "whole", "towers", "slices"
# Reads: every device's part gathered over 'model' (from towers, or from slices, which then reorders them tower by
# tower), or the device's own towers' blocks or own slice of every block cut out of whole maps.
GATHER, GATHER_SLICES, OWN_TOWERS, OWN_SLICES = "gather", "gather slices", "own towers", "own slices"
F32 = 4  # parameters, their gradients and the summed partial logits are float32 whatever the compute dtype


@dataclasses.dataclass(frozen=True)
class LayerPlan:
  layer: Layer
  gather_batch: bool  # the batch is gathered over 'model' before this layer: the 'data' layers end here
  split_batch: bool  # the batch is split over 'model' too in this layer (a 'data' layer on a model axis > 1)
  read: tuple[str, ...]  # what is done to the input features before the layer, in order
  input: str  # where the input features lie after the reads: WHOLE, TOWERS or SLICES
  blocks: int  # tower blocks of channels in the input a device computes on (groups of a conv, an LRN, dropout)
  towers: int  # towers whose weights the device holds (a 'model' layer: every tower's slice)
  weights: str  # where the weights lie: WHOLE (every device), TOWERS or SLICES; '' for a layer without weights
  output: str  # where the output features lie
  reduce: bool  # the partial outputs are summed over 'model' (a spread split='sum' layer)

  @property
  def split_weights(self) -> dict[str, bool]:
    """Which of the layer's parameters are split over 'model': the kernel wherever the weights lie on towers or
    slices; the bias too, except the one bias of a split='sum' layer, which every device holds whole."""
    split = self.weights in (TOWERS, SLICES)
    return dict(kernel=split, bias=split and self.layer.split == "out")


@dataclasses.dataclass(frozen=True)
class Plan:
  table: Table  # placed: every layer's `place` is the one planned
  model: int
  data: int
  layers: tuple[LayerPlan, ...]
  gather_output: bool  # the last layer's outputs are split over 'model': every device gathers the logits whole
  input_axes: tuple[str, ...]  # the mesh axes the batch is split over at the network's input
  output_axes: tuple[str, ...]  # … and at its output (the logits, the labels beside them)

  def __getitem__(self, name: str) -> LayerPlan:
    return next(p for p in self.layers if p.layer.name == name)

  def gradient_summed_over(self, name: str) -> int:
    """The devices that split layer `name`'s batch, over which its weights' gradients are summed (1: none)."""
    return self.data * self.model if self[name].layer.place == "data" else self.data

  def describe(self) -> str:
    """The plan as a markdown table, a row per layer."""
    rows = ["| layer (place) | batch | read | input | blocks | towers held | weights | output | then |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in self.layers:
      batch = "gather" if p.gather_batch else ("split over model" if p.split_batch else "")
      rows.append(f"| {p.layer.name} ({p.layer.place}) | {batch} | {', '.join(p.read)} | {p.input} | {p.blocks} | "
                  f"{p.towers if p.weights else ''} | {p.weights} | {p.output} | {'summed' if p.reduce else ''} |")
    if self.gather_output:
      rows.append(f"| logits | | {GATHER} | {WHOLE} | | | | | |")
    return "\n".join(rows)

  def traffic(self, image_size: int, batch: int, dtype_bytes: int = F32) -> dict[tuple[str, str, int], int]:
    """{(layer, kind, participants): bytes per step} of the plan's collectives for a global batch: the whole tensor
    of a data shard's rows that an activation's all-gather gathers and its gradient's reduce-scatter scatters (in
    the compute dtype), the partial outputs' all-reduce of a spread split='sum' layer, and each weight's gradient
    summed over the devices that split its batch (both float32)."""
    model, rows = self.model, batch // self.data
    shapes = layer_shapes(self.table, image_size, rows)
    out = {}

    def add(layer: str, kind: str, group: int, size: int):
      if group > 1:
        out[layer, kind, group] = out.get((layer, kind, group), 0) + size

    for p in self.layers:
      name = p.layer.name
      activation = math.prod(shapes.inputs[name]) * dtype_bytes
      for _ in range(p.gather_batch + (GATHER in p.read or GATHER_SLICES in p.read)):
        add(name, "all-gather", model, activation)
        add(name, "reduce-scatter", model, activation)
      if p.reduce:
        add(name, "all-reduce", model, p.layer.filters * rows * F32)
      if p.weights:
        gradient = sum(math.prod(shape) * F32 // (model if p.split_weights[leaf] else 1)
                       for leaf, shape in shapes.params[name].items())
        add(name, "all-reduce", self.gradient_summed_over(name), gradient)
    if self.gather_output:
      last = self.layers[-1].layer.name
      add(last, "all-gather", model, math.prod(shapes.outputs[last]) * dtype_bytes)
    return out


def plan(table: Table, strategy: str = "table", model: int = 1, data: int = 1) -> Plan:
  """The plan of `table` placed by `strategy` ('table': each layer's own `place`) on a data × model mesh."""
  if strategy != "table":
    table = with_strategy(table, strategy)
  elif strategy not in (*STRATEGIES, "table"):
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}, table")
  if model < 1 or data < 1:
    raise ValueError(f"a mesh needs data ≥ 1 and model ≥ 1, got data={data}, model={model}")
  if table.placed("tower") and table.towers % model:
    raise ValueError(f"{table.towers} towers cannot be spread evenly over a model axis of {model} devices")
  spread, towers = model > 1, table.towers
  own = towers // model  # towers a device holds of a 'tower' layer
  where, split_batch = WHOLE, spread and table.layers[0].place == "data"
  planned = []
  for layer, blocks in zip(table.layers, table.tower_blocks()):
    gather_batch = split_batch and layer.place != "data"
    split_batch = split_batch and not gather_batch
    here = spread and layer.place in ("tower", "model")  # the layer's work is divided over 'model'
    target = {"tower": TOWERS, "model": SLICES}.get(layer.place, WHOLE) if here else WHOLE
    read, weights, output, reduce = (), "", where, False
    kind = kind_of(layer)
    if kind.weighted and not kind.flat:  # a conv: its tower's maps or, inputs='all', every tower's
      if blocks and layer.inputs == "all":
        read, where, blocks = gather_reads(where), WHOLE, False
      elif blocks and target == TOWERS and where == WHOLE:  # after 'data' layers: this device's towers' maps
        read, where = (OWN_TOWERS,), TOWERS
      weights = output = target
    elif kind.flat and layer.split == "out":  # every tower reads every tower's features
      read, where, blocks = gather_reads(where), WHOLE, False
      weights = output = target
    elif kind.flat:  # split='sum': each tower's block by its own rows, the partial outputs summed
      if where not in (WHOLE, target):
        read, where = gather_reads(where), WHOLE
      if where == WHOLE and target != WHOLE:
        read, where = (*read, OWN_TOWERS if target == TOWERS else OWN_SLICES), target
      weights, output, reduce = target, WHOLE, here
    present = (own if where == TOWERS else towers) if blocks else 1
    held = own if spread and layer.place == "tower" else towers
    planned.append(LayerPlan(layer, gather_batch, split_batch, read, where, present, held, weights, output,
                             reduce))
    where = output
  axes = lambda layer: ("data", "model") if layer.place == "data" else ("data",)  # noqa: E731
  return Plan(table, model, data, tuple(planned), where != WHOLE, axes(table.layers[0]), axes(table.layers[-1]))


def gather_reads(where: str) -> tuple[str, ...]:
  """The reads that make features lying `where` whole on every device."""
  return {WHOLE: (), TOWERS: (GATHER,), SLICES: (GATHER_SLICES,)}[where]

