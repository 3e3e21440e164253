"""Times the full train step (forward, backward, SGD update) of a config on the devices present.

  python scripts/bench_step.py --config configs/alexnet_2gpu.py [--config.key=value …] [--backends xla,triton]
      [--dtypes float32,bfloat16] [--batches 128,512] [--steps 20] [--windows 5] [--json OUT.json]

One config per run, each backend × dtype × batch size of it in turn. Random non-zero images and labels, one dropout
key (folded with the step inside it, as in training); warm-up steps excluded. Throughput: `--steps` steps
dispatched back to back with one wait at the end, as training runs them (the host queues the next step while the
devices compute this one); the median time per step of `--windows` such windows, and their spread (slowest minus
fastest window, over the median). Latency: as many steps, each waited for before the next is dispatched. Also the
bytes each cross-device collective moves per step, read from the compiled HLO (an all-reduce that XLA combined
from several layers' gradients is labelled with all of them), and the device memory of the step itself: arguments +
outputs + temporaries − donated buffers reused as outputs, per device, from XLA's analysis of that compiled program
(not the process's peak, which would carry every earlier row's). Prints a table; writes the rows as JSON.
"""

import functools
import itertools
import json
import statistics
import sys
import time

import jax
from absl import flags

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings, validate

cli.define_config("a configs/*.py file")
flags.DEFINE_list("backends", ["xla"], "kernel backends to time, e.g. xla,triton")
flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "compute dtypes to time")
flags.DEFINE_list("batches", [], "batch sizes to time (default: the config's)")
flags.DEFINE_integer("steps", 20, "steps per timed window")
flags.DEFINE_integer("windows", 5, "timed windows of back-to-back steps")
flags.DEFINE_string("json", None, "write the rows here")


def device_bytes(compiled) -> int:
  """What one device holds while the step runs: its arguments, outputs and temporaries, less the donated arguments
  that XLA reuses as outputs."""
  m = compiled.memory_analysis()
  return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def collective_bytes(setup, hlo_text) -> dict:
  from alexnet_jax import hlo  # noqa: PLC0415

  names, traffic = [layer.name for layer in setup.net.table.layers], {}
  for c in hlo.collectives(hlo_text):
    if c.group_size > 1:
      key = f"{'+'.join(c.layers(names)) or 'other'} {c.kind}"
      traffic[key] = traffic.get(key, 0) + c.bytes
  return traffic


def bench(config, steps, windows):
  from alexnet_jax import train  # noqa: PLC0415

  # Synthetic batches stand in for ImageNet (1000 classes, 1.28M images) unless the config says otherwise.
  classes = config.dataset.num_classes or 1000
  setup = train.make_setup(config, classes, config.dataset.num_train_examples or 1_281_167)
  state = train.create_train_state(setup, config, jax.random.key(0))
  # Stored-size images, as training sends them (the device cuts the crops): config.dataset.resize on a side.
  batch = train.put_batch(setup.mesh, train.random_batch(config.batch_size, config.image_size, classes,
                                                         size=config.dataset.resize))
  key = jax.random.key(1)
  step = jax.jit(functools.partial(train.train_step, setup=setup), donate_argnums=0)
  compiled = step.lower(state, batch, key).compile()
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
  ms = statistics.median(pipelined) * 1e3
  b = config.batch_size
  return dict(mesh=dict(setup.mesh.shape), dtype=config.dtype, batch=b, image_size=config.image_size,
              width=config.width, step_ms=ms, window_spread=(max(pipelined) - min(pipelined)) * 1e3 / ms,
              images_per_s=b / ms * 1e3, blocked_step_ms=statistics.median(blocked) * 1e3,
              loss=float(m["loss"]) / float(m["count"]), device_gib=device_bytes(compiled) / 2**30,
              collective_bytes=collective_bytes(setup, compiled.as_text()),
              device=str(setup.mesh.devices.flat[0].device_kind))


def main(argv):
  del argv
  args = flags.FLAGS
  config = args.config
  apply_process_settings(config)
  rows = []
  for backend, dtype, batch in itertools.product(args.backends, args.dtypes, args.batches or [config.batch_size]):
    c = config.copy_and_resolve_references()
    try:
      c.kernel_backend, c.dtype, c.batch_size = backend, dtype, int(batch)
      validate(c)
    except ValueError as e:
      sys.exit(f"error: {e}")
    rows.append(dict(config=cli.config_name(), backend=backend, **bench(c, args.steps, args.windows)))
    print(json.dumps(rows[-1]), flush=True)
  print(f"\n{'config':14} {'backend':8} {'mesh':16} {'dtype':9} {'batch':>5} {'ms/step':>8} {'spread':>7} {'img/s':>8} "
        f"{'blocked':>8} {'GiB/dev':>8}  loss")
  for r in rows:
    mesh = "×".join(f"{k}{v}" for k, v in r["mesh"].items())
    print(f"{r['config']:14} {r['backend']:8} {mesh:16} {r['dtype']:9} {r['batch']:5d} {r['step_ms']:8.2f} "
          f"{r['window_spread']:7.1%} {r['images_per_s']:8.0f} {r['blocked_step_ms']:8.2f} {r['device_gib']:8.2f}  "
          f"{r['loss']:.3f}")
  shown = []
  for r in rows:
    if r["collective_bytes"] and r["collective_bytes"] not in shown:  # backends move the same bytes
      shown.append(r["collective_bytes"])
      print(f"\ncross-device bytes per step ({r['dtype']}, batch {r['batch']}):")
      for k, v in sorted(r["collective_bytes"].items()):
        print(f"  {k:40} {v / 2**20:10.2f} MiB")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  cli.run(main, required=["config"])
