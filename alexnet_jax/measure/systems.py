"""The train steps that scripts/benchmark.py times and scripts/dev/profile_step.py traces, one per system.

A system is `IMPL:LAYOUT`. IMPL is one of our kernel backends (`triton`, `xla`, `auto`, `interpret`: the config's
network as train.py runs it), `plain` (baseline.py's plain-XLA NHWC network, same table, loss, input and update),
`torch` or `torch_flat` (torch_step.py: the same in PyTorch, one tower in the latter; `one` only). LAYOUT places
it on N devices (the first N; all by default), whatever the config's mesh says:

  split   the paper's towers, one per device, and data parallelism over the pairs (strategy tower, mesh
          model=towers, data=N/towers: on 2 devices the paper; on one, both towers there)
  dp      data parallelism: every tower on every device, the batch split over all devices (model=1, data=N)
  hybrid  Krizhevsky 2014: convolutions data-parallel over every device, fc layers split over them (strategy
          hybrid, model=N, data=1; ours only)
  pmap    dp written with jax.pmap and lax.pmean (training/pmap.py; ours only)
  one     every tower on one device (model=1, data=1)
Steps run on random stored-size images, as training sends them."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from alexnet_jax import ops
from alexnet_jax.config import validate
from alexnet_jax.data.device_batches import random_batch
from alexnet_jax.measure import baseline
from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.network.table import Table
from alexnet_jax.training import pmap, train

TORCH = ("torch", "torch_flat")  # measure/torch_step.py's PyTorch steps
IMPLS = ("plain", *TORCH, *ops.BACKENDS)
LAYOUTS = ("split", "dp", "hybrid", "pmap", "one")
IMAGENET_TRAIN = 1_281_167  # synthetic batches stand in for ImageNet unless the config names its sizes


@dataclasses.dataclass(frozen=True)
class System:
  impl: str
  layout: str

  @classmethod
  def parse(cls, text: str) -> "System":
    impl, _, layout = text.partition(":")
    if impl not in IMPLS or layout not in LAYOUTS:
      raise ValueError(f"unknown system {text!r}: write IMPL:LAYOUT with IMPL one of {', '.join(IMPLS)} and LAYOUT "
                       f"one of {', '.join(LAYOUTS)}, e.g. triton:split")
    if impl in TORCH and layout != "one":
      raise ValueError(f"system {text}: the PyTorch step (measure/torch_step.py) runs on one GPU: {impl}:one")
    return cls(impl, layout)

  def __str__(self) -> str:
    return f"{self.impl}:{self.layout}"


STRATEGIES = dict(split="tower", dp="data", hybrid="hybrid", pmap="data", one="data")  # each layout's strategy


def mesh_shape(layout: str, towers: int, devices: int) -> tuple[int, int]:
  """(model, data): the mesh a layout spreads over `devices` devices (the module's docstring)."""
  if layout == "split":
    model = min(towers, devices)
    if devices % model:
      raise ValueError(f"layout split spreads {towers} towers over a multiple of {model} devices, not {devices}")
    return model, devices // model
  return {"dp": (1, devices), "hybrid": (devices, 1), "pmap": (1, devices), "one": (1, 1)}[layout]


def configured(system: System, config, devices: int):
  """A validated copy of `config` for the system on `devices` devices: its backend, strategy and mesh."""
  c = config.copy_and_resolve_references()
  if system.impl != "plain":
    c.kernel_backend = system.impl
  elif system.layout in ("hybrid", "pmap"):
    raise ValueError(f"system {system}: the plain network has no {system.layout} layout; time ours with it")
  c.strategy = STRATEGIES[system.layout]
  c.mesh.model, c.mesh.data = mesh_shape(system.layout, c.towers, devices)
  return validate(c)


@dataclasses.dataclass(frozen=True)
class Step:
  """A compiled train step and what it runs on: call `compiled(state, batch, key)` → (state, metrics)."""

  setup: train.Setup
  compiled: jax.stages.Compiled
  state: train.TrainState
  batch: dict
  key: jax.Array


def build(system: System, config, devices: int | None = None) -> Step:
  """The system's train step for `config` on the first `devices` devices (default: all), compiled, with its initial
  state and a random batch on the mesh."""
  available = jax.device_count()
  if (devices or available) > available:
    raise ValueError(f"system {system} on {devices} devices: {available} are available")
  config = configured(system, config, devices or available)
  classes = config.dataset.num_classes or 1000
  setup = train.make_setup(config, classes, config.dataset.num_train_examples or IMAGENET_TRAIN)
  key = jax.random.key(config.seed)
  if system.impl == "plain":
    table = setup.net.table
    net = baseline.PlainNetwork(table, dtype=jnp.dtype(config.dtype), weight_init=config.weight_init)

    create = train.placed_init(setup, lambda k: baseline.init_params(net, k, config.image_size),
                               lambda params: baseline.param_shardings(setup.mesh, table, params))

    forward = baseline.sharded_apply(net, setup.mesh)
  else:
    create, forward = functools.partial(train.create_train_state, setup), None
  host_batch = random_batch(config.batch_size, config.image_size, classes, size=config.dataset.resize)
  dropout_key = jax.random.key(1)
  batch = setup.batch_layout.put(host_batch)
  if system.layout == "pmap":
    state, batch = pmap.stack(setup.mesh, create(key)), pmap.rows(setup.mesh, batch)
    return Step(setup, pmap.train_step(setup).lower(state, batch, dropout_key).compile(), state, batch,
                dropout_key)
  step = jax.jit(functools.partial(train.train_step, setup=setup, forward=forward), donate_argnums=0)
  # The state as training holds it (train.jitted's into_step); plain XLA's network converts its own weights.
  into_step = (lambda state: state) if forward else functools.partial(train.with_compute_kernels, setup)
  # Compiled for the state's shapes and placement before the state is made: a system that cannot run here fails
  # before the (on a CPU, slow) initialisation.
  compiled = step.lower(into_step(jax.eval_shape(create, key)), batch, dropout_key).compile()
  return Step(setup, compiled, into_step(create(key)), batch, dropout_key)


def train_flops_per_image(table: Table, image_size: int) -> int:
  """FLOPs of one image's train step counted from the layer table: 2 × the multiply-adds of every conv and fc layer's
  forward pass, × 3 for forward, data gradient and filter gradient (conv1's data gradient, which no one computes,
  included, as MFU figures usually count it). Pools, LRN, the loss and the update are left out."""
  shapes = layer_shapes(table, image_size)
  macs = 0
  for layer in table.weighted():  # every kernel weight meets every output position once (an fc layer's: one)
    macs += math.prod(shapes.params[layer.name]["kernel"]) * math.prod(shapes.outputs[layer.name][1:-1])
  return 3 * 2 * macs
