"""Average and global average pooling, CHWN: the XLA references against the definition in numpy; the Triton kernels
under the interpreter, launched alone (into NaN buffers with guard cells: every element written, nothing outside) and
as ops, against the float64 references; the ops through jit, grad, vmap and shard_map with check_vma on two CPU
devices. bfloat16 is left out: the interpreter's bf16 arithmetic is broken (triton#11584)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, in case this file runs alone

import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from alexnet_jax import ops  # noqa: E402
from alexnet_jax.ops.avg_pool import (  # noqa: E402
    avg_pool, avg_pool_reference, global_avg_pool, global_avg_pool_reference)
from triton_kernels import avg_pool as kernels  # noqa: E402
from triton_kernels.interpret import run  # noqa: E402

GUARD = 64
TOL = {"float32": dict(rtol=1e-5, atol=1e-6), "float16": dict(rtol=1e-3, atol=1e-3),
       "bfloat16": dict(rtol=2.0 ** -7, atol=2.0 ** -7)}
CASES = [  # shape, size, stride, padding; ragged batches (no block holds a whole number of images)
    ((3, 13, 13, 33), 3, 2, 0),  # overlapping windows, as NiN's 3×3/2 pools
    ((5, 7, 9, 1), 3, 2, 1),  # odd sizes, N = 1, padded
    ((2, 8, 9, 130), 2, 2, 0),  # the last column lies in no window
    ((4, 6, 7, 3), 3, 1, 2),  # stride 1, padding size − 1: corner windows hold one input
    ((2, 9, 9, 5), 2, 3, 1),  # stride > size: some inputs lie in no window
]
GLOBAL_SHAPES = [(3, 6, 6, 33), (5, 13, 13, 1), (2, 1, 1, 130), (7, 5, 3, 4)]  # NiN's 6×6; 15 positions: a part chunk


def window_mean_numpy(x, size, stride, padding):
  """The definition: each window of the zero-padded map summed and divided by size², padding counted."""
  c, h, w, n = x.shape
  xp = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  oh, ow = (h + 2 * padding - size) // stride + 1, (w + 2 * padding - size) // stride + 1
  out = np.empty((c, oh, ow, n))
  for i in range(oh):
    for j in range(ow):
      out[:, i, j] = xp[:, i * stride:i * stride + size, j * stride:j * stride + size].sum(axis=(1, 2)) / size ** 2
  return out


def reference64(fn, x, dy):
  """fn's value and x-gradient for the cotangent dy, in float64."""
  with jax.enable_x64():
    y, vjp = jax.vjp(fn, jnp.asarray(x, jnp.float64))
    return np.asarray(y), np.asarray(vjp(jnp.asarray(dy, jnp.float64))[0])


def poisoned(shape, dtype):
  """A view of a NaN buffer with GUARD spare cells on each side, which `untouched` checks afterwards."""
  size = int(np.prod(shape))
  buf = np.full(size + 2 * GUARD, np.nan, dtype)
  return buf[GUARD:GUARD + size].reshape(shape), buf


def untouched(buf):
  assert np.isnan(buf[:GUARD]).all() and np.isnan(buf[-GUARD:]).all()


def launched(launch, out_shape, *inputs):
  out, buf = poisoned(out_shape, inputs[0].dtype)
  run(launch, *inputs, out)
  untouched(buf)
  assert not np.isnan(out).any()
  return out


def close(got, want, dtype):
  tol = TOL[dtype]
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol["rtol"],
                             atol=tol["atol"] * max(1.0, float(np.abs(want).max())))


def assert_float64_close(make, x, y, g, dtype):
  """y and g, the op's value and gradient of `make(backend)` at x, against the XLA reference's in float64."""
  with jax.enable_x64():
    x64 = jnp.asarray(x, jnp.float64)
    want_y = np.asarray(make("xla")(x64))
    want_g = np.asarray(jax.grad(functools.partial(loss, make("xla")))(x64))
  close(y, want_y, dtype)
  close(g, want_g, dtype)


