"""Times our Triton kernels against XLA's own convolution (cuDNN) per AlexNet layer, on one GPU.

  python scripts/dev/bench_kernels.py [--batch 128] [--dtype bfloat16] [--backend triton] [--json OUT.json]

For each conv layer (one tower's share): forward, data and filter gradient of kernel_backend='triton' (CHWN) against
XLA in NHWC and in CHWN; for pools and LRNs, forward and backward against XLA's CHWN reference. Each function is
jitted and called 20 times back to back on random non-zero data after a warm-up; a call's time is the median over 7
such rounds. Reports TFLOP/s for convolutions, GB/s for the rest (`kernel_bytes`: what our kernel reads and writes,
each once), the ratio of XLA's time to ours, and the temporary memory each compiled function asks for beyond its
inputs and outputs (our direct convolutions need no im2col buffer). Prints a table; writes JSON.
"""

import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
from absl import flags
from jax import lax

from alexnet_jax import cli, ops
from alexnet_jax.measure.kernel_shapes import alexnet_convs, alexnet_maps

flags.DEFINE_integer("batch", 128, "images per layer shape")
flags.DEFINE_string("dtype", "bfloat16", "float32 or bfloat16")
flags.DEFINE_string("backend", "triton", "ours; 'auto' or 'interpret' check the plumbing off a GPU")
flags.DEFINE_string("json", None, "write the rows here")


def timed(fn, args, calls=20):
  """(median seconds per call, temp bytes of the compiled function).

  `calls` back-to-back calls of the jitted function, timed together (dispatch overlaps the GPU work), median of 7
  rounds. A scan over stacked inputs inside one program would save the dispatches but copies each slice into a
  buffer before a custom call (ours, and cuDNN's) while XLA's own ops read it in place: measured 2026-11-30, that
  doubled our pool times, so every call here stands alone, as in a training step.
  """
  jitted = jax.jit(fn)
  temp = jitted.lower(*args).compile().memory_analysis().temp_size_in_bytes
  jax.block_until_ready(jitted(*args))
  rounds = []
  for _ in range(7):
    t0 = time.perf_counter()
    jax.block_until_ready([jitted(*args) for _ in range(calls)])
    rounds.append((time.perf_counter() - t0) / calls)
  return statistics.median(rounds), temp


def conv_rows(batch, dtype, backend, key):
  for s in alexnet_convs(batch):
    kx, kw, kd = jax.random.split(key, 3)
    x = jax.random.normal(kx, s.x, dtype)
    w = (jax.random.normal(kw, s.w, jnp.float32) * 0.05).astype(dtype)
    geom = dict(stride=s.stride, padding=s.padding)
    y_shape = jax.eval_shape(lambda x, w: ops.conv2d(x, w, backend="xla", **geom), x, w).shape
    dy = jax.random.normal(kd, y_shape, dtype)
    ours = lambda x, w: ops.conv2d(x, w, backend=backend, **geom)  # noqa: E731
    chwn = lambda x, w: ops.conv2d(x, w, backend="xla", **geom)  # noqa: E731
    pad = ((s.padding, s.padding),) * 2

    def nhwc(x, w):  # XLA's favourite layout, transposes outside the timed function
      return lax.conv_general_dilated(x, w, (s.stride, s.stride), pad, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                      preferred_element_type=jnp.float32).astype(x.dtype)

    x_nhwc, w_hwio, dy_nhwc = x.transpose(3, 1, 2, 0), w.transpose(1, 2, 0, 3), dy.transpose(3, 1, 2, 0)
    for phase in ("fwd", "dgrad", "wgrad"):
      def pick(f, xx, ww, dd):
        """The phase as a function and its arguments; XLA drops the gradient the phase does not return."""
        if phase == "fwd":
          return f, (xx, ww)
        which = 0 if phase == "dgrad" else 1
        return (lambda a, b, d: jax.vjp(f, a, b)[1](d)[which]), (xx, ww, dd)

      t_ours, m_ours = timed(*pick(ours, x, w, dy))
      t_chwn, _ = timed(*pick(chwn, x, w, dy))
      t_nhwc, m_nhwc = timed(*pick(nhwc, x_nhwc, w_hwio, dy_nhwc))
      yield dict(layer=s.name, phase=phase, ms=t_ours * 1e3, xla_nhwc_ms=t_nhwc * 1e3, xla_chwn_ms=t_chwn * 1e3,
                 tflops=s.flops / t_ours / 1e12, xla_nhwc_tflops=s.flops / t_nhwc / 1e12,
                 ratio_vs_nhwc=t_nhwc / t_ours, ratio_vs_chwn=t_chwn / t_ours, temp_mib=m_ours / 2**20,
                 xla_nhwc_temp_mib=m_nhwc / 2**20)


