"""Times the train step (forward, backward, SGD-momentum update) of our systems against plain XLA and PyTorch, in
one run, and prints a table (--json writes the rows).

  python scripts/benchmark.py --config configs/alexnet_1gpu.py [--config.key=value …]
      [--systems triton:one,plain:one,torch:one] [--dtypes bfloat16] [--batches 128,512 | --per_device_batches 128]
      [--devices 1,2,4,8] [--steps 20] [--windows 5] [--peak_tflops 790] [--compilation_cache DIR] [--json OUT]
      [--torch_modes default,reduce-overhead] [--torch_flat_modes …] [--torch_compile_limit_s 150]

A system is IMPL:LAYOUT (alexnet_jax/measure/systems.py says which there are): our network on a kernel backend,
`plain` the same table as a JAX user writes it, `torch` / `torch_flat` as a PyTorch expert runs it (cuDNN's
benchmark mode, the whole step under torch.compile in each of --torch_modes, the fastest reported). Every row runs
the same loss, input and optimiser, in a process of its own (--noseparate: all in this one); --devices repeats each
on the first N devices (scripts/scaling_report.py tables such runs). What each column measures (throughput and
latency, MFU, memory, ×plain, the collectives' bytes) is in docs/BENCHMARKS.md, with the current figures.
"""

import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import DTYPES, apply_process_settings

ALL_SYSTEMS = ["triton:split", "xla:split", "triton:dp", "triton:one", "plain:split", "plain:dp", "plain:one"]

cli.define_config("a configs/*.py file")
flags.DEFINE_list("systems", ALL_SYSTEMS, "IMPL:LAYOUT systems to time (IMPL: plain or a kernel backend; LAYOUT: "
                  "split, dp, hybrid, pmap or one)")
flags.DEFINE_list("dtypes", [], "compute dtypes to time (default: the config's)")
flags.DEFINE_list("batches", [], "global batch sizes to time (default: the config's)")
flags.DEFINE_list("per_device_batches", [], "batch sizes per device to time, instead of --batches")
flags.DEFINE_list("devices", [], "device counts to time each system on, the first N devices (default: all)")
flags.DEFINE_integer("steps", 20, "steps per timed window")
flags.DEFINE_integer("windows", 5, "timed windows of back-to-back steps")
flags.DEFINE_float("peak_tflops", 790.0, "peak TFLOP/s of one device for MFU (790: an H200's bf16)")
flags.DEFINE_bool("separate", True, "run each system × dtype × batch in a process of its own")
flags.DEFINE_string("compilation_cache", None, "directory of JAX's persistent compilation cache, XLA's per-fusion "
                    "autotuning results with it, shared by the rows' processes: a row compiles faster where an "
                    "earlier one (or run) compiled or autotuned the same; the timed steps are the same")
flags.DEFINE_string("json", None, "write the rows here")
flags.DEFINE_list("torch_modes", ["default", "reduce-overhead"], "torch.compile modes the torch rows are timed in "
                  "(the row reports the fastest; max-autotune-no-cudagraphs too if named: minutes of compiling)")
flags.DEFINE_list("torch_flat_modes", ["default", "reduce-overhead"], "torch.compile modes of the torch_flat rows")
flags.DEFINE_float("torch_compile_limit_s", 150.0, "seconds a torch.compile mode's warm-up steps may take before "
                   "that mode is given up (0: no limit); torch's autotuning may run on a while before it stops")


def device_bytes(compiled) -> int:
  """What one device holds while the step runs: its arguments, outputs and temporaries, less the donated arguments
  that XLA reuses as outputs."""
  m = compiled.memory_analysis()
  return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def collective_bytes(plan, hlo_text) -> dict:
  """{'layer kind': bytes per step} of the compiled step's cross-device collectives (comm.measured's, whatever the
  group size)."""
  from alexnet_jax.measure import comm  # noqa: PLC0415

  traffic = {}
  for (layer, kind, _), size in comm.measured(plan, hlo_text).items():
    traffic[f"{layer} {kind}"] = traffic.get(f"{layer} {kind}", 0) + size
  return traffic


