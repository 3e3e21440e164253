"""The kernels as XLA's own Triton call (alexnet_jax/ops/xla_triton.py, config.triton_call='xla').

On the CPU: the IR that Triton's compiler front end writes for every kernel of the paper's train step is read back by
jaxlib's Triton dialect and lowered for CUDA. Those run in a child process with TRITON_INTERPRET=0 (tests/conftest.py
sets 1 for the interpreter, under which @triton.jit gives no compiler front end). On a CUDA GPU (`pytest -m gpu`):
each kernel gives through XLA's call what it gives through jax-triton's.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alexnet_jax import ops
from alexnet_jax.config import paper_config, validate


def compiled_triton(code: str) -> dict:
  """Runs `code` with Triton's compiler (not its interpreter) in a child process; returns the JSON it prints last."""
  env = dict(os.environ, TRITON_INTERPRET="0")
  run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.splitlines()[-1])


def test_paper_train_step_lowers_every_kernel_as_an_xla_triton_call():
  found = compiled_triton("""
      import functools, json, re
      import jax
      jax.config.update("jax_num_cpu_devices", 2)
      from alexnet_jax import ops, train
      from alexnet_jax.config import paper_config
      ops.set_cuda_call("xla")
      c = paper_config()
      c.dtype, c.kernel_backend, c.batch_size = "bfloat16", "triton", 32
      setup = train.make_setup(c, 1000, 1000)
      state = jax.eval_shape(lambda k: train.create_train_state(setup, c, k), jax.random.key(0))
      batch = jax.eval_shape(lambda: train.random_batch(32, c.image_size, 1000))
      step = jax.jit(functools.partial(train.train_step, setup=setup))
      text = step.trace(state, batch, jax.random.key(0)).lower(lowering_platforms=("cuda",)).as_text()
      calls = re.findall(r'custom_call @(\\S+)\\(.*?name = "(\\w+)"', text)
      print(json.dumps(dict(calls=calls, legacy=text.count("triton_kernel_call"))))
  """)
  kernels = [name for target, name in found["calls"] if target.strip('"') == "__gpu$xla.gpu.triton"]
  # Per device (one tower each): conv forward ×5, data gradient ×4 (none into the images), filter gradient ×5,
  # LRN and max-pool forward and backward ×2 and ×3.
  assert sorted(kernels) == sorted(["conv_fwd_kernel"] * 5 + ["conv_dgrad_kernel"] * 4 + ["conv_wgrad_kernel"] * 5
                                   + ["lrn_fwd_kernel", "lrn_bwd_kernel"] * 2
                                   + ["max_pool_fwd_kernel", "max_pool_bwd_kernel"] * 3), found["calls"]
  assert found["legacy"] == 0


def test_kernel_ir_is_specialised_as_jax_triton_specialises_it():
  found = compiled_triton("""
      import json
      import jax.numpy as jnp
      from alexnet_jax.ops import xla_triton
      from alexnet_jax.ops.kernel import triton_kernels
      launch = triton_kernels().lrn.lrn_fwd_launch((96, 27, 27, 8), 2, 5, 2.0, 1e-4, 0.75, "bfloat16")
      text = xla_triton.ttir(launch, [jnp.bfloat16, jnp.bfloat16], 90)
      head = next(line for line in text.splitlines() if "tt.func" in line)
      try:
        xla_triton.ttir(launch, [jnp.bfloat16], 90)
        error = None
      except ValueError as e:
        error = str(e)
      print(json.dumps(dict(head=head, magic=list(xla_triton.bytecode(text)[:4]), error=error,
                            functions=text.count("tt.func"), calls=text.count("tt.call"))))
  """)
  # Only the pointers remain arguments (every tl.constexpr is fixed), each 16-byte aligned, as jax-triton assumes.
  assert "@lrn_fwd_kernel(%x_ptr: !tt.ptr<bf16> {tt.divisibility = 16 : i32}" in found["head"]
  assert "%y_ptr: !tt.ptr<bf16> {tt.divisibility = 16 : i32}" in found["head"]
  assert found["head"].count("%") == 2
  assert (found["functions"], found["calls"]) == (1, 0)  # the @triton.jit helpers inlined, as Triton's TTIR passes do
  assert bytes(found["magic"]) == b"ML\xefR"  # MLIR bytecode, what the custom call carries
  assert found["error"] == "lrn_fwd_kernel: 2 pointer arguments (x_ptr, y_ptr) for 1 operands and outputs"


def test_unknown_triton_call_is_refused():
  with pytest.raises(ValueError, match="unknown Triton call 'nvcc'"):
    ops.set_cuda_call("nvcc")
  c = paper_config()
  c.triton_call = "nvcc"
  with pytest.raises(ValueError, match="config.triton_call='nvcc' is not one of 'jax_triton', 'xla'"):
    validate(c)


def _ops(x, w, b):
  """Every kernel of ours, forward and backward, at one of AlexNet's shapes (conv2 of a tower, batch 32)."""
  def loss(x, w, b):
    y = ops.conv2d(x, w, b, stride=1, padding=2, groups=2, relu=True, backend="triton")
    y = ops.max_pool(ops.lrn(y, groups=2, backend="triton"), backend="triton")
    return jnp.sum(y.astype(jnp.float32) ** 2)

  return jax.value_and_grad(loss, (0, 1, 2))


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu" or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a CUDA GPU and TRITON_INTERPRET=0")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_xla_triton_call_computes_what_jax_triton_computes(dtype):
  rng = np.random.default_rng(0)
  x, w, b = (jnp.asarray(rng.normal(size=s), dtype) for s in [(96, 27, 27, 32), (96, 5, 5, 128), (256,)])
  results = {}
  try:
    for call in ops.CUDA_CALLS:
      ops.set_cuda_call(call)
      step = jax.jit(_ops(x, w, b))  # a new function each time: JAX's cache does not know the lowering choice
      text = step.lower(x, w, b).as_text()
      assert ("__gpu$xla.gpu.triton" in text) == (call == "xla") and ("triton_kernel_call" in text) == (call != "xla")
      results[call] = jax.tree.map(np.float64, jax.block_until_ready(step(x, w, b)))
  finally:
    ops.set_cuda_call("jax_triton")
  tolerance = 1e-5 if dtype == jnp.float32 else 1e-2  # one IR, two Triton compilers (pip's and XLA's)
  for got, want in zip(jax.tree.leaves(results["xla"]), jax.tree.leaves(results["jax_triton"])):
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * np.abs(want).max())
