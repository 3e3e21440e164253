"""Times the full train step (forward, backward, SGD update) of a config on the devices present.

  python scripts/bench_step.py --config configs/alexnet_2gpu.py [--config configs/alexnet_1gpu.py …]
      [--dtypes float32,bfloat16] [--steps 20] [--json OUT.json] [--override key=value …]

Random non-zero images, labels drawn at random; warm-up steps excluded; the median step time of `--steps` timed
steps. Also reports the bytes each cross-device collective moves per step, read from the compiled HLO, and the
peak device memory where the platform reports it. Prints a table; writes the rows as JSON.
"""

import argparse
import itertools
import functools
import json
import runpy
import statistics
import time

import jax


def load_config(path, overrides):
  config = runpy.run_path(path)["get_config"]()
  for item in overrides:
    key, value = item.split("=", 1)
    *parents, leaf = key.split(".")
    node = functools.reduce(getattr, parents, config)
    kind = type(getattr(node, leaf))
    setattr(node, leaf, value.lower() in ("1", "true") if kind is bool else kind(value))  # numbers, strings, bools
  return config


def bench(config, steps):
  from alexnet_jax import hlo, train  # noqa: PLC0415

  # Synthetic batches stand in for ImageNet (1000 classes, 1.28M images) unless the config says otherwise.
  classes = config.dataset.num_classes or 1000
  setup = train.make_setup(config, classes, config.dataset.num_train_examples or 1_281_167)
  state = train.create_train_state(setup, config, jax.random.key(0))
  batch = train.put_batch(setup.mesh, train.random_batch(config.batch_size, config.image_size, classes))
  step = jax.jit(functools.partial(train.train_step, setup=setup), donate_argnums=0)
  compiled = step.lower(state, batch, jax.random.key(1)).compile()
  names = [layer.name for layer in setup.net.table.layers]
  traffic, lines = {}, []
  for c in hlo.collectives(compiled.as_text()):
    lines.append(c.text)
    if c.group_size > 1:
      key = f"{c.layer(names) or 'other'} {c.kind}"
      traffic[key] = traffic.get(key, 0) + c.bytes
  for _ in range(3):
    state, m = step(state, batch, jax.random.key(1))
  jax.block_until_ready(m)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, m = step(state, batch, jax.random.key(1))
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
  loss = float(m["loss"]) / float(m["count"])
  stats = [d.memory_stats() or {} for d in setup.mesh.devices.flat]
  peak = max((st.get("peak_bytes_in_use", 0) for st in stats), default=0)
  ms = statistics.median(times) * 1e3
  s, b = config.image_size, config.batch_size
  return dict(mesh=dict(setup.mesh.shape), dtype=config.dtype, batch=b, image_size=s, width=config.width,
              step_ms=ms, images_per_s=b / ms * 1e3, loss=loss, peak_gib_per_device=peak / 2**30,
              collective_bytes=traffic, collective_hlo=lines, device=str(setup.mesh.devices.flat[0].device_kind))


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", action="append", required=True)
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--backends", default="xla", help="kernel backends to time, e.g. xla,triton")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--override", action="append", default=[], help="key=value, e.g. batch_size=256")
  parser.add_argument("--json")
  args = parser.parse_args()
  rows = []
  for path, backend, dtype in itertools.product(args.config, args.backends.split(","), args.dtypes.split(",")):
    config = load_config(path, args.override + [f"dtype={dtype}", f"kernel_backend={backend}"])
    if config.cpu_devices:
      jax.config.update("jax_num_cpu_devices", config.cpu_devices)
    rows.append(dict(config=path, backend=backend, **bench(config, args.steps)))
    print(json.dumps(rows[-1]), flush=True)
  print(f"\n{'config':28} {'backend':8} {'mesh':16} {'dtype':9} {'batch':>5} {'ms/step':>9} {'img/s':>9} "
        f"{'peak GiB':>9}  loss")
  for r in rows:
    mesh = "×".join(f"{k}{v}" for k, v in r["mesh"].items())
    print(f"{r['config']:28} {r['backend']:8} {mesh:16} {r['dtype']:9} {r['batch']:5d} {r['step_ms']:9.2f} "
          f"{r['images_per_s']:9.0f} {r['peak_gib_per_device']:9.2f}  {r['loss']:.3f}")
  if rows and rows[0]["collective_bytes"]:
    print("\ncross-device bytes per step (" + rows[0]["config"] + ", " + rows[0]["dtype"] + "):")
    for k, v in sorted(rows[0]["collective_bytes"].items()):
      print(f"  {k:28} {v / 2**20:10.2f} MiB")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