def xla_flops(compiled):
  costs = compiled.cost_analysis()
  costs = costs[0] if isinstance(costs, list) else costs
  return (costs or {}).get("flops")


def _first(value) -> float:
  import numpy as np  # noqa: PLC0415

  return float(np.ravel(value)[0])


def process_settings() -> dict:
  """The environment that tunes XLA and NCCL under this process (XLA_FLAGS, NCCL_*): part of what a row measured."""
  return {k: v for k, v in sorted(os.environ.items()) if k == "XLA_FLAGS" or k.startswith("NCCL_")}


def measure(system, config, devices: int | None, steps: int, windows: int, peak_tflops: float) -> dict:
  """Builds the system's step for `config` on the first `devices` devices (None: all) in this process and times it."""
  import jax  # noqa: PLC0415  (the parent of --separate runs never starts a backend: its children need the devices)

  from alexnet_jax.measure import hlo, systems  # noqa: PLC0415

  t0 = time.perf_counter()
  s = systems.build(system, config, devices)
  build_s = time.perf_counter() - t0
  compiled, state, batch, key = s.compiled, s.state, s.batch, s.key
  for _ in range(3):
    state, m = compiled(state, batch, key)
  jax.block_until_ready((state, m))
  pipelined = []
  for _ in range(windows):
    t0 = time.perf_counter()
    for _ in range(steps):
      state, m = compiled(state, batch, key)
    jax.block_until_ready((state, m))
    pipelined.append((time.perf_counter() - t0) / steps)
  blocked = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, m = compiled(state, batch, key)
    jax.block_until_ready((state, m))
    blocked.append(time.perf_counter() - t0)
  devices = list(s.setup.mesh.devices.flat)
  stats = [d.memory_stats() for d in devices]
  ms, b = statistics.median(pipelined) * 1e3, config.batch_size
  flops = systems.train_flops_per_image(s.setup.net.table, config.image_size)
  hlo_text = compiled.as_text()
  return dict(devices=len(devices), mesh=dict(s.setup.mesh.shape), dtype=config.dtype, batch=b,
              per_device_batch=b // len(devices),
              image_size=config.image_size, width=config.width, step_ms=ms,
              window_spread=(max(pipelined) - min(pipelined)) * 1e3 / ms, images_per_s=b / ms * 1e3,
              blocked_step_ms=statistics.median(blocked) * 1e3, flops_per_image=flops,
              mfu=flops * b / ms * 1e3 / (peak_tflops * 1e12 * len(devices)), peak_tflops=peak_tflops,
              xla_flops_per_device=xla_flops(compiled), step_gib=device_bytes(compiled) / 2**30,
              peak_gib=max(st["peak_bytes_in_use"] for st in stats) / 2**30 if all(stats) else None,
              loss=_first(m["loss"]) / _first(m["count"]),  # pmap returns one copy per device
              collective_bytes=collective_bytes(s.setup.plan, hlo_text), device=devices[0].device_kind,
              build_s=build_s, collective_hlo=[f"{c.computation}: {c.text}" for c in hlo.collectives(hlo_text)],
              settings=process_settings())


def measure_torch(impl: str, config, args) -> dict:
  """measure's row for the config's table in PyTorch on the first GPU (measure/torch_step.py); `torch_flat`: the
  table with one tower."""
  from alexnet_jax.config import network_table  # noqa: PLC0415
  from alexnet_jax.measure import systems, torch_step  # noqa: PLC0415

  if impl == "torch_flat":
    config.towers = 1
  table = network_table(config, config.dataset.num_classes or 1000)
  modes = args.torch_flat_modes if impl == "torch_flat" else args.torch_modes
  row = torch_step.measure(config, table, args.steps, args.windows, modes, args.torch_compile_limit_s or None)
  flops = systems.train_flops_per_image(table, config.image_size)
  return row | dict(flops_per_image=flops, mfu=flops * row["images_per_s"] / (args.peak_tflops * 1e12),
                    peak_tflops=args.peak_tflops, xla_flops_per_device=None, collective_hlo=[],
                    settings=process_settings())


