"""Max-pool, LRN and LRN-then-pool Triton kernels on the CPU interpreter against float64 numpy references, CHWN.

Outputs live inside NaN-filled buffers with guard cells on both sides: every element must be written, and nothing
outside. bfloat16 is left to the GPU tests: the interpreter's bf16 arithmetic is broken (triton#11584).
"""

import glob
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, in case this file runs alone

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from triton_kernels import lrn, lrn_pool, pool  # noqa: E402
from triton_kernels.interpret import run  # noqa: E402

GUARD = 64
TOL = {"float32": dict(rtol=1e-5, atol=1e-6), "float16": dict(rtol=1e-2, atol=1e-2)}
def poisoned(shape, dtype):
  """A view of a NaN (or -1) buffer with GUARD spare cells on each side, which `untouched` checks afterwards."""
  size = int(np.prod(shape))
  buf = np.full(size + 2 * GUARD, -1 if np.dtype(dtype).kind == "i" else np.nan, dtype)
  return buf[GUARD:GUARD + size].reshape(shape), buf


def untouched(buf):
  fill = buf[:1]
  for side in (buf[:GUARD], buf[-GUARD:]):
    np.testing.assert_array_equal(side, np.broadcast_to(fill, side.shape))


# ---- max-pool ----

def pool_windows(x, size, stride):
  """(C, OH, OW, SIZE·SIZE, N): each window's elements in row-major order."""
  c, h, w, n = x.shape
  oh, ow = (h - size) // stride + 1, (w - size) // stride + 1
  win = np.empty((c, oh, ow, size * size, n), x.dtype)
  for i in range(oh):
    for j in range(ow):
      win[:, i, j] = x[:, i * stride:i * stride + size, j * stride:j * stride + size].reshape(c, size * size, n)
  return win


def pool_fwd_numpy(x, size, stride):
  """Window max and the first position of it; a window with a NaN gives NaN and points at its first NaN."""
  win = pool_windows(x, size, stride)
  nan = np.isnan(win)
  idx = np.where(nan.any(3), nan.argmax(3), np.nan_to_num(win, nan=-np.inf).argmax(3))
  return win.max(3), idx


def pool_bwd_numpy(dy, idx, shape, size, stride):
  """The first-max rule: each window's whole gradient goes to the element idx names."""
  dx = np.zeros(shape)
  c, oh, ow, n = dy.shape
  cs, ns = np.arange(c)[:, None], np.arange(n)[None, :]
  for i in range(oh):
    for j in range(ow):
      kh, kw = np.divmod(idx[:, i, j], size)
      np.add.at(dx, (cs, i * stride + kh, j * stride + kw, ns), dy[:, i, j])
  return dx


def run_pool(x, size, stride):
  shape = pool.pooled_shape(x.shape, size, stride)
  (y, ybuf), (idx, ibuf) = poisoned(shape, x.dtype), poisoned(shape, np.int8)
  run(pool.max_pool_fwd_launch(x.shape, size, stride, x.dtype.name), x, y, idx)
  untouched(ybuf)
  untouched(ibuf)
  return y, idx


def run_pool_bwd(dy, idx, shape, size, stride):
  dx, buf = poisoned(shape, dy.dtype)
  run(pool.max_pool_bwd_launch(shape, size, stride, dy.dtype.name), dy, idx, dx)
  untouched(buf)
  return dx


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,size,stride", [
    ((3, 13, 13, 33), 3, 2),  # the paper's pool, ragged batch
    ((5, 7, 27, 1), 3, 2),  # N = 1, odd sizes
    ((3, 8, 9, 130), 2, 2),  # the last column lies in no window
    ((7, 9, 7, 3), 3, 1),
])
def test_max_pool_matches_numpy(shape, size, stride, dtype):
  rng = np.random.default_rng(sum(shape))
  x = np.maximum(rng.normal(size=shape), 0).astype(dtype)  # ReLU output: windows of zeros tie
  y, idx = run_pool(x, size, stride)
  want_y, want_idx = pool_fwd_numpy(x.astype(np.float64), size, stride)
  np.testing.assert_array_equal(y, want_y.astype(dtype))
  np.testing.assert_array_equal(idx, want_idx)
  dy = rng.normal(size=y.shape).astype(dtype)
  dx = run_pool_bwd(dy, idx, shape, size, stride)
  assert np.isfinite(dx).all()
  np.testing.assert_allclose(dx, pool_bwd_numpy(dy.astype(np.float64), want_idx, shape, size, stride), **TOL[dtype])


