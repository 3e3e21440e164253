"""The kernels' machine code for the H200 (compute capability 9.0), compiled here without a GPU as jax-triton
compiles them (alexnet_jax/measure/kernel_code.py): what their docstrings promise of it, at AlexNet's one-GPU shapes
at batch 128 in bfloat16. A kernel that spills, loses its tensor cores or its vector accesses fails here, on a CPU,
before any timing."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

# Run in a process of its own: Triton compiles for a GPU only where TRITON_INTERPRET is off when it is imported.
PROGRAM = textwrap.dedent("""
  import dataclasses, json
  import jax, jax.numpy as jnp
  from alexnet_jax.measure.kernel_code import compiled
  from alexnet_jax.ops.conv import CONV_DGRAD, CONV_FWD, CONV_WGRAD
  from alexnet_jax.ops.lrn import LRN_BWD, LRN_FWD
  from alexnet_jax.ops.lrn_pool import LRN_POOL_BWD, LRN_POOL_FWD
  from alexnet_jax.ops.pool import POOL_BWD, POOL_FWD

  S, bf16, n = jax.ShapeDtypeStruct, jnp.bfloat16, 128
  x, w, b, dy = S((96, 27, 27, n), bf16), S((48, 5, 5, 256), bf16), S((256,), jnp.float32), S((256, 27, 27, n), bf16)
  conv2 = dict(stride=1, padding=2, groups=2, precision="ieee")
  lrn1 = dict(groups=2, n=5, k=2.0, alpha=1e-4, beta=0.75, relu=True)
  c1, p1 = S((96, 55, 55, n), bf16), S((96, 27, 27, n), bf16)
  codes = dict(
      conv_fwd=compiled(CONV_FWD, x, w, b, relu=False, has_bias=True, **conv2),
      conv_dgrad=compiled(CONV_DGRAD, dy, w, x_shape=x.shape, **conv2),
      conv_wgrad=compiled(CONV_WGRAD, x, dy, w_shape=w.shape, **conv2),
      conv_wgrad_bias=compiled(CONV_WGRAD, x, dy, w_shape=w.shape, bias=True, **conv2),
      # a conv after a conv: the data gradient masked as it is written; the tangents' convolutions, of forward mode,
      # reading the images masked
      conv_dgrad_mask=compiled(CONV_DGRAD, dy, w, x, x_shape=x.shape, **conv2),
      conv_fwd_mask=compiled(CONV_FWD, x, w, b, x, relu=False, has_bias=False, images="masked", **conv2),
      conv_wgrad_mask=compiled(CONV_WGRAD, x, dy, x, w_shape=w.shape, images="masked", **conv2),
      lrn_fwd=compiled(LRN_FWD, c1, **lrn1),
      lrn_bwd=compiled(LRN_BWD, c1, c1, **lrn1),
      lrn_pool_fwd=compiled(LRN_POOL_FWD, c1, size=3, stride=2, **lrn1),
      lrn_pool_bwd=compiled(LRN_POOL_BWD, c1, p1, S(p1.shape, jnp.int8), size=3, stride=2, **lrn1),
      **{f"lrn_pool_fwd_{name}": compiled(LRN_POOL_FWD, c1, size=3, stride=2, launch=(("unroll", u),), **lrn1)
         for name, u in (("loop", 1), ("unrolled", 4))},
      **{f"lrn_pool_bwd_{name}": compiled(LRN_POOL_BWD, c1, p1, S(p1.shape, jnp.int8), size=3, stride=2,
                                          launch=(("unroll", u),), **lrn1)
         for name, u in (("loop", 1), ("unrolled", 4))},
      pool_fwd=compiled(POOL_FWD, c1, size=3, stride=2),
      pool_bwd=compiled(POOL_BWD, p1, S(p1.shape, jnp.int8), size=3, stride=2, height=55, width=55))
  print(json.dumps({k: dict(dataclasses.asdict(c), loads=c.widest("LDG"), stores=c.widest("STG"))
                    for k, c in codes.items()}))