@pytest.mark.parametrize("shape,size,stride,padding", CASES)
def test_references_are_the_definition(shape, size, stride, padding):
  x = np.random.default_rng(sum(shape)).normal(size=shape)
  with jax.enable_x64():
    got = avg_pool_reference(jnp.asarray(x), size=size, stride=stride, padding=padding)
    np.testing.assert_allclose(got, window_mean_numpy(x, size, stride, padding), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(global_avg_pool_reference(jnp.asarray(x)), x.mean(axis=(1, 2)), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,size,stride,padding", CASES)
def test_avg_pool_kernels_match_the_float64_reference(shape, size, stride, padding, dtype):
  rng = np.random.default_rng(sum(shape) + size)
  x = rng.normal(size=shape).astype(dtype)
  pooled = kernels.pooled_shape(shape, size, stride, padding)
  dy = rng.normal(size=pooled).astype(dtype)
  want_y, want_dx = reference64(functools.partial(avg_pool_reference, size=size, stride=stride, padding=padding),
                                x, dy)
  y = launched(kernels.avg_pool_fwd_launch(shape, size, stride, padding, dtype), pooled, x)
  dx = launched(kernels.avg_pool_bwd_launch(shape, size, stride, padding, dtype), shape, dy)
  close(y, want_y, dtype)
  close(dx, want_dx, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", GLOBAL_SHAPES)
def test_global_avg_pool_kernels_match_the_float64_reference(shape, dtype):
  rng = np.random.default_rng(sum(shape))
  x = rng.normal(size=shape).astype(dtype)
  dy = rng.normal(size=(shape[0], shape[3])).astype(dtype)
  want_y, want_dx = reference64(global_avg_pool_reference, x, dy)
  y = launched(kernels.global_avg_pool_fwd_launch(shape, dtype), dy.shape, x)
  dx = launched(kernels.global_avg_pool_bwd_launch(shape, dtype), shape, dy)
  close(y, want_y, dtype)
  close(dx, want_dx, dtype)


def test_float16_sums_are_float32_inside_the_kernels():
  # 2048 then ones: a float16 running sum stays at 2048 (its spacing there is 2), a float32 one counts every 1.
  x = np.ones((1, 13, 13, 2), np.float16)
  x[0, 0, 0] = 2048
  y = launched(kernels.global_avg_pool_fwd_launch(x.shape, "float16", chunk=1), (1, 2), x)
  np.testing.assert_array_equal(y, np.float16((2048 + 168) / 169))
  y = launched(kernels.avg_pool_fwd_launch(x.shape, 3, 2, 0, "float16"), kernels.pooled_shape(x.shape, 3, 2, 0), x)
  assert y[0, 0, 0, 0] == np.float16((2048 + 8) / 9) and y[0, 0, 1, 0] == 1


LOSS_CASES = {  # name: (op(backend) -> f, x shape)
    "avg_pool": (lambda be: functools.partial(avg_pool, size=3, stride=2, padding=1, backend=be), (5, 9, 7, 33)),
    "avg_pool_stride1": (lambda be: functools.partial(avg_pool, size=2, stride=1, backend=be), (3, 6, 5, 3)),
    "global_avg_pool": (lambda be: functools.partial(global_avg_pool, backend=be), (6, 6, 6, 33)),
    # NiN's tail: a 3×3/2 average pool, then the global one
    "nin_tail": (lambda be: lambda x: global_avg_pool(avg_pool(x, size=3, stride=2, backend=be), backend=be),
                 (4, 13, 13, 5)),
}


def loss(op, x):
  y = op(x).astype(jnp.float32)
  return (y * jnp.cos(jnp.arange(y.size).reshape(y.shape))).sum()  # a cotangent that is not all ones


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("backend", ["xla", "interpret"])
@pytest.mark.parametrize("name", sorted(LOSS_CASES))
def test_ops_value_and_gradient_match_float64(name, backend, dtype):
  make, shape = LOSS_CASES[name]
  x = np.random.default_rng(len(name)).normal(size=shape).astype(dtype)
  y = jax.jit(make(backend))(jnp.asarray(x))
  g = jax.jit(jax.grad(functools.partial(loss, make(backend))))(jnp.asarray(x))
  assert y.dtype == g.dtype == jnp.dtype(dtype)
  assert_float64_close(make, x, y, g, dtype)


@pytest.mark.parametrize("name", ["avg_pool", "global_avg_pool"])
def test_vmap_folds_into_the_image_axis(name):
  make, shape = LOSS_CASES[name]
  x = jnp.asarray(np.random.default_rng(1).normal(size=shape), jnp.float32)
  stacked = jnp.stack([x, 2 * x])
  got = jax.vmap(make("interpret"))(stacked)
  want = jnp.stack([make("xla")(v) for v in stacked])
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  jaxpr = str(jax.make_jaxpr(jax.vmap(make("interpret")))(stacked))
  assert "chwn_" in jaxpr and "while" not in jaxpr  # one kernel over 2·N images, not a loop over the two


def test_ops_inside_shard_map_with_check_vma():
  # Images split over two devices by their image axis N, a replicated weight after the pools: its gradient is summed
  # over the devices by the transpose of the widening the ops insert.
  mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  rng = np.random.default_rng(2)
  x, w = jnp.asarray(rng.normal(size=(4, 9, 9, 6)), jnp.float32), jnp.asarray(rng.normal(size=(4,)), jnp.float32)

  def net(backend):
    def local(x, w):
      y = avg_pool(x * w[:, None, None, None], size=3, stride=2, padding=1, backend=backend)
      y = global_avg_pool(y, backend=backend)
      return jax.lax.psum((y ** 2).sum(), "data")

    return jax.shard_map(local, mesh=mesh, in_specs=(P(None, None, None, "data"), P()), out_specs=P(),
                         check_vma=True)

  want = jax.jit(jax.value_and_grad(net("xla"), (0, 1)))(x, w)
  got = jax.jit(jax.value_and_grad(net("interpret"), (0, 1)))(x, w)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)


def test_auto_without_a_cuda_device_traces_the_reference_alone():
  make, shape = LOSS_CASES["nin_tail"]
  x = jnp.ones(shape)
  jaxprs = [str(jax.make_jaxpr(jax.grad(functools.partial(loss, make(b))))(x)) for b in ("auto", "xla")]
  assert jaxprs[0] == jaxprs[1] and "chwn_" not in jaxprs[0]


def test_exported_from_the_ops_package():
  assert ops.avg_pool is avg_pool and ops.global_avg_pool is global_avg_pool
  assert ops.avg_pool_reference is avg_pool_reference and ops.global_avg_pool_reference is global_avg_pool_reference


@pytest.mark.parametrize("call,message", [
    (lambda: avg_pool(jnp.ones((1, 5, 5, 2)), size=3, stride=2, padding=3), "0 ≤ padding < size"),
    (lambda: avg_pool(jnp.ones((1, 2, 2, 2)), size=5, stride=1, padding=1), "smaller than the 5×5 window"),
    (lambda: avg_pool(jnp.ones((1, 5, 5, 2)), size=2.0, stride=2), "must be integers"),
    (lambda: avg_pool(jnp.ones((1, 40, 40, 2)), size=17, stride=1), "a larger window is a global pool"),
    (lambda: avg_pool(jnp.ones((1, 5, 5, 2), jnp.int32), size=2, stride=2), "floating-point"),
    (lambda: global_avg_pool(jnp.ones((4, 2))), "floating-point \\(C, H, W, N\\) map"),
    (lambda: avg_pool(jnp.ones((1, 5, 5, 2)), size=2, stride=2, backend="cudnn"), "unknown kernel backend"),
    (lambda: kernels.avg_pool_fwd_launch((1, 5, 5, 2), 2, 2, 0, "float64"), "dtype float64"),
    (lambda: kernels.global_avg_pool_bwd_launch((1, 5, 5, 2), "int8"), "dtype int8"),
], ids=["padding", "small map", "float size", "window too large", "int input", "2-d input", "backend",
        "float64 launch", "int8 launch"])
def test_what_cannot_be_pooled_is_refused_in_one_line(call, message):
  with pytest.raises(ValueError, match=message) as e:
    call()
  assert "\n" not in str(e.value)


def test_triton_backend_without_a_gpu_says_so():
  with pytest.raises(ValueError, match="needs a CUDA GPU"):
    jax.jit(functools.partial(global_avg_pool, backend="triton"))(jnp.ones((2, 3, 3, 4)))


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles the kernels: needs TRITON_INTERPRET=0")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name,shape", [("avg_pool", (96, 55, 55, 128)), ("nin_tail", (384, 13, 13, 100)),
                                        ("global_avg_pool", (1000, 6, 6, 128))])  # NiN's shapes
def test_compiled_kernels_on_cuda_match_float64(name, shape, dtype):
  make, _ = LOSS_CASES[name]
  x = jax.random.normal(jax.random.key(0), shape, dtype)
  y = jax.jit(make("triton"))(x)
  g = jax.jit(jax.grad(functools.partial(loss, make("triton"))))(x)
  assert_float64_close(make, x, y, g, dtype)