def test_max_pool_ties_go_to_the_first_maximum():
  x = np.random.default_rng(0).integers(0, 3, size=(2, 9, 9, 5)).astype(np.float32)  # three values: ties everywhere
  x[:, :3, :3] = 0  # whole windows of zeros point at their corner
  y, idx = run_pool(x, 3, 2)
  want_y, want_idx = pool_fwd_numpy(x.astype(np.float64), 3, 2)
  np.testing.assert_array_equal(idx, want_idx)
  assert (idx[:, 0, 0] == 0).all()
  dx = run_pool_bwd(np.ones_like(y), idx, x.shape, 3, 2)
  np.testing.assert_array_equal(dx, pool_bwd_numpy(np.ones(y.shape), want_idx, x.shape, 3, 2))


def test_max_pool_propagates_nan_to_exactly_its_windows():
  x = np.random.default_rng(1).normal(size=(2, 11, 11, 3)).astype(np.float32)
  x[1, 4, 6, 2] = np.nan  # in windows (1..2, 2..3): four of them
  x[0, 2, 2, 0] = x[0, 2, 3, 0] = np.nan  # two NaNs sharing windows: the first in row-major order wins
  y, idx = run_pool(x, 3, 2)
  want_y, want_idx = pool_fwd_numpy(x.astype(np.float64), 3, 2)
  expect = np.zeros(y.shape, bool)
  expect[1, 1:3, 2:4, 2] = True
  expect[0, 0:2, 0:2, 0] = True
  np.testing.assert_array_equal(np.isnan(y), expect)
  np.testing.assert_array_equal(idx, want_idx)
  assert idx[1, 1, 2, 2] == (4 - 2) * 3 + (6 - 4) and idx[0, 0, 0, 0] == 2 * 3 + 2


def test_max_pool_of_relu_pools_the_relu_and_sends_no_gradient_from_windows_without_a_positive_max():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(3, 11, 11, 5)).astype(np.float32)  # pre-activations: a ReLU's output would tie at 0
  x[0, :3, :3] = -1.0  # a window with no positive element
  x[1, 4, 6, 2] = np.nan  # NaN stays NaN and, as through XLA's ReLU, sends back nothing
  shape = pool.pooled_shape(x.shape, 3, 2)
  (y, ybuf), (idx, ibuf) = poisoned(shape, x.dtype), poisoned(shape, np.int8)
  run(pool.max_pool_fwd_launch(x.shape, 3, 2, "float32", relu=True), x, y, idx)
  untouched(ybuf)
  untouched(ibuf)
  relu = np.where(np.isnan(x), x, np.maximum(x, 0.0)).astype(np.float64)
  want_y, want_idx = pool_fwd_numpy(relu, 3, 2)
  np.testing.assert_array_equal(y, want_y.astype(np.float32))
  live = want_y > 0  # NaN > 0 is false
  assert (~live).sum() > 4 and y[0, 0, 0].max() == 0.0
  np.testing.assert_array_equal(idx, np.where(live, want_idx, -1))
  dy = rng.normal(size=shape).astype(np.float32)
  dx = run_pool_bwd(dy, idx, x.shape, 3, 2)
  want_dx = pool_bwd_numpy(dy.astype(np.float64), want_idx, x.shape, 3, 2) * (relu > 0)  # then through the ReLU
  np.testing.assert_allclose(dx, want_dx, **TOL["float32"])
  assert (dx[x <= 0] == 0).all() and dx[1, 4, 6, 2] == 0


# ---- LRN ----

