"""The dense matrix-multiply rate one GPU reaches: XLA's GEMM (cuBLAS) on square matrices, the largest of which
stands for the peak that MFU divides by (benchmark.py's --peak_tflops).

  python scripts/dev/gemm_peak.py [--sizes 4096,8192,16384] [--dtype bfloat16] [--json OUT.json]

Each size: C = A @ B with float32 accumulation and the output in --dtype, `calls` calls back to back in one compiled
program (each multiplies its own copy of A, so XLA can neither merge nor hoist them) after a warm-up, the median of
`rounds` rounds; TFLOP/s = 2 × n³ × calls ÷ the round's time. Prints a table; writes JSON.
"""

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from absl import flags

from alexnet_jax import cli

flags.DEFINE_list("sizes", ["4096", "8192", "16384"], "square matrices' sides")
flags.DEFINE_string("dtype", "bfloat16", "the operands' dtype")
flags.DEFINE_integer("calls", 10, "multiplies per round, in one program")
flags.DEFINE_integer("rounds", 5, "rounds; the median counts")
flags.DEFINE_string("json", None, "write the rows here")


def gemm_tflops(n: int, dtype, calls: int, rounds: int) -> dict:
  ka, kb = jax.random.split(jax.random.key(n))
  a = jax.random.normal(ka, (calls, n, n), dtype)
  b = jax.random.normal(kb, (n, n), dtype)

  @jax.jit
  def many(a, b):
    return jax.vmap(lambda x: jnp.dot(x, b, preferred_element_type=jnp.float32).astype(dtype))(a)

  jax.block_until_ready(many(a, b))
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    jax.block_until_ready(many(a, b))
    times.append(time.perf_counter() - start)
  ms = statistics.median(times) * 1e3 / calls
  return dict(n=n, dtype=jnp.dtype(dtype).name, ms=ms, tflops=2 * n ** 3 / ms / 1e9,
              spread_ms=[t * 1e3 / calls for t in times])


def main(argv):
  del argv
  args = flags.FLAGS
  if not all(s.isdigit() and int(s) > 0 for s in args.sizes):
    sys.exit(f"error: --sizes takes positive whole numbers, got {','.join(args.sizes)}")
  device = jax.devices()[0]
  rows = [gemm_tflops(int(s), jnp.dtype(args.dtype), args.calls, args.rounds) for s in args.sizes]
  print(f"{device.device_kind}, {args.dtype}, jax {jax.__version__}")
  print(f"{'n':>6} {'ms':>9} {'TFLOP/s':>9}")
  for r in rows:
    print(f"{r['n']:>6} {r['ms']:>9.3f} {r['tflops']:>9.1f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(device=device.device_kind, platform=device.platform, jax=jax.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
  cli.run(main)
