"""What XLA made of a system's train step: its convolutions' dtypes, the layout changes it put between ops, scatters.

  python scripts/dev/hlo_census.py --config configs/alexnet_1gpu.py [--config.key=value …]
      [--systems xla:one,plain:one] [--min_bytes 65536] [--json OUT.json]

Compiles each system's step as scripts/benchmark.py does (alexnet_jax/measure/systems.py) and reads the compiled
HLO, fusions included: every convolution by its operand and result dtypes (a bfloat16 step whose convolutions are
float32 runs them on TF32 or FFT kernels; XLA:CPU runs every bfloat16 convolution in float32), every transpose and
layout-changing copy of at least --min_bytes by layer and pass (what XLA's layout assignment could not avoid), and
every scatter (max-pool's gradient; the loss's gradient of its labels' logits). For kernel_backend=xla against
plain: the same convolution dtypes, no more layout changes, no scatter from the pools. Prints a table; writes JSON.
"""

import json
import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings
from alexnet_jax.measure import layouts, systems

cli.define_config("a configs/*.py file")
flags.DEFINE_list("systems", ["xla:one", "plain:one"], "IMPL:LAYOUT systems, as scripts/benchmark.py's --systems")
flags.DEFINE_integer("min_bytes", 65536, "smallest transpose or copy listed, in bytes")
flags.DEFINE_string("json", None, "write the census here")


def main(argv):
  del argv
  args = flags.FLAGS
  apply_process_settings(args.config)
  rows = []
  try:
    for text in args.systems:
      system = systems.System.parse(text)
      step = systems.build(system, args.config)
      names = [layer.name for layer in step.setup.net.table.layers]
      rows.append(dict(system=text, dtype=args.config.dtype, batch=args.config.batch_size,
                       device_kind=step.setup.mesh.devices.flat[0].device_kind,
                       **layouts.census(step.compiled.as_text(), names, args.min_bytes, args.config.batch_size)))
  except ValueError as e:
    sys.exit(f"error: {e}")
  print(f"{'system':12} {'convolutions':36} {'scatters':20} transposes and copies ≥ {args.min_bytes} B: all, of "
        "activations")
  for r in rows:
    convs = ", ".join(f"{n}× {k}" for k, n in sorted(r["convolutions"].items()))
    scatters = ", ".join(f"{n}× {k}" for k, n in r["scatters"].items()) or "none"
    count = sum(m["activation"] for m in r["layout_changes"])
    print(f"{r['system']:12} {convs:36} {scatters:20} {len(r['layout_changes'])}, "
          f"{r['layout_change_bytes'] / 2**20:.1f} MiB; {count}, {r['activation_change_bytes'] / 2**20:.1f} MiB")
    for m in r["layout_changes"]:
      print(f"  {m['layer']:20} {m['pass']} {m['op']:9} {m['type']:36} {m['bytes'] / 2**20:8.2f} MiB"
            f"{'  activation' if m['activation'] else ''}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  cli.run(main, required=["config"])
