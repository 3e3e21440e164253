"""The kernels at AlexNet's shapes on a CUDA GPU (`pytest -m gpu`), against float64 XLA: alexnet_jax/kernel_checks.py,
the cases and bounds of scripts/dev/verify_kernels.py.

Each case runs compiled ('triton') and under the Triton interpreter ('interpret'), as Pallas' tests re-run in
interpret mode; the interpreter, whose bfloat16 arithmetic is broken (triton#11584) and whose tf32 is exact float32,
runs the float32 row alone. TRITON_INTERPRET, read when triton is first imported, decides which of the two a process
can run (tests/conftest.py sets it to 1 unless it is set), so on the GPU machine run both:

  TRITON_INTERPRET=0 pytest -m gpu tests/test_gpu_kernels.py
  TRITON_INTERPRET=1 GPU_TEST_BATCH=1 pytest -m gpu -n 10 tests/test_gpu_kernels.py

The interpreter takes about a millisecond per Triton op: on 2×H200's host (2026-11-30) nine interpreted cases took
under 5 minutes on 12 workers, and conv1's (224×224 images, 11×11 filters) did not finish in 3.5 minutes alone.

Without a CUDA device the module is skipped.
"""

import os
import subprocess
import sys
import textwrap

import jax
import pytest

from alexnet_jax.data import device_batches
from alexnet_jax.measure import kernel_checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = int(os.environ.get("GPU_TEST_BATCH", "128"))
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU")]


@pytest.mark.parametrize("backend", ["triton", "interpret"])
@pytest.mark.parametrize("case", kernel_checks.cases(BATCH), ids=lambda c: c.name)
def test_kernel_matches_float64_at_alexnet_shape(case, backend):
  if (backend == "interpret") != INTERPRETED:
    pytest.skip(f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')} in this process: '{backend}' needs "
                f"TRITON_INTERPRET={1 if backend == 'interpret' else 0} (set before triton is imported)")
  precisions = ("float32",) if backend == "interpret" else tuple(kernel_checks.PRECISIONS)
  rows = kernel_checks.check(case, backend, jax.random.key(0), precisions)
  bad = [f"{r['precision']}: {r['errors']} (bound {kernel_checks.BOUNDS[r['precision']]:.1e})" for r in rows
         if not r["ok"]]
  assert not bad, f"{case.name} at batch {BATCH}: " + "; ".join(bad)


@pytest.mark.skipif(INTERPRETED, reason="compiles the Triton kernels: needs TRITON_INTERPRET=0")
def test_auto_compiles_to_the_kernels_and_the_convolutions_the_table_chooses():
  # 'auto' stages kernel and reference per op (lax.platform_dependent): lowered for CUDA, no conditional may be left,
  # every op runs its kernel but the convolution directions that ops/conv_choice.py has XLA's faster, which run
  # cuDNN; 'triton' runs the kernels alone.
  import functools  # noqa: PLC0415

  from alexnet_jax.config import paper_config  # noqa: PLC0415
  from alexnet_jax.measure.kernel_shapes import grouped_convs, tower_convs  # noqa: PLC0415
  from alexnet_jax.ops.conv_choice import xla_faster  # noqa: PLC0415
  from alexnet_jax.training import train  # noqa: PLC0415

  counts, chosen = {}, 0
  for backend in ("auto", "triton"):
    config = paper_config()
    config.dataset.name, config.dtype, config.kernel_backend = "procedural", "bfloat16", backend
    config.mesh.model = min(2, jax.device_count())
    setup = train.make_setup(config, 1000, 1_281_167)
    state = train.create_train_state(setup, jax.random.key(0))
    batch = setup.batch_layout.put(device_batches.random_batch(16, 224, 1000))
    step = jax.jit(functools.partial(train.train_step, setup=setup))
    text = step.lower(state, batch, jax.random.key(1)).compile().as_text()
    counts[backend] = {op: text.count(op) for op in (" conditional(", "triton_kernel_call", "__cudnn$conv")}
    convs = (tower_convs if config.mesh.model > 1 else grouped_convs)(setup.net.table, 224, 16)
    chosen = sum(xla_faster(k, s.x, s.w, s.stride, s.padding, s.groups, "bfloat16") for s in convs
                 for k in ("fwd", "wgrad", *(("dgrad",) if s is not convs[0] else ())))
  assert counts["auto"][" conditional("] == 0 and counts["triton"]["__cudnn$conv"] == 0, counts
  assert counts["auto"]["__cudnn$conv"] == chosen, (counts, chosen)
  kernels = counts["auto"]["triton_kernel_call"], counts["triton"]["triton_kernel_call"]
  assert kernels[0] < kernels[1] if chosen else kernels[0] == kernels[1], (counts, chosen)