def lrn_window(c, cg, size):
  """Channels in c's window, within its group."""
  g0 = c // cg * cg
  return range(max(g0, c - size // 2), min(g0 + cg, c + (size - 1) // 2 + 1))


def lrn_fwd_numpy(x, groups, size, k, alpha, beta):
  cg = x.shape[0] // groups
  scale = np.stack([k + alpha * sum(x[j] ** 2 for j in lrn_window(c, cg, size)) for c in range(x.shape[0])])
  return x * scale ** -beta, scale


def lrn_bwd_numpy(x, dy, groups, size, k, alpha, beta):
  """dx[c] = Σ_j dy[j] ∂y[j]/∂x[c], term by term from the forward window (not its mirror image)."""
  _, scale = lrn_fwd_numpy(x, groups, size, k, alpha, beta)
  cg = x.shape[0] // groups
  dx = dy * scale ** -beta
  for j in range(x.shape[0]):
    for c in lrn_window(j, cg, size):
      dx[c] = dx[c] - dy[j] * beta * x[j] * scale[j] ** (-beta - 1) * alpha * 2 * x[c]
  return dx


def run_lrn(x, dy, groups, size, k, alpha, beta, relu=False, **launch):
  launch_args = (x.shape, groups, size, k, alpha, beta, x.dtype.name, relu)
  y, ybuf = poisoned(x.shape, x.dtype)
  run(lrn.lrn_fwd_launch(*launch_args, **launch), x, y)
  dx, dbuf = poisoned(x.shape, x.dtype)
  run(lrn.lrn_bwd_launch(*launch_args, **launch), x, dy, dx)
  for buf in (ybuf, dbuf):
    untouched(buf)
  return y, dx


LRN_CASES = [  # shape, groups, size, k, alpha, beta
    ((12, 3, 4, 5), 1, 5, 2.0, 1e-4, 0.75),  # the paper's constants
    ((12, 3, 4, 5), 2, 5, 2.0, 1e-4, 0.75),  # two towers
    ((7, 3, 3, 33), 1, 4, 1.0, 2e-4, 0.75),  # even window (lopsided), C prime, ragged batch
    ((6, 3, 2, 130), 2, 5, 1.0, 1e-4 / 5, 0.5),  # a window wider than the 3-channel group, Caffe's α/n
    ((10, 1, 1, 1), 2, 3, 2.0, 3e-4, 0.75),  # one position, N = 1
    ((3, 13, 7, 3), 1, 1, 2.0, 1e-3, 0.75),  # a window of one
]


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,groups,size,k,alpha,beta", LRN_CASES)
def test_lrn_matches_numpy(shape, groups, size, k, alpha, beta, dtype, relu):
  rng = np.random.default_rng(sum(shape) + size)
  x = (rng.normal(size=shape) * 40).astype(dtype)  # large, so that the normaliser is far from k
  dy = rng.normal(size=shape).astype(dtype)
  y, dx = run_lrn(x, dy, groups, size, k, alpha, beta, relu)
  x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
  a = np.maximum(x64, 0) if relu else x64  # with relu, the LRN of ReLU(x), and its gradient through the ReLU
  want_y, _ = lrn_fwd_numpy(a, groups, size, k, alpha, beta)
  want_dx = lrn_bwd_numpy(a, dy64, groups, size, k, alpha, beta)
  want_dx = np.where(x64 > 0, want_dx, 0) if relu else want_dx
  assert np.isfinite(y).all() and np.isfinite(dx).all()
  tol = TOL[dtype]
  np.testing.assert_allclose(y, want_y, rtol=tol["rtol"], atol=tol["atol"] * np.abs(want_y).max())
  np.testing.assert_allclose(dx, want_dx, rtol=tol["rtol"], atol=tol["atol"] * np.abs(want_dx).max())


def test_lrn_large_channels_leave_no_rounding_behind():
  """A float32 running sum would keep a huge square's rounding after it left, large beside the small ones left."""
  rng = np.random.default_rng(4)
  x = (rng.normal(size=(48, 2, 2, 8)) * 0.1).astype(np.float32)
  x[::7] *= 3e3
  dy = rng.normal(size=x.shape).astype(np.float32)
  args = (1, 5, 1.0, 1e-2, 0.75)  # α large enough that the small windows' sums show in scale
  y, dx = run_lrn(x, dy, *args)
  want_y, _ = lrn_fwd_numpy(x.astype(np.float64), *args)
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-7 * np.abs(want_y).max())
  want_dx = lrn_bwd_numpy(x.astype(np.float64), dy.astype(np.float64), *args)
  np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-6 * np.abs(want_dx).max())


