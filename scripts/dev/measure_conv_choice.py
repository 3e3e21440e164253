"""Measures the table that kernel_backend 'auto' chooses each convolution direction by (alexnet_jax/ops/
conv_choice.py): per conv layer of each network, as one device runs it, forward, data and filter gradient of our
Triton kernel against XLA's convolution on the same CHWN arrays, on one GPU.

  python scripts/dev/measure_conv_choice.py --run configs/alexnet_1gpu.py:128,512 --run configs/vgg16.py:128
      [--dtype bfloat16] [--json OUT.json]
  python scripts/dev/measure_conv_choice.py --print_table OUT.json [OUT2.json …]

A layer shape met in several networks or batches is timed once. Every function is compiled first, several at a
time (compiling dominates), then each is timed alone: `calls` calls back to back after a warm-up, the median of
`rounds` rounds. Prints a row per layer and direction with the winner; --print_table prints conv_choice.MEASURED's
entries from one or more such JSON files.
"""

import concurrent.futures
import json
import runpy
import statistics
import time

import jax
import jax.numpy as jnp
from absl import flags

from alexnet_jax import cli, ops
from alexnet_jax.config import network_table
from alexnet_jax.measure.kernel_shapes import grouped_convs
from alexnet_jax.ops.conv_choice import MARGIN
from triton_kernels.conv_tiles import tile_key

flags.DEFINE_multi_string("run", [], "CONFIG.py:B1,B2,…: a config's network at these batches (images per device)")
flags.DEFINE_string("dtype", "bfloat16", "the activations' dtype")
flags.DEFINE_integer("calls", 20, "calls timed back to back per round")
flags.DEFINE_integer("rounds", 5, "rounds; the median counts")
flags.DEFINE_integer("compilers", 8, "functions compiled at a time")
flags.DEFINE_list("print_table", [], "JSON files of earlier runs: print their MEASURED entries and exit")
flags.DEFINE_string("json", None, "write the rows here")


def layer_shapes(runs: list[str]) -> dict[tuple, tuple]:
  """{tile_key: (names, ConvShape, kernel)} over every run's conv layers and directions, each shape once; the first
  conv's data gradient is never computed (the images need none)."""
  found = {}
  for run in runs:
    path, batches = run.rsplit(":", 1)
    config = runpy.run_path(path)["get_config"]()
    table = network_table(config, 1000)
    first = next(layer.name for layer in table.layers if layer.weighted)
    for batch in map(int, batches.split(",")):
      for s in grouped_convs(table, config.image_size, batch):
        for kernel in ("fwd", "dgrad", "wgrad"):
          if kernel == "dgrad" and s.name == first:
            continue
          key = tile_key(kernel, s.x, s.w, s.stride, s.padding, s.groups)
          found.setdefault(key, ([], s, kernel))[0].append(f"{config.network} {s.name} b{batch}")
  return found


def functions(s, kernel: str, dtype):
  """(ours, XLA's, the arguments' shapes) of one direction of a layer."""
  geom = dict(stride=s.stride, padding=s.padding, groups=s.groups)
  x, w = jax.ShapeDtypeStruct(s.x, dtype), jax.ShapeDtypeStruct(s.w, dtype)
  dy = jax.eval_shape(lambda x, w: ops.conv2d(x, w, backend="xla", **geom), x, w)

  def make(backend):
    conv = lambda x, w: ops.conv2d(x, w, backend=backend, **geom)  # noqa: E731
    if kernel == "fwd":
      return jax.jit(conv)
    which = 0 if kernel == "dgrad" else 1  # XLA drops the gradient the direction does not return
    return jax.jit(lambda x, w, dy: jax.vjp(conv, x, w)[1](dy)[which])

  return make("triton"), make("xla"), (x, w) if kernel == "fwd" else (x, w, dy)


def random_like(shapes) -> list:
  """Random non-zero arrays of these shapes (the filters small, as trained ones are), made only when timed: every
  layer's at once would not fit."""
  keys = jax.random.split(jax.random.key(0), len(shapes))
  return [jax.random.normal(k, a.shape, a.dtype) * (0.05 if i == 1 else 1)
          for i, (k, a) in enumerate(zip(keys, shapes))]


def timed(fn, args, calls: int, rounds: int) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    jax.block_until_ready([fn(*args) for _ in range(calls)])
    times.append((time.perf_counter() - t0) / calls)
  return statistics.median(times)


def measure(found: dict, dtype, calls: int, rounds: int, compilers: int) -> list[dict]:
  jobs = {key: functions(s, kernel, dtype) for key, (_, s, kernel) in found.items()}
  with concurrent.futures.ThreadPoolExecutor(compilers) as pool:  # compiled, then timed alone
    compiled = {key: pool.map(lambda f, a=args: f.lower(*a).compile(), (ours, xla))
                for key, (ours, xla, args) in jobs.items()}
    compiled = {key: list(fs) for key, fs in compiled.items()}
  rows = []
  for key, (ours, xla) in compiled.items():
    args = random_like(jobs[key][2])
    names, s, kernel = found[key]
    t_ours, t_xla = timed(ours, args, calls, rounds), timed(xla, args, calls, rounds)
    del args
    rows.append(dict(key=list(key), layers=names, kernel=kernel, ours_ms=t_ours * 1e3, xla_ms=t_xla * 1e3,
                     tflops=s.flops / t_ours / 1e12, xla_tflops=s.flops / t_xla / 1e12,
                     winner="xla" if t_xla < t_ours * (1 - MARGIN) else "ours"))
    r = rows[-1]
    print(f"{names[0]:28} {kernel:5} ours {r['ours_ms']:8.3f} ms {r['tflops']:6.1f} TF/s  XLA {r['xla_ms']:8.3f} ms "
          f"{r['xla_tflops']:6.1f} TF/s  ×{t_xla / t_ours:5.2f} {r['winner']}", flush=True)
  return rows


def print_table(paths: list[str]) -> None:
  for path in paths:
    with open(path) as f:
      result = json.load(f)
    print(f"    # {result['device']}, {result['dtype']}: {path}")
    for r in sorted(result["rows"], key=lambda r: r["key"]):
      line = f"    {tuple(r['key'])}: ({r['ours_ms']:.4f}, {r['xla_ms']:.4f}),"
      names = ", ".join(dict.fromkeys(name.rsplit(" ", 1)[0] for name in r["layers"]))  # the batch is in the key
      print(f"{line}  # {names}" if len(line) + len(names) < 116 else f"{line}  # {names[:113 - len(line)]}…")


def main(argv):
  del argv
  args = flags.FLAGS
  if args.print_table:
    return print_table(args.print_table)
  found = layer_shapes(args.run)
  print(f"{len(found)} layer directions, {jax.devices()[0].device_kind}, {args.dtype}", flush=True)
  rows = measure(found, jnp.dtype(args.dtype), args.calls, args.rounds, args.compilers)
  wins = sum(r["winner"] == "xla" for r in rows)
  print(f"XLA faster by more than {MARGIN:.0%} in {wins} of {len(rows)}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(device=jax.devices()[0].device_kind, dtype=args.dtype, runs=args.run, jax=jax.__version__,
                     rows=rows), f, indent=1)


if __name__ == "__main__":
  cli.run(main)
