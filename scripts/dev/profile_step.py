"""Where a train step's time goes: a per-kernel table of traced steps, grouped by layer, pass and kind of op.

  python scripts/dev/profile_step.py --config configs/alexnet_2gpu.py [--config.key=value …] [--system triton:split]
      [--steps 10] [--trace_dir DIR] [--top 40] [--json OUT.json]

Builds the system's step as scripts/benchmark.py does (alexnet_jax/measure/systems.py), times --steps steps back to
back untraced, then traces as many under jax.profiler and reads the Perfetto JSON it writes
(alexnet_jax/measure/kernel_times.py): every kernel (GPU) or thunk (CPU), named by the HLO op it runs, grouped by
layer, pass (forward or backward) and kind (our Triton kernels, XLA fusions, GEMMs, convolutions, copies,
collectives, memcpys). Per device: busy time per step (the union of its kernels), wall time per step and the
kernels' sum (above busy where kernels overlap). The trace stays in --trace_dir (default a fresh temporary folder,
printed) for Perfetto or TensorBoard. Prints the tables for --device (default the first); writes every device's as
JSON.
"""

import json
import statistics
import sys
import tempfile
import time

import jax
from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings
from alexnet_jax.measure import kernel_times, systems

cli.define_config("a configs/*.py file")
flags.DEFINE_string("system", "triton:split", "IMPL:LAYOUT, as scripts/benchmark.py's --systems")
flags.DEFINE_integer("steps", 10, "steps traced (and timed untraced before)")
flags.DEFINE_string("trace_dir", None, "where the trace goes (default: a new temporary folder)")
flags.DEFINE_string("device", None, "device whose tables are printed, e.g. GPU:0 or CPU:0 (default: the first)")
flags.DEFINE_integer("top", 40, "groups printed, largest first")
flags.DEFINE_string("json", None, "write the summary here")


def run_steps(step, state, n):
  for _ in range(n):
    state, m = step.compiled(state, step.batch, step.key)
  jax.block_until_ready((state, m))
  return state


def profile(system, config, steps: int, trace_dir: str) -> dict:
  step = systems.build(system, config)
  state = run_steps(step, step.state, 3)
  untraced = []
  for _ in range(3):
    t0 = time.perf_counter()
    state = run_steps(step, state, steps)
    untraced.append((time.perf_counter() - t0) / steps * 1e3)
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    run_steps(step, state, steps)
  events = kernel_times.device_events(kernel_times.newest_trace(trace_dir))
  if not events:
    raise ValueError(f"the trace in {trace_dir} holds no device events")
  names = [layer.name for layer in step.setup.net.table.layers]
  devices = kernel_times.summarise(events, kernel_times.hlo_ops(step.compiled.as_text()), names, steps)
  return dict(system=str(system), dtype=config.dtype, batch=config.batch_size, steps=steps,
              untraced_step_ms=statistics.median(untraced), trace_dir=trace_dir,
              device_kind=step.setup.mesh.devices.flat[0].device_kind, devices=devices)


def tables(summary: dict, device: str, top: int) -> str:
  d = summary["devices"][device]
  lines = [f"{summary['system']} {summary['dtype']} batch {summary['batch']} on {summary['device_kind']} {device}, "
           f"{summary['steps']} traced steps: busy {d['busy_ms']:.3f} ms of {d['wall_ms']:.3f} ms wall per step "
           f"({d['busy_ms'] / d['wall_ms']:.0%}), kernels sum to {d['kernel_ms']:.3f} ms, {d['events']:.0f} per step; "
           f"untraced {summary['untraced_step_ms']:.3f} ms per step", "", f"{'kind':28} {'ms/step':>8} {'of busy':>7}"]
  lines += [f"{k:28} {ms:8.3f} {ms / d['busy_ms']:7.1%}" for k, ms in d["by_kind"].items()]
  lines += ["", f"{'layer':20} {'pass':4} {'kind':24} {'ms/step':>8} {'of busy':>7} {'calls':>5}  largest kernel"]
  for g in d["groups"][:top]:
    name, ms = next(iter(g["kernels"].items()))
    lines.append(f"{g['layer']:20} {g['pass']:4} {g['kind'][:24]:24} {g['ms']:8.3f} {g['ms'] / d['busy_ms']:7.1%} "
                 f"{g['calls']:5.1f}  {name[:60]} ({ms:.3f})")
  if len(d["groups"]) > top:
    rest = d["groups"][top:]
    lines.append(f"{len(rest)} more groups: {sum(g['ms'] for g in rest):.3f} ms/step")
  return "\n".join(lines)


def main(argv):
  del argv
  args = flags.FLAGS
  config = args.config
  apply_process_settings(config)
  try:
    system = systems.System.parse(args.system)
    if args.steps < 1:
      raise ValueError("--steps must be a positive integer")
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="profile_step_")
    summary = profile(system, config, args.steps, trace_dir)
    device = args.device or next(iter(summary["devices"]))
    if device not in summary["devices"]:
      raise ValueError(f"--device {device} is not in the trace; it has {', '.join(summary['devices'])}")
  except ValueError as e:
    sys.exit(f"error: {e}")
  print(tables(summary, device, args.top))
  print(f"\ntrace: {trace_dir}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(summary, f, indent=1)


if __name__ == "__main__":
  cli.run(main, required=["config"])