@pytest.mark.filterwarnings("ignore:divide by zero", "ignore:invalid value")  # 0^−β beyond the group, on purpose
def test_lrn_without_k_leaves_no_nan_from_beyond_the_group():
  """With k = 0 a window reaching past the group's first channel may hold only zeros (common after ReLU); its
  denominator 0 must not reach a gradient, since no such window exists."""
  rng = np.random.default_rng(5)
  x = (np.abs(rng.normal(size=(8, 2, 3, 4))) + 0.5).astype(np.float32)
  x[0] = x[4] = 0.0  # the first channel of each of the two groups
  dy = rng.normal(size=x.shape).astype(np.float32)
  args = (2, 5, 0.0, 1e-2, 0.75)
  y, dx = run_lrn(x, dy, *args)
  want_dx = lrn_bwd_numpy(x.astype(np.float64), dy.astype(np.float64), *args)
  assert np.isfinite(want_dx).all() and np.isfinite(dx).all()
  np.testing.assert_allclose(y, lrn_fwd_numpy(x.astype(np.float64), *args)[0], rtol=1e-5)
  np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-6 * np.abs(want_dx).max())


@pytest.mark.parametrize("size", [4, 5])
def test_lrn_backward_reference_is_the_derivative(size):
  """Central differences of the float64 forward check the analytic reference the kernel is held to."""
  rng = np.random.default_rng(size)
  x, dy = rng.normal(size=(8, 2, 1, 2)) * 40, rng.normal(size=(8, 2, 1, 2))
  args = (2, size, 1.0, 3e-4, 0.75)
  numeric = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    e = np.zeros_like(x)
    e[i] = 1e-4
    numeric[i] = ((lrn_fwd_numpy(x + e, *args)[0] - lrn_fwd_numpy(x - e, *args)[0]) * dy).sum() / 2e-4
  np.testing.assert_allclose(lrn_bwd_numpy(x, dy, *args), numeric, rtol=1e-6, atol=1e-9)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # inf · 0 in the interpreter's numpy, on purpose
@pytest.mark.parametrize("size", [4, 5])
def test_lrn_non_finite_inputs_stay_in_their_window(size):
  x = (np.random.default_rng(2).normal(size=(12, 2, 2, 3)) * 40).astype(np.float32)
  x[4, 1, 0, 2] = np.nan  # group 0 (channels 0..5)
  x[7, 0, 1, 1] = np.inf  # group 1; its window's sum is inf, so its neighbours are scaled to 0
  dy = np.random.default_rng(3).normal(size=x.shape).astype(np.float32)
  y, dx = run_lrn(x, dy, 2, size, 2.0, 1e-4, 0.75)
  hit = np.zeros(x.shape, bool)  # y[j] is NaN when 4 ∈ window(j), i.e. j ∈ [4 − (SIZE−1)//2, 4 + SIZE//2]
  hit[4 - (size - 1) // 2:min(6, 4 + size // 2 + 1), 1, 0, 2] = True
  hit[7, 0, 1, 1] = True  # inf · inf^−β
  np.testing.assert_array_equal(np.isnan(y), hit)
  neighbours = np.zeros(x.shape, bool)
  neighbours[max(6, 7 - (size - 1) // 2):7 + size // 2 + 1, 0, 1, 1] = True
  assert np.isnan(y[7, 0, 1, 1]) and (y[neighbours & ~np.isnan(y)] == 0).all()
  args = (2, size, 2.0, 1e-4, 0.75)
  with np.errstate(invalid="ignore"):
    want_y, want_scale = lrn_fwd_numpy(x.astype(np.float64), *args)
    want_dx = lrn_bwd_numpy(x.astype(np.float64), dy.astype(np.float64), *args)
  np.testing.assert_array_equal(np.isinf(want_scale), neighbours)
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6 * np.nanmax(np.abs(want_y)))
  np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-6 * np.nanmax(np.abs(want_dx)))
  assert np.isfinite(dx[:, 0, 0, 0]).all()  # positions without a non-finite input are untouched by them


def test_launch_refuses_what_the_kernels_cannot_do():
  with pytest.raises(ValueError, match="groups"):
    lrn.lrn_fwd_launch((10, 2, 2, 4), 3, 5, 2.0, 1e-4, 0.75, "float32")
  with pytest.raises(ValueError, match="size"):
    pool.max_pool_fwd_launch((1, 2, 2, 4), 3, 2, "float32")
  with pytest.raises(ValueError, match="dtype"):
    pool.max_pool_bwd_launch((1, 5, 5, 4), 3, 2, "float64")
  with pytest.raises(ValueError, match="unroll"):
    lrn.lrn_bwd_launch((10, 2, 2, 4), 2, 5, 2.0, 1e-4, 0.75, "float32", unroll=0)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_lrn_of_relu_keeps_nan_and_zeroes_negative_infinity():
  # As the conv kernel's ReLU did before the LRN took it over: NaN stays NaN, −inf becomes 0 and touches nothing.
  x = (np.random.default_rng(4).normal(size=(12, 2, 2, 3)) * 40).astype(np.float32)
  x[4, 1, 0, 2], x[8, 0, 1, 1] = np.nan, -np.inf
  dy = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)
  y, dx = run_lrn(x, dy, 2, 5, 2.0, 1e-4, 0.75, relu=True)
  a = np.maximum(x.astype(np.float64), 0)
  with np.errstate(invalid="ignore"):
    want_y, _ = lrn_fwd_numpy(a, 2, 5, 2.0, 1e-4, 0.75)
    want_dx = np.where(x > 0, lrn_bwd_numpy(a, dy.astype(np.float64), 2, 5, 2.0, 1e-4, 0.75), 0)
  assert np.isnan(y[4, 1, 0, 2]) and y[8, 0, 1, 1] == 0 and dx[4, 1, 0, 2] == 0 and dx[8, 0, 1, 1] == 0
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6 * np.nanmax(np.abs(want_y)))
  np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-6 * np.nanmax(np.abs(want_dx)))