def head(system, dtype, batch, per_device: bool, devices: int | None) -> dict:
  """What a row says of itself before it is run: its global batch, or its batch per device."""
  return dict(config=cli.config_name(), system=str(system), dtype=dtype, batch=None if per_device else batch,
              per_device_batch=batch if per_device else None, devices=devices)


def run_here(system, dtype, batch, per_device: bool, devices: int | None, args) -> dict:
  import jax  # noqa: PLC0415

  from alexnet_jax.measure import systems  # noqa: PLC0415

  row = head(system, dtype, batch, per_device, devices)
  if args.compilation_cache:
    jax.config.update("jax_compilation_cache_dir", args.compilation_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # every step: a row is compiled once
  try:
    system = systems.System.parse(system)
    config = args.config.copy_and_resolve_references()
    if per_device:
      batch *= math.prod(systems.mesh_shape(system.layout, config.towers, devices or jax.device_count()))
    config.dtype, config.batch_size, config.eval_batch_size, row["batch"] = dtype, batch, batch, batch
    if system.impl in systems.TORCH:
      return row | measure_torch(system.impl, config, args)
    return row | measure(system, config, devices, args.steps, args.windows, args.peak_tflops)
  except (ValueError, jax.errors.JaxRuntimeError) as e:  # a system that cannot run here, or runs out of memory
    return row | dict(error=" ".join(str(e).split())[:300])


def run_apart(system, dtype, batch, per_device: bool, devices: int | None) -> dict:
  """run_here in a child process: this script again on the same command line, narrowed to one row."""
  narrowed = [f"--systems={system}", f"--dtypes={dtype}", f"--{'per_device_batches' if per_device else 'batches'}="
              f"{batch}", *([f"--devices={devices}"] if devices else []), "--noseparate"]
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "row.json")
    t0 = time.perf_counter()
    child = subprocess.run([sys.executable, *sys.argv, *narrowed, f"--json={out}"], capture_output=True, text=True)
    if os.path.exists(out):
      with open(out) as f:
        return json.load(f)[0] | dict(process_s=time.perf_counter() - t0)
  return head(system, dtype, batch, per_device, devices) | dict(error=why_it_failed(child.stderr,
                                                                                     child.returncode)[:300])


def why_it_failed(stderr: str, returncode: int) -> str:
  """The line of a crashed child's stderr that says why: XLA's fatal check (an abort), or its last line."""
  lines = [line.strip() for line in stderr.splitlines() if line.strip()]
  if fatal := [line for line in lines if re.match(r"F\d{4} ", line)]:
    return "XLA aborted: " + fatal[0].split("] ", 1)[-1]
  return lines[-1] if lines else f"exit status {returncode}"


def compare(rows: list[dict]) -> None:
  """Adds vs_plain (images/s over the plain system of the same layout, dtype, batch and devices) and vs_one_device
  (over the same implementation's `one` row of that dtype and batch)."""
  rate = {(r["system"], r["dtype"], r["batch"], r["devices"]): r["images_per_s"] for r in rows if "error" not in r}
  for r in rows:
    if "error" in r:
      continue
    impl, layout = r["system"].split(":")
    plain = rate.get((f"plain:{layout}", r["dtype"], r["batch"], r["devices"]))
    one = rate.get((f"{impl}:one", r["dtype"], r["batch"], 1))
    r["vs_plain"] = r["images_per_s"] / plain if plain else None
    r["vs_one_device"] = r["images_per_s"] / one if one and layout != "one" else None


DIVERGED = "  diverged"  # beside a row whose loss ended not finite


