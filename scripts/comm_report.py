"""Lists what each strategy's train step moves between devices, per layer, from the compiled HLO beside what the
layer table implies (alexnet_jax/comm.py):

  python scripts/comm_report.py --config configs/alexnet_2gpu.py [--config.key=value …]
      [--strategies tower,data,hybrid] [--batches 128,1024] [--devices 4,8] [--json OUT.json]

The step is compiled, not run, for the config's mesh, or with --devices for the mesh that scripts/benchmark.py's
layout of each strategy spreads over each device count (systems.mesh_shape: tower as split, towers × N/towers;
data as dp, 1 × N; hybrid N × 1). On a CPU host add --config.cpu_devices=N to simulate N devices. Per collective:
its kind, the layer it belongs to (a combined gradient all-reduce split by the layers it carries; 'input+loss' for
what lies outside the network), the devices of each group and the bytes per step (hlo.Collective: the whole gathered
tensor, the whole tensor before a reduce-scatter, the reduced operand), then the table's figure and each strategy's
total. Prints markdown; --json writes one record per collective with a
"layer" field. On CPU a bfloat16 step's reduce-scatters run in float32 (model._gather_bf16), which the table's
figure (in the compute dtype) does not know.
"""

import dataclasses
import json
import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings

cli.define_config("a configs/*.py file")
flags.DEFINE_list("strategies", ["tower", "data", "hybrid"], "strategies to compile (networks.STRATEGIES)")
flags.DEFINE_list("batches", [], "global batch sizes (default: the config's)")
flags.DEFINE_list("devices", [], "device counts to place each strategy on as benchmark.py's layouts do (default: the "
                  "config's mesh)")
flags.DEFINE_string("json", None, "write the records here")

LAYOUTS = dict(tower="split", data="dp", hybrid="hybrid")  # each strategy's layout in systems.py


def records(config, strategy: str, batch: int, devices: int | None = None) -> list[dict]:
  import functools  # noqa: PLC0415

  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from alexnet_jax import comm, systems, train  # noqa: PLC0415
  from alexnet_jax.config import validate  # noqa: PLC0415

  c = config.copy_and_resolve_references()
  c.strategy, c.batch_size, c.eval_batch_size = strategy, batch, batch
  if devices:
    c.mesh.model, c.mesh.data = systems.mesh_shape(LAYOUTS[strategy], c.towers, devices)
  c = validate(c)
  classes = c.dataset.num_classes or 1000
  setup = train.make_setup(c, classes, c.dataset.num_train_examples or 1_281_167)
  state = train.train_state_init(setup, c).eval_shape(jax.random.key(0))
  size = c.dataset.resize if c.dataset.name != "procedural" else c.image_size
  example = train.random_batch(1, c.image_size, classes, size=size)
  batch_shapes = {k: jax.ShapeDtypeStruct((batch, *v.shape[1:]), v.dtype,
                                          sharding=train.batch_sharding(setup.mesh, v.ndim)) for k, v in example.items()}
  step = jax.jit(functools.partial(train.train_step, setup=setup))
  text = step.lower(state, batch_shapes, jax.random.key(0)).compile().as_text()
  mesh = dict(setup.mesh.shape)
  found = comm.report(setup.net.table, text, c.image_size, batch, mesh["data"], mesh["model"],
                      np.dtype(c.dtype).itemsize)
  return [dict(strategy=strategy, batch=batch, mesh=mesh, dtype=c.dtype) | dataclasses.asdict(t) for t in found]


def markdown(rows: list[dict]) -> str:
  def mib(v):
    return "—" if v is None else f"{v / 2**20:,.3f}"

  lines, groups = [], {}
  for r in rows:
    groups.setdefault((r["strategy"], r["batch"], r["mesh"]["data"], r["mesh"]["model"]), []).append(r)
  for (strategy, batch, *_), group in groups.items():
    mesh = group[0]["mesh"]
    lines += [f"\n**{strategy}**, global batch {batch}, mesh data={mesh['data']} × model={mesh['model']} "
              f"({group[0]['dtype']}): MiB per step", "",
              "| layer | collective | devices | compiled HLO | layer table |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['layer']} | {r['kind']} | {r['participants']} | {mib(r['bytes'])} | {mib(r['analytic_bytes'])} |"
              for r in group]
  lines += ["", "| strategy | batch | mesh data × model | MiB per step (HLO) | of which in the network | layer table |",
            "| --- | --- | --- | --- | --- | --- |"]
  for (strategy, batch, data, model), group in groups.items():
    network = [r for r in group if r["analytic_bytes"] is not None]
    lines.append(f"| {strategy} | {batch} | {data} × {model} | {mib(sum(r['bytes'] for r in group))} | "
                 f"{mib(sum(r['bytes'] for r in network))} | {mib(sum(r['analytic_bytes'] for r in network))} |")
  return "\n".join(lines)


def main(argv):
  del argv
  args = flags.FLAGS
  apply_process_settings(args.config)
  from alexnet_jax.networks import STRATEGIES  # noqa: PLC0415

  try:
    if bad := [s for s in args.strategies if s not in STRATEGIES]:
      raise ValueError(f"--strategies: {', '.join(bad)} not among {', '.join(STRATEGIES)}")
    batches = [int(b) for b in args.batches] or [args.config.batch_size]
    device_counts = [int(n) for n in args.devices] or [None]
    if min(n or 1 for n in device_counts) < 1:
      raise ValueError("--devices must be positive integers")
    rows = [r for n in device_counts for b in batches for s in args.strategies for r in records(args.config, s, b, n)]
  except ValueError as e:
    sys.exit(f"error: {e}")
  print(markdown(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  cli.run(main, required=["config"])