# ---- LRN then max-pool, one kernel each way ----

def run_lrn_pool(x, dy, groups, size, k, alpha, beta, pool_size, stride, relu, **launch):
  lrn_args = (x.shape, groups, size, k, alpha, beta)
  shape = pool.pooled_shape(x.shape, pool_size, stride)
  (y, ybuf), (idx, ibuf) = poisoned(shape, x.dtype), poisoned(shape, np.int8)
  run(lrn_pool.lrn_pool_fwd_launch(*lrn_args, pool_size, stride, x.dtype.name, relu, **launch), x, y, idx)
  dx, dbuf = poisoned(x.shape, x.dtype)
  run(lrn_pool.lrn_pool_bwd_launch(*lrn_args, pool_size, stride, x.dtype.name, relu, **launch), x, dy, idx, dx)
  for buf in (ybuf, ibuf, dbuf):
    untouched(buf)
  return y, idx, dx


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,groups,size,pool_size,stride", [
    ((12, 13, 13, 5), 2, 5, 3, 2),  # the paper's layers: two towers, overlapping 3×3/2
    ((7, 9, 8, 33), 1, 4, 2, 2),  # even LRN window, C prime, ragged batch; the last column lies in no window
    ((6, 7, 9, 3), 3, 5, 3, 1),  # a window wider than the 2-channel group; stride 1
])
def test_lrn_pool_is_the_pool_of_the_lrn(shape, groups, size, pool_size, stride, dtype, relu):
  rng = np.random.default_rng(sum(shape) + size)
  x = (rng.normal(size=shape) * 40).astype(dtype)
  lrn_args = (groups, size, 2.0, 1e-4, 0.75)
  # The layers apart, as the network ran them: the LRN's output, rounded to x's dtype, is what the pool compares.
  normalised, _ = run_lrn(x, np.zeros_like(x), *lrn_args, relu)
  want_y, want_idx = run_pool(normalised, pool_size, stride)
  dy = rng.normal(size=want_y.shape).astype(dtype)
  y, idx, dx = run_lrn_pool(x, dy, *lrn_args, pool_size, stride, relu)
  np.testing.assert_array_equal(y, want_y)
  np.testing.assert_array_equal(idx, want_idx)
  # The gradient: through the pool's choices, then the LRN's (and the ReLU's), in float64.
  x64 = x.astype(np.float64)
  a = np.maximum(x64, 0) if relu else x64
  want_dx = lrn_bwd_numpy(a, pool_bwd_numpy(dy.astype(np.float64), want_idx, shape, pool_size, stride), *lrn_args)
  want_dx = np.where(x64 > 0, want_dx, 0) if relu else want_dx
  assert np.isfinite(dx).all()
  tol = TOL[dtype]
  np.testing.assert_allclose(dx, want_dx, rtol=tol["rtol"], atol=tol["atol"] * np.abs(want_dx).max())