""")


@pytest.fixture(scope="module")
def codes():
  env = dict(os.environ, TRITON_INTERPRET="0", JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_no_kernel_spills_to_local_memory(codes):
  assert {k: c["local_bytes"] for k, c in codes.items() if c["local_bytes"]} == {}


def test_the_convolutions_run_on_hopper_s_tensor_cores_from_async_16_byte_copies(codes):
  # the filter gradient's with the bias summed too (both of its loops: the first row tile's, the others'), and the
  # three with a mask source
  for kernel in ("conv_fwd", "conv_dgrad", "conv_wgrad", "conv_wgrad_bias", "conv_dgrad_mask", "conv_fwd_mask",
                 "conv_wgrad_mask"):
    code = codes[kernel]
    assert code["mma"] > 0 and any(o.startswith("LDGSTS") for o in code["memory"]), (kernel, code)
    assert code["loads"] == 128, (kernel, code["memory"])
    # Both of the tensor cores' operands come through the pipeline: a loop that loaded one into registers would wait
    # on it every step (a filter tile whose offsets the compiler cannot prove 16-byte aligned does).
    assert code["loops"] and all(loads == 0 for _, _, loads in code["loops"]), (kernel, code["loops"])


@pytest.mark.parametrize("kernel, bits", [
    ("lrn_fwd", 128), ("lrn_bwd", 64),  # a 16-byte vector a thread; four positions a thread
    ("pool_fwd", 32), ("pool_bwd", 128),  # two outputs a thread; a 16-byte vector of dx a thread
    ("lrn_pool_fwd", 16), ("lrn_pool_bwd", 64)])  # one pooled output a thread; four positions a thread
def test_element_wise_kernels_store_the_vectors_their_launch_rules_give_a_thread(codes, kernel, bits):
  assert codes[kernel]["stores"] == bits, codes[kernel]["memory"]


def test_lrn_walks_unrolled_over_four_channels_shift_their_windows_by_renaming(codes):
  # The channel loop a channel a pass copies the window's registers along at every channel; four channels a pass (of
  # the chunks the rules give at this batch), a shift is a renaming: fewer copies in four channels than in one, and a
  # tenth fewer instructions a channel at least.
  for kernel in ("lrn_pool_fwd", "lrn_pool_bwd"):
    (loop, copies, _), *_ = codes[f"{kernel}_loop"]["loops"]
    (unrolled, unrolled_copies, _), *_ = codes[f"{kernel}_unrolled"]["loops"]
    assert unrolled_copies < copies and unrolled / 4 < 0.9 * loop, (kernel, codes[f"{kernel}_loop"]["loops"],
                                                                     codes[f"{kernel}_unrolled"]["loops"])


def test_access_bits_reads_sass_opcodes():
  from alexnet_jax.measure.kernel_code import access_bits

  assert [access_bits(o) for o in ("LDG.E.128", "LDG.E.64", "LDG.E", "LDG.E.U16", "STG.E.U8",
                                   "LDGSTS.E.BYPASS.128")] == [128, 64, 32, 16, 8, 128]


def script_calls(network: str) -> list[tuple]:
  """(layer, primitive, operands) of each kernel scripts/dev/kernel_code.py compiles for network_table's `network`
  at batch 8, listed in a process of its own (compiling nothing)."""
  code = ("import json, sys; sys.path.insert(0, 'scripts/dev'); import jax.numpy as jnp, kernel_code; "
          f"from alexnet_jax.network.table import {network}; "
          "print(json.dumps([(n, p.prim.name, len(a)) for n, p, a, _ in kernel_code.calls("
          f"{network}(), 224, 8, jnp.bfloat16)]))")
  run = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(__file__)),
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  return [tuple(x) for x in json.loads(run.stdout.strip().splitlines()[-1])]


def test_kernel_code_script_lists_every_kernel_of_alexnet_s_one_device_step():
  """scripts/dev/kernel_code.py's kernels: each conv's three directions but conv1's data gradient (conv4's and
  conv5's masked by the ReLU of the conv before), each LRN as one op with its max-pool, pool5 alone."""
  listed = script_calls("alexnet")
  masked = [(name, n) for name, kernel, n in listed if kernel == "chwn_conv_dgrad"]
  assert masked == [("conv2", 2), ("conv3", 2), ("conv4", 3), ("conv5", 3)]  # dy, w and the mask source
  listed = [(name, kernel) for name, kernel, _ in listed]
  conv = ["chwn_conv_fwd", "chwn_conv_dgrad", "chwn_conv_wgrad"]
  assert listed == [("conv1", conv[0]), ("conv1", conv[2]),
                    *[(f"conv{i}", k) for i in range(2, 6) for k in conv],
                    *[(f"lrn{i}", f"chwn_lrn_max_pool_{d}") for i in (1, 2) for d in ("fwd", "bwd")],
                    ("pool5", "chwn_max_pool_fwd"), ("pool5", "chwn_max_pool_bwd")]


def test_kernel_code_script_lists_a_lone_lrn_and_its_own_pools():
  """ZFNet pools before each LRN: its LRNs run the LRN's own kernels, and every pool its own."""
  assert [(name, kernel) for name, kernel, _ in script_calls("zfnet") if not name.startswith("conv")] == [
      (name, f"chwn_{kind}_{d}") for name, kind in (("pool1", "max_pool"), ("lrn1", "lrn"), ("pool2", "max_pool"),
                                                    ("lrn2", "lrn"), ("pool5", "max_pool")) for d in ("fwd", "bwd")]
