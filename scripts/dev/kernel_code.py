"""Every Triton kernel of a network's step on one device, compiled for a GPU (Hopper by default) on this machine, which
needs none: registers, local memory (spills), shared memory, the widest global load and store a thread makes, the
tensor-core instructions, and the instructions of its longest loop's body, the register copies and the loads into
registers among them (alexnet_jax/measure/kernel_code.py). What to read before timing a kernel, or when a profile
says one is slow.

  TRITON_INTERPRET=0 python3 scripts/dev/kernel_code.py --config configs/alexnet_1gpu.py [--batch 512]
      [--dtype bfloat16] [--arch 90] [--json OUT.json]

Each conv layer's three directions (the first has no data gradient) with the launch its table gives; each LRN (with
the conv's ReLU, the layer's constants), as one op with the max-pool after it where there is one; every other
max-pool; the launch rules' own blocks.
"""

import dataclasses
import json
import os
import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.measure.kernel_shapes import first_conv, grouped_convs, grouped_maps, pool_after

cli.define_config("a configs/*.py file: its network (and image size)")
flags.DEFINE_integer("batch", 128, "images on the device")
flags.DEFINE_string("dtype", "bfloat16", "the activations' dtype")
flags.DEFINE_integer("arch", 90, "the compute capability compiled for (90: H100, H200)")
flags.DEFINE_string("json", None, "write the rows here")


def calls(table, image_size: int, batch: int, dtype):
  """(layer, primitive, avals, params) of each kernel the network runs on one device."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  from alexnet_jax.ops import conv, lrn_pool, pool  # noqa: PLC0415
  from alexnet_jax.ops.lrn import LRN_BWD, LRN_FWD  # noqa: PLC0415  (ops.lrn is the op itself)
  from alexnet_jax.ops.backend import dot_precision  # noqa: PLC0415
  from triton_kernels.launch import pooled_shape  # noqa: PLC0415

  s = jax.ShapeDtypeStruct
  first = first_conv(table)
  after_a_conv = {b.name for a, b in zip(table.layers, table.layers[1:]) if a.kind == b.kind == "conv"}
  for c in grouped_convs(table, image_size, batch):
    geometry = dict(stride=c.stride, padding=c.padding, groups=c.groups, precision=dot_precision(dtype))
    x, w, (dy,) = s(c.x, dtype), s(c.w, dtype), conv.CONV_FWD.spec.outputs(s(c.x, dtype), s(c.w, dtype), None,
                                                                          **geometry)
    yield c.name, conv.CONV_FWD, (x, w, s(c.w[-1:], jnp.float32)), dict(relu=True, has_bias=True, **geometry)
    if c.name != first:  # after a conv, masked by that conv's ReLU as it writes dx
      yield c.name, conv.CONV_DGRAD, (dy, w, *[x] * (c.name in after_a_conv)), dict(x_shape=c.x, **geometry)
    yield c.name, conv.CONV_WGRAD, (x, dy), dict(w_shape=c.w, bias=True, **geometry)
  pools = pool_after(table)
  after_lrn = {pools[a.name].name for a in table.layers if a.kind == "lrn" and a.name in pools}
  for layer, shape, groups in grouped_maps(table, image_size, batch).values():
    x = s(shape, dtype)
    if layer.kind == "lrn":
      params = dict(groups=groups, n=layer.size, k=layer.k, alpha=layer.alpha, beta=layer.beta, relu=True)
      if layer.name in pools:
        window = dict(size=pools[layer.name].size, stride=pools[layer.name].stride)
        pooled = s(pooled_shape(shape, **window), dtype)
        yield layer.name, lrn_pool.LRN_POOL_FWD, (x,), dict(params, **window)
        yield layer.name, lrn_pool.LRN_POOL_BWD, (x, pooled, s(pooled.shape, jnp.int8)), dict(params, **window)
      else:
        yield layer.name, LRN_FWD, (x,), params
        yield layer.name, LRN_BWD, (x, x), params
    elif layer.kind == "pool" and layer.name not in after_lrn:
      window = dict(size=layer.size, stride=layer.stride)
      pooled = s(pooled_shape(shape, **window), dtype)
      yield layer.name, pool.POOL_FWD, (x,), window
      yield layer.name, pool.POOL_BWD, (pooled, s(pooled.shape, jnp.int8)), dict(window, height=shape[1],
                                                                                 width=shape[2])


def main(argv):
  del argv
  args = flags.FLAGS
  if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("error: compiling for a GPU needs TRITON_INTERPRET unset or 0 (the interpreter compiles nothing)")
  import jax.numpy as jnp  # noqa: PLC0415

  from alexnet_jax.config import network_table  # noqa: PLC0415
  from alexnet_jax.measure.kernel_code import compiled  # noqa: PLC0415

  config = args.config
  table = network_table(config, config.dataset.num_classes or 1000)
  rows = []
  print(f"{args.dtype}, batch {args.batch}, compute capability {args.arch / 10:.1f}")
  print(f"{'layer':8} {'kernel':22} {'regs':>5} {'local':>6} {'shared':>7} {'load':>5} {'store':>5} {'mma':>4} "
        f"{'loop':>5} {'copies':>6} {'loop loads':>10}")
  for name, primitive, avals, params in calls(table, config.image_size, args.batch, jnp.dtype(args.dtype)):
    code = compiled(primitive, *avals, arch=args.arch, **params)
    rows.append(dict(layer=name, **dataclasses.asdict(code), load_bits=code.widest("LDG"),
                     store_bits=code.widest("STG")))
    loop, copies, loads = max(code.loops, default=(0, 0, 0))
    print(f"{name:8} {code.kernel:22} {code.registers:5} {code.local_bytes:6} {code.shared_bytes:7} "
          f"{code.widest('LDG'):5} {code.widest('STG'):5} {code.mma:4} {loop:5} {copies:6} {loads:10}", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(dtype=args.dtype, batch=args.batch, arch=args.arch, rows=rows), f, indent=1)


if __name__ == "__main__":
  cli.run(main, required=["config"])