def test_a_walk_unrolled_over_channels_computes_the_loop_s_values():
  """unroll (what tune_kernels.py times): the same values from each kernel, a group's 7 channels in chunks of 2 or 3
  walked 2 or 3 at a time, remainders included; compiled, tests/test_gpu_kernels.py compares the bits."""
  rng = np.random.default_rng(6)
  x = (rng.normal(size=(14, 9, 9, 3)) * 40).astype(np.float32)
  dy = rng.normal(size=x.shape).astype(np.float32)
  lrn_args = (2, 5, 2.0, 1e-4, 0.75)
  dp = np.ascontiguousarray(dy[:, :4, :4])  # the pooled gradient, 4×4 from 9×9
  want = (run_lrn(x, dy, *lrn_args, True, chunks=3, unroll=1)  # the loop a channel a pass, whatever the rules take
          + run_lrn_pool(x, dp, *lrn_args, 3, 2, True, chunks=3, unroll=1))
  for unroll, chunks in ((2, 3), (3, 2)):
    got = (run_lrn(x, dy, *lrn_args, True, chunks=chunks, unroll=unroll)
           + run_lrn_pool(x, dp, *lrn_args, 3, 2, True, chunks=chunks, unroll=unroll))
    for a, b in zip(got, want):
      np.testing.assert_array_equal(a, b)


def test_the_backward_launches_as_its_table_says_where_it_holds_the_layer():
  lrn_args = (5, 2.0, 1e-4, 0.75, 3, 2, "bfloat16", True)
  for (c, h, w, n, groups), tuned in lrn_pool.BWD_TUNED.items():
    got = lrn_pool.lrn_pool_bwd_launch((c, h, w, n), groups, *lrn_args).constexprs
    assert (got["BLOCK"], got["CHUNKS"], got["UNROLL"]) == tuned
  # a batch the table lacks: the rule (512 positions a program, chunks up to 2000 programs, a channel a pass)
  got = lrn_pool.lrn_pool_bwd_launch((256, 27, 27, 64), 2, *lrn_args).constexprs
  assert (got["BLOCK"], got["CHUNKS"], got["UNROLL"]) == (512, 6, 1)
  got = lrn_pool.lrn_pool_bwd_launch((256, 27, 27, 512), 2, *lrn_args, chunks=3).constexprs  # an override wins
  assert (got["BLOCK"], got["CHUNKS"], got["UNROLL"]) == (512, 3, 1)


def test_the_backward_s_table_holds_the_tuner_s_best_where_it_beat_the_rule_by_more_than_3_percent():
  # The recorded runs of scripts/dev/tune_kernels.py --kernels lrn_pool_bwd, the newest for each layer: the table
  # holds a layer's fastest launch exactly where it beat the rule's by more than 3 %.
  root = os.path.join(os.path.dirname(__file__), "..", "docs", "results")
  newest = {}
  for path in sorted(glob.glob(os.path.join(root, "tune_kernels_lrn_pool*one_h200_*.json")),
                     key=lambda path: path.rsplit("_", 2)[1]):
    with open(path) as f:
      rows = [r for r in json.load(f)["rows"] if r["kernel"] == "lrn_pool_bwd" and r.get("ms")]
    for key in {tuple(r["key"][1:]) for r in rows}:
      newest[key] = [r for r in rows if tuple(r["key"][1:]) == key]
  best = {}
  for key, rows in newest.items():
    rule, fastest = next(r for r in rows if r["rule"]), min(rows, key=lambda r: r["ms"])
    if fastest["ms"] < rule["ms"] * (1 - 0.03):
      best[key] = tuple(v for _, v in fastest["tiles"])
  assert len(newest) == 4 and best == lrn_pool.BWD_TUNED  # lrn1 at 512: the rule within 2 %


def test_lrn_pool_launch_refuses_a_window_larger_than_the_map():
  with pytest.raises(ValueError, match="pool size 3"):
    lrn_pool.lrn_pool_fwd_launch((4, 2, 5, 8), 1, 5, 2.0, 1e-4, 0.75, 3, 2, "float32")