@pytest.mark.skipif(INTERPRETED, reason="compiles the Triton kernels: needs TRITON_INTERPRET=0")
def test_auto_runs_xla_s_convolution_for_a_direction_the_table_has_faster():
  # ZFNet's conv2 at batch 128: XLA's data gradient was measured faster than our kernel, its forward and filter
  # gradient slower. Under 'auto' the gradient runs one cuDNN convolution and fewer of our kernels than under
  # 'triton', and agrees with XLA's.
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from alexnet_jax import ops  # noqa: PLC0415
  from alexnet_jax.ops.conv_choice import xla_faster  # noqa: PLC0415

  x_shape, w_shape, geometry = (96, 54, 54, 128), (96, 5, 5, 256), dict(stride=2, padding=2)
  assert [xla_faster(k, x_shape, w_shape, 2, 2, 1, "bfloat16") for k in ("fwd", "dgrad", "wgrad")] == [
      False, True, False]
  keys = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(keys[0], x_shape, jnp.bfloat16)
  w = (jax.random.normal(keys[1], w_shape) * 0.05).astype(jnp.bfloat16)
  dy = jax.random.normal(keys[2], (256, 27, 27, 128), jnp.bfloat16)

  def grads(backend):
    return jax.jit(lambda x, w, dy: jax.vjp(lambda x, w: ops.conv2d(x, w, backend=backend, **geometry), x, w)[1](dy))

  auto, triton = (grads(b).lower(x, w, dy).compile().as_text() for b in ("auto", "triton"))
  assert auto.count("__cudnn$conv") == 1 and triton.count("__cudnn$conv") == 0
  assert 0 < auto.count("triton_kernel_call") < triton.count("triton_kernel_call")
  wide = [a.astype(jnp.float32) for a in (x, w, dy)]
  for got, want in zip(grads("auto")(x, w, dy), grads("xla")(*wide)):
    scale = float(jnp.abs(want).max())
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), atol=2e-2 * scale)


@pytest.mark.skipif(INTERPRETED, reason="stages the compiled kernels: needs TRITON_INTERPRET=0")
def test_auto_stages_the_kernel_for_cuda_and_the_reference_elsewhere():
  # With a CUDA device here one traced program serves every platform: a conditional whose CUDA branch holds the
  # kernel (forward and, in the gradient, the backward kernels) and whose other branch holds none.
  import jax.numpy as jnp  # noqa: PLC0415

  from alexnet_jax import ops  # noqa: PLC0415

  x, w, b = jnp.ones((6, 9, 9, 3)), jnp.ones((3, 5, 5, 8)), jnp.ones((8,))
  f = lambda x, w, b: ops.conv2d(x, w, b, padding=2, groups=2, relu=True, backend="auto").sum()  # noqa: E731
  jaxpr = jax.make_jaxpr(jax.grad(f, (0, 1)))(x, w, b)

  def kernels(closed):
    return {e.primitive.name for e in closed.jaxpr.eqns if e.primitive.name.startswith("chwn_")}

  staged = [[kernels(branch) for branch in e.params["branches"]] for e in jaxpr.eqns if e.primitive.name == "cond"]
  assert any({"chwn_conv_fwd"} in branches and set() in branches for branches in staged), staged
  assert any({"chwn_conv_dgrad", "chwn_conv_wgrad"} in branches and set() in branches for branches in staged), staged


