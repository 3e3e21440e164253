"""Lists what a train step moves between devices, per layer, from the compiled HLO beside the placement plan's
figure (alexnet_jax/measure/comm.py), with the plan itself: a strategy's traffic, known without running it.

  python scripts/comm_report.py --config configs/alexnet_2gpu.py [--config.key=value …]
      [--strategies tower,data,hybrid] [--dtypes float32,bfloat16] [--batches 128,1024] [--devices 4,8]
      [--json OUT.json]

The step is compiled, not run: by default for the config's strategy, dtype, batch and mesh; --devices takes the mesh
that scripts/benchmark.py's layout of each strategy spreads over each device count (on a CPU host add
--config.cpu_devices=N to simulate N devices). Per collective: its kind, its layer (outside the network: 'input',
'labels', 'loss', 'metrics', else 'other'), the devices of each group and the bytes per step, then the plan's figure
and each step's total. On CPU devices XLA runs bfloat16 gathers and reduce-scatters in float32: their rows say so,
with twice the plan's bytes. Prints markdown; --json writes one record per collective.
"""

import json
import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings

cli.define_config("a configs/*.py file")
flags.DEFINE_list("strategies", [], "strategies to compile: tower, data, hybrid or table (default: the config's)")
flags.DEFINE_list("dtypes", [], "compute dtypes (default: the config's)")
flags.DEFINE_list("batches", [], "global batch sizes (default: the config's)")
flags.DEFINE_list("devices", [], "device counts to place each strategy on as benchmark.py's layouts do (default: the "
                  "config's mesh)")
flags.DEFINE_string("json", None, "write the records here")

def markdown(rows: list[dict]) -> str:
  def mib(v):
    return "—" if v is None else f"{v / 2**20:,.3f}"

  lines, groups = [], {}
  for r in rows:
    groups.setdefault((r["strategy"], r["dtype"], r["batch"], r["mesh"]["data"], r["mesh"]["model"]), []).append(r)
  for (strategy, dtype, batch, data, model), group in groups.items():
    lines += [f"\n**{strategy}**, {dtype}, global batch {batch}, mesh data={data} × model={model}", "",
              group[0]["plan"], "", "MiB per step:", "",
              "| layer | collective | devices | compiled HLO | plan |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['layer']} | {r['kind']} | {r['participants']} | {mib(r['bytes'])}"
              f"{' (float32 on CPU)' if r['float32_on_cpu'] else ''} | {mib(r['analytic_bytes'])} |"
              for r in group if r["layer"] is not None]
  lines += ["",
            "| strategy | dtype | batch | mesh data × model | MiB per step (HLO) | of which in the network | plan |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
  for (strategy, dtype, batch, data, model), group in groups.items():
    network = [r for r in group if r.get("analytic_bytes") is not None]
    lines.append(f"| {strategy} | {dtype} | {batch} | {data} × {model} | "
                 f"{mib(sum(r.get('bytes', 0) for r in group))} | {mib(sum(r['bytes'] for r in network))} | "
                 f"{mib(sum(r['analytic_bytes'] for r in network))} |")
  return "\n".join(lines)


def main(argv):
  del argv
  args = flags.FLAGS
  apply_process_settings(args.config)
  from alexnet_jax.measure import comm  # noqa: PLC0415
  from alexnet_jax.network.table import STRATEGIES  # noqa: PLC0415

  try:
    strategies = args.strategies or [args.config.strategy]
    if bad := [s for s in strategies if s not in (*STRATEGIES, "table")]:
      raise ValueError(f"--strategies: {', '.join(bad)} not among {', '.join(STRATEGIES)}, table")
    dtypes = args.dtypes or [args.config.dtype]
    batches = [int(b) for b in args.batches] or [args.config.batch_size]
    device_counts = [int(n) for n in args.devices] or [None]
    if min(n or 1 for n in device_counts) < 1:
      raise ValueError("--devices must be positive integers")
    rows = [r for n in device_counts for b in batches for s in strategies for d in dtypes
            for r in comm.records(args.config, s, d, b, n)]
  except ValueError as e:
    sys.exit(f"error: {e}")
  print(markdown(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  cli.run(main, required=["config"])
