"""What a train step moves between devices, per layer: read from its compiled HLO, and summed from the placement
plan (network/placement.py), side by side (scripts/comm_report.py, scripts/benchmark.py); `records` compiles a
config's step for a strategy, dtype and batch and reports it.

Bytes are what hlo.Collective counts, per step: the whole gathered tensor, the whole tensor before a reduce-scatter,
the reduced operand of an all-reduce; a combined gradient all-reduce is split by the layers whose gradients it
carries. A collective of no layer is its own row, named by the step's scope it lies in: 'input' (crops gathered
where the host spread the rows: config.gather_input), 'labels' (moved to where the network's output lies), 'loss',
'metrics', else 'other'.
"""

import dataclasses
import functools

import jax
import numpy as np

from alexnet_jax.config import validate
from alexnet_jax.data.device_batches import random_batch
from alexnet_jax.measure import hlo, systems
from alexnet_jax.network.placement import Plan
from alexnet_jax.training import train

LAYOUTS = dict(tower="split", data="dp", hybrid="hybrid")  # each strategy's layout in systems.py

# Rows of the collectives outside the network, by a part of their op_name path: the train step's named scopes
# (training/train.py), and its batch's arrays where XLA moves them as they arrive (the path is the argument's).
OUTSIDE = dict(input="input", labels="labels", loss="loss", metrics="metrics") | {
    f"batch['{key}']": "labels" if key == "label" else "input" for key in ("image", "offset", "flip", "shift", "label")}


@dataclasses.dataclass(frozen=True)
class Traffic:
  layer: str  # a layer of the table, or a row of OUTSIDE, or 'other'
  kind: str  # hlo.COLLECTIVES
  participants: int  # devices in each group
  bytes: int  # per step, from the compiled HLO (0: the plan expects it, the program has none)
  analytic_bytes: int | None  # from the plan (None: not the network's)
  # the HLO's element type is not the compute dtype: on CPU devices XLA runs bfloat16 gathers and reduce-scatters
  # in float32 (and could not compile the latter in bf16: network/model.py), twice the plan's bytes
  float32_on_cpu: bool = False


def measured(plan: Plan, hlo_text: str) -> dict[tuple[str, str, int], int]:
  """{(layer, kind, participants): bytes} of every cross-device collective of a compiled step."""
  names, out = plan.table.names, {}
  for c in hlo.collectives(hlo_text):
    if c.group_size > 1:
      for layer, size in c.by_layer(names, OUTSIDE).items():
        out[layer, c.kind, c.group_size] = out.get((layer, c.kind, c.group_size), 0) + size
  return out


def report(plan: Plan, hlo_text: str, image_size: int, batch: int, dtype_bytes: int = 4,
           platform: str = "cpu") -> list[Traffic]:
  """Every collective of the compiled step beside the plan's, in layer order (then what lies outside the
  network)."""
  found = measured(plan, hlo_text)
  expected = plan.traffic(image_size, batch, dtype_bytes)
  names = plan.table.names
  order = {name: i for i, name in enumerate((*names, *dict.fromkeys(OUTSIDE.values()), "other"))}
  keys = sorted(set(found) | set(expected), key=lambda k: (order[k[0]], k[1], k[2]))
  rows = []
  for layer, kind, group in keys:
    analytic = expected.get((layer, kind, group)) if layer in names else None
    widened = (platform == "cpu" and dtype_bytes == 2 and kind in ("all-gather", "reduce-scatter")
               and analytic is not None)
    rows.append(Traffic(layer, kind, group, found.get((layer, kind, group), 0), analytic, widened))
  return rows


def compiled(config, strategy: str, dtype: str, batch: int, devices: int | None = None):
  """(setup, compiled HLO text) of the config's train step under `strategy`, `dtype` and `batch`."""
  c = config.copy_and_resolve_references()
  c.strategy, c.dtype, c.batch_size, c.eval_batch_size = strategy, dtype, batch, batch
  if devices:
    if strategy == "table":
      raise ValueError("--devices places the named strategies as the benchmark's layouts do; a table places itself")
    c.mesh.model, c.mesh.data = systems.mesh_shape(LAYOUTS[strategy], c.towers, devices)
  c = validate(c)
  classes = c.dataset.num_classes or 1000
  setup = train.make_setup(c, classes, c.dataset.num_train_examples or systems.IMAGENET_TRAIN)
  state = train.train_state_init(setup).eval_shape(jax.random.key(0))
  size = c.dataset.resize if c.dataset.name != "procedural" else c.image_size
  example = random_batch(1, c.image_size, classes, size=size)
  batch_shapes = {k: jax.ShapeDtypeStruct((batch, *v.shape[1:]), v.dtype,
                                          sharding=setup.batch_layout.sharding(v.ndim)) for k, v in example.items()}
  step = jax.jit(functools.partial(train.train_step, setup=setup))
  return setup, step.lower(state, batch_shapes, jax.random.key(0)).compile().as_text()


def records(config, strategy: str, dtype: str, batch: int, devices: int | None = None) -> list[dict]:
  """The report of compiled(…) as records, the first with the plan as a markdown table."""
  setup, text = compiled(config, strategy, dtype, batch, devices)
  found = report(setup.plan, text, setup.image_size, batch, np.dtype(dtype).itemsize, jax.default_backend())
  head = dict(strategy=strategy, batch=batch, mesh=dict(setup.mesh.shape), dtype=dtype)
  rows = [head | dataclasses.asdict(t) for t in found] or [head | dict(layer=None)]
  rows[0]["plan"] = setup.plan.describe()  # the group's first record carries the plan
  return rows