@pytest.mark.skipif(INTERPRETED, reason="compiles the Triton kernels: needs TRITON_INTERPRET=0")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_training_crops_at_the_paper_s_input(dtype):
  # The input kernel against XLA's crop, flip, colour shift and normalise of 256×256 stored images: float32 to its
  # rounding, bf16 to one rounding of the same value.
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from alexnet_jax.data import device_augment  # noqa: PLC0415
  from alexnet_jax.data.statistics import IMAGENET  # noqa: PLC0415
  from alexnet_jax.ops import crops  # noqa: PLC0415

  batch = device_batches.random_batch(BATCH, 224, 1000, size=256)
  batch["shift"] = np.random.default_rng(1).normal(0, 0.1, (BATCH, 3)).astype(np.float32)
  fields = batch["image"], batch["offset"], batch["flip"], batch["shift"]
  got = jax.jit(lambda *f: crops.crops(*f, size=224, mean=IMAGENET.mean, std=IMAGENET.std, dtype=dtype,
                                       mode="triton"))(*fields)
  want = jax.jit(lambda i, o, f, s: jnp.transpose(device_augment.normalise(
      device_augment.crop_flip(i, o, f, 224), s, IMAGENET.mean, IMAGENET.std), (3, 1, 2, 0)))(*fields)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), atol=1e-5,
                             rtol=1e-6 if dtype == "float32" else 2.0 ** -8)


UNROLLED = textwrap.dedent("""
  import sys
  import jax, jax.numpy as jnp, numpy as np
  from alexnet_jax.ops.lrn import LRN_BWD, LRN_FWD
  from alexnet_jax.ops.lrn_pool import LRN_POOL_BWD, LRN_POOL_FWD

  unroll, batch = int(sys.argv[1]), int(sys.argv[2])
  kx, kd = jax.random.split(jax.random.key(0))
  x = (jax.random.normal(kx, (96, 55, 55, batch)) * 30).astype(jnp.bfloat16)
  dy = jax.random.normal(kd, x.shape, jnp.bfloat16)
  params = dict(mode="triton", groups=2, n=5, k=2.0, alpha=1e-4, beta=0.75, relu=True)
  y, idx = jax.jit(lambda x: LRN_POOL_FWD(x, size=3, stride=2, **params))(x)
  kernels = dict(
      lrn_fwd=lambda launch: LRN_FWD(x, launch=launch, **params)[0],
      lrn_bwd=lambda launch: LRN_BWD(x, dy, launch=launch, **params)[0],
      lrn_pool_fwd=lambda launch: LRN_POOL_FWD(x, size=3, stride=2, launch=launch, **params),
      lrn_pool_bwd=lambda launch: LRN_POOL_BWD(x, y, idx, size=3, stride=2, launch=launch, **params)[0])
  for name, kernel in kernels.items():
    print(name, "started", flush=True)
    got, want = (jax.block_until_ready(kernel(launch)) for launch in ((("unroll", unroll),), (("unroll", 1),)))
    same = all(np.array_equal(np.asarray(g), np.asarray(w))
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    print(name, "equal" if same else "differs", flush=True)
""")


@pytest.mark.skipif(INTERPRETED, reason="compiles the Triton kernels: needs TRITON_INTERPRET=0")
@pytest.mark.parametrize("unroll", [2, 4])
def test_lrn_walks_unrolled_over_channels_give_the_loop_s_bits(unroll):
  # The launch option tune_kernels.py times, at conv1's output (lrn1, two towers) in bf16: the same arithmetic in
  # the same order, so the same bits, each direction, alone and with the max-pool after it. In a process of its own
  # with a time limit: a kernel whose loop never ends fails by name, instead of holding the suite's worker.
  # The child takes the GPU memory it needs, beside this process's.
  env = dict(os.environ, TRITON_INTERPRET="0", XLA_PYTHON_CLIENT_PREALLOCATE="false")
  try:
    done = subprocess.run([sys.executable, "-c", UNROLLED, str(unroll), str(BATCH)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
  except subprocess.TimeoutExpired as e:
    out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
    pytest.fail(f"not finished in 240 s; the last kernel started never ended:\n{out}")
  ends = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.endswith(("equal", "differs")))
  assert ends == dict.fromkeys(("lrn_fwd", "lrn_bwd", "lrn_pool_fwd", "lrn_pool_bwd"), "equal"), (
      done.stdout[-2000:] + done.stderr[-3000:])