def kernel_bytes(name, phase, x, y):
  """Bytes our pool or LRN kernel reads and writes (triton_kernels/pool.py, lrn.py). Max-pool: the forward reads x,
  writes y and the int8 position of each window's maximum; the backward reads dy and those positions and writes dx
  (it never reads x). LRN: the forward reads x and writes y; the backward reads x and dy and writes dx (it recomputes
  the denominators)."""
  size = x.dtype.itemsize
  if name.startswith("pool"):
    return (x.size + y.size) * size + y.size
  return (2 if phase == "fwd" else 3) * x.size * size


def map_rows(batch, dtype, backend, key):
  for name, shape in alexnet_maps(batch).items():
    x = jax.random.normal(key, shape, dtype) * 30
    op = ops.max_pool if name.startswith("pool") else functools.partial(ops.lrn, groups=1)
    y_shape = jax.eval_shape(lambda x: op(x, backend="xla"), x)
    dy = jax.random.normal(key, y_shape.shape, dtype)
    for phase in ("fwd", "bwd"):
      def make(backend):
        f = functools.partial(op, backend=backend)
        if phase == "fwd":
          return f, (x,)
        _, vjp = jax.vjp(f, x)  # a pytree holding the forward's residuals: the backward runs alone
        return (lambda vjp, d: vjp(d)[0]), (vjp, dy)

      t_ours, m_ours = timed(*make(backend))
      t_xla, _ = timed(*make("xla"))
      moved = kernel_bytes(name, phase, x, y_shape)
      yield dict(layer=name, phase=phase, ms=t_ours * 1e3, xla_chwn_ms=t_xla * 1e3, bytes=moved,
                 gbps=moved / t_ours / 1e9, ratio_vs_chwn=t_xla / t_ours, temp_mib=m_ours / 2**20)


def main(argv):
  del argv
  args = flags.FLAGS
  key = jax.random.key(0)
  convs = list(conv_rows(args.batch, args.dtype, args.backend, key))
  maps = list(map_rows(args.batch, args.dtype, args.backend, key))
  print(f"\n{args.dtype}, batch {args.batch}, {jax.devices()[0].device_kind}")
  print(f"{'layer':6} {'phase':6} {'ours ms':>8} {'TFLOP/s':>8} {'NHWC ms':>8} {'NHWC TF':>8} {'CHWN ms':>8} "
        f"{'×NHWC':>6} {'×CHWN':>6} {'tmp MiB':>8} {'NHWC tmp':>8}")
  for r in convs:
    print(f"{r['layer']:6} {r['phase']:6} {r['ms']:8.3f} {r['tflops']:8.1f} {r['xla_nhwc_ms']:8.3f} "
          f"{r['xla_nhwc_tflops']:8.1f} {r['xla_chwn_ms']:8.3f} {r['ratio_vs_nhwc']:6.2f} {r['ratio_vs_chwn']:6.2f} "
          f"{r['temp_mib']:8.1f} {r['xla_nhwc_temp_mib']:8.1f}")
  total = {k: sum(r[k] for r in convs) for k in ("ms", "xla_nhwc_ms", "xla_chwn_ms")}
  print(f"{'convs':6} {'all':6} {total['ms']:8.3f} {'':8} {total['xla_nhwc_ms']:8.3f} {'':8} "
        f"{total['xla_chwn_ms']:8.3f} {total['xla_nhwc_ms'] / total['ms']:6.2f} "
        f"{total['xla_chwn_ms'] / total['ms']:6.2f}")
  print(f"\n{'layer':6} {'phase':6} {'ours ms':>8} {'GB/s':>8} {'XLA ms':>8} {'×XLA':>6}")
  for r in maps:
    print(f"{r['layer']:6} {r['phase']:6} {r['ms']:8.3f} {r['gbps']:8.0f} {r['xla_chwn_ms']:8.3f} "
          f"{r['ratio_vs_chwn']:6.2f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(dtype=args.dtype, batch=args.batch, backend=args.backend, device=jax.devices()[0].device_kind,
                     convs=convs, maps=maps), f, indent=1)


if __name__ == "__main__":
  cli.run(main)