def table(rows: list[dict]) -> str:
  def num(v, fmt):
    return "—" if v is None else format(v, fmt)

  done = [r for r in rows if "error" not in r]
  lines = []
  if done:
    r = done[0]
    lines.append(f"{r['config']} on {r['device']}: {r['flops_per_image'] / 1e9:.3f} GFLOP per image and train step "
                 f"(layer table: 3 × 2 × conv and fc multiply-adds); MFU against {r['peak_tflops']:g} TFLOP/s per "
                 "device; steps back to back, median of windows")
  lines.append(f"{'system':13} {'dev':>3} {'dtype':9} {'batch':>5} {'img/s':>9} {'ms/step':>8} {'spread':>6} "
               f"{'blocked':>8} {'MFU':>6} {'step GiB':>8} {'peak GiB':>8} {'×plain':>6} {'×1 dev':>6}  loss")
  for r in rows:
    if "error" in r:
      batch = num(r["batch"], "5d") if r["batch"] else f"{r['per_device_batch']}/dev"
      lines.append(f"{r['system']:13} {num(r['devices'], '3d'):>3} {r['dtype']:9} {batch:>5}  error: {r['error']}")
      continue
    lines.append(f"{r['system']:13} {r['devices']:3d} {r['dtype']:9} {r['batch']:5d} {r['images_per_s']:9,.0f} "
                 f"{r['step_ms']:8.3f} {r['window_spread']:6.1%} {r['blocked_step_ms']:8.3f} {r['mfu']:6.1%} "
                 f"{num(r['step_gib'], '8.2f'):>8} {num(r['peak_gib'], '8.2f'):>8} {num(r['vs_plain'], '6.2f'):>6} "
                 f"{num(r['vs_one_device'], '6.2f'):>6}  {r['loss']:.3f}{'' if math.isfinite(r['loss']) else DIVERGED}")
  if timed_modes := [r for r in done if "torch_modes" in r]:
    from alexnet_jax.measure import torch_step  # noqa: PLC0415

    lines.append("\ntorch.compile modes (the row gives the fastest):")
    lines += ["  " + torch_step.modes_line(r) for r in timed_modes]
  if any(not math.isfinite(r["loss"]) for r in done):
    lines.append(f"\n{DIVERGED.strip()}: the loss at the row's last timed step was not finite; it times a network "
                 "that no longer trains, so its figure is not one of training (a lower learning_rate or another "
                 "weight_init would train)")
  for r in done:
    if r["collective_bytes"]:
      lines.append(f"\n{r['system']} ({r['devices']} devices, {r['dtype']}, batch {r['batch']}): cross-device bytes "
                   "per step")
      lines += [f"  {k:40} {v / 2**20:10.2f} MiB" for k, v in sorted(r["collective_bytes"].items())]
  return "\n".join(lines)


def main(argv):
  del argv
  args = flags.FLAGS
  apply_process_settings(args.config)
  from alexnet_jax.measure.systems import System  # noqa: PLC0415
  from alexnet_jax.measure.torch_step import MODES  # noqa: PLC0415

  try:
    for s in args.systems:
      System.parse(s)
    dtypes = args.dtypes or [args.config.dtype]
    if bad := [d for d in dtypes if d not in DTYPES]:
      raise ValueError(f"--dtypes: {', '.join(bad)} not among {', '.join(DTYPES)}")
    for name in ("torch_modes", "torch_flat_modes"):
      if bad := [m for m in getattr(args, name) if m not in MODES]:
        raise ValueError(f"--{name}: {', '.join(bad)} not among {', '.join(MODES)}")
    if args.batches and args.per_device_batches:
      raise ValueError("give --batches (global) or --per_device_batches, not both")
    per_device = bool(args.per_device_batches)
    batches = [int(b) for b in args.batches or args.per_device_batches] or [args.config.batch_size]
    device_counts = [int(n) for n in args.devices] or [None]  # None: every device
    if min(batches) < 1 or min(n or 1 for n in device_counts) < 1 or args.steps < 1 or args.windows < 1:
      raise ValueError("--batches, --per_device_batches, --devices, --steps and --windows must be positive integers")
  except ValueError as e:
    sys.exit(f"error: {e}")
  rows = []
  for devices in device_counts:
    for batch in batches:
      for dtype in dtypes:
        for system in args.systems:
          rows.append(run_apart(system, dtype, batch, per_device, devices) if args.separate else
                      run_here(system, dtype, batch, per_device, devices, args))
          print(json.dumps(rows[-1]), flush=True)
  compare(rows)
  print("\n" + table(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
  if failed := sum("error" in r for r in rows):
    sys.exit(f"error: {failed} of {len(rows)} runs failed (their rows say why)")


if __name__ == "__main__":
  cli.run(main, required=["config"])
