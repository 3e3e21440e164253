"""Each op as a CPU runs it (the default backend 'auto' lowers to the XLA reference there) against a float64 numpy
reference written from the definitions, in CHWN."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from alexnet_jax import ops


def conv_numpy(x, w, b, stride, padding, groups):
  """Direct convolution, one output pixel at a time: x (C, H, W, N), w (C/G, KH, KW, F)."""
  c, h, wd, n = x.shape
  cg, kh, kw, f = w.shape
  xp = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
  out = np.zeros((f, oh, ow, n))
  fg = f // groups
  for g in range(groups):
    xs = xp[g * cg:(g + 1) * cg]
    ws = w[..., g * fg:(g + 1) * fg]
    for i in range(oh):
      for j in range(ow):
        patch = xs[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
        out[g * fg:(g + 1) * fg, i, j] = np.einsum("chwn,chwf->fn", patch, ws)
  return out + b[:, None, None, None]


def lrn_numpy(x, k, n, alpha, beta, alpha_over_n, groups):
  c = x.shape[0]
  cg = c // groups
  out = np.empty_like(x)
  scale = alpha / n if alpha_over_n else alpha
  for ch in range(c):
    g0 = (ch // cg) * cg
    lo, hi = max(g0, ch - n // 2), min(g0 + cg, ch + n // 2 + 1)
    out[ch] = x[ch] / (k + scale * (x[lo:hi] ** 2).sum(0)) ** beta
  return out


def pool_numpy(x, size, stride):
  c, h, w, n = x.shape
  oh, ow = (h - size) // stride + 1, (w - size) // stride + 1
  out = np.empty((c, oh, ow, n))
  for i in range(oh):
    for j in range(ow):
      out[:, i, j] = x[:, i * stride:i * stride + size, j * stride:j * stride + size].max(axis=(1, 2))
  return out


@pytest.mark.parametrize("c,h,w,n,f,k,stride,padding,groups", [
    (3, 23, 23, 3, 8, 11, 4, 2, 1),  # conv1's shape family, ragged batch
    (8, 9, 7, 5, 6, 5, 1, 2, 2),  # grouped (two towers), odd sizes
    (6, 7, 7, 1, 4, 3, 1, 1, 1),  # N = 1
    (4, 6, 6, 2, 4, 1, 2, 0, 2),  # 1×1, stride 2
])
def test_conv2d_matches_direct_convolution(c, h, w, n, f, k, stride, padding, groups):
  rng = np.random.default_rng(0)
  x, wt, b = rng.normal(size=(c, h, w, n)), rng.normal(size=(c // groups, k, k, f)), rng.normal(size=f)
  want = conv_numpy(x, wt, b, stride, padding, groups)
  got = ops.conv2d(jnp.float32(x), jnp.float32(wt), jnp.float32(b), stride=stride, padding=padding, groups=groups)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  relu = ops.conv2d(jnp.float32(x), jnp.float32(wt), jnp.float32(b), stride=stride, padding=padding,
                    groups=groups, relu=True)
  np.testing.assert_allclose(relu, np.maximum(want, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("alpha_over_n", [False, True])
@pytest.mark.parametrize("groups", [1, 2])
def test_lrn_matches_formula(alpha_over_n, groups):
  # Large activations so that the normaliser is far from k and a wrong window or scale shows.
  x = np.random.default_rng(1).normal(size=(12, 3, 4, 5)) * 40
  want = lrn_numpy(x, 2.0, 5, 1e-4, 0.75, alpha_over_n, groups)
  got = ops.lrn(jnp.float32(x), alpha_over_n=alpha_over_n, groups=groups)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_lrn_towers_do_not_see_each_other():
  x = np.ones((8, 1, 1, 1), np.float32) * 30
  x[4:] *= 10  # the second tower's maps are much larger
  split = ops.lrn(jnp.asarray(x), groups=2)
  np.testing.assert_allclose(split[:4], ops.lrn(jnp.asarray(x[:4])), rtol=1e-6)


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_max_pool_overlapping_windows_and_gradient(backend):
  x = np.random.default_rng(2).normal(size=(3, 13, 13, 4))
  got = ops.max_pool(jnp.float32(x), backend=backend)
  assert got.shape == (3, 6, 6, 4)
  np.testing.assert_allclose(got, pool_numpy(x, 3, 2), rtol=1e-6)
  # One large value inside four overlapping windows: its gradient is the sum of the four.
  y = np.zeros((1, 5, 5, 1), np.float32)
  y[0, 2, 2, 0] = 1.0
  grad = jax.grad(lambda v: ops.max_pool(v, backend=backend).sum())(jnp.asarray(y))
  assert float(grad[0, 2, 2, 0]) == 4.0


def test_dense():
  rng = np.random.default_rng(3)
  x, w, b = rng.normal(size=(7, 5)), rng.normal(size=(7, 3)), rng.normal(size=3)
  got = ops.dense(jnp.float32(x), jnp.float32(w), jnp.float32(b), relu=True)
  np.testing.assert_allclose(got, np.maximum(w.T @ x + b[:, None], 0), rtol=1e-5, atol=1e-5)
  # Two towers reading the same x: their outputs stacked, as one GEMM per tower gives them
  towers, b2 = rng.normal(size=(2, 7, 3)), rng.normal(size=6)
  got = ops.dense(jnp.float32(x), jnp.float32(towers), jnp.float32(b2))
  np.testing.assert_allclose(got, np.concatenate([t.T @ x for t in towers]) + b2[:, None], rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="expect 7"):
    ops.dense(jnp.float32(x[:6]), jnp.float32(towers))


def test_gradients_of_every_op():
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.normal(size=(4, 7, 7, 2)))
  w = jnp.asarray(rng.normal(size=(2, 3, 3, 4)))
  b = jnp.asarray(rng.normal(size=4))
  with jax.enable_x64():
    x, w, b = (jnp.float64(a) for a in (x, w, b))
    check_grads(lambda x, w, b: ops.conv2d(x, w, b, stride=2, padding=1, groups=2), (x, w, b), 1, modes="rev")
    check_grads(lambda x: ops.lrn(x * 30, groups=2), (x,), 1, modes="rev")
    check_grads(lambda x: ops.max_pool(x), (x,), 1, modes="rev")
    towers = jnp.float64(rng.normal(size=(2, 8, 3)))  # two towers' fc weights reading the same x
    check_grads(lambda x, w: ops.dense(x, w, relu=True), (x.reshape(8, 49), towers), 1, modes="rev")


def test_bfloat16_inputs_keep_their_dtype():
  x = jnp.ones((3, 11, 11, 2), jnp.bfloat16)
  assert ops.conv2d(x, jnp.ones((3, 3, 3, 4)), jnp.zeros(4)).dtype == jnp.bfloat16
  assert ops.lrn(x).dtype == jnp.bfloat16


def test_bad_shapes_and_backend_are_refused():
  with pytest.raises(ValueError, match="channels"):
    ops.conv2d(jnp.ones((3, 8, 8, 1)), jnp.ones((2, 3, 3, 4)))
  with pytest.raises(ValueError, match="relu must be False, True or 'left'"):
    ops.conv2d(jnp.ones((3, 8, 8, 1)), jnp.ones((3, 3, 3, 4)), relu="right")
  with pytest.raises(ValueError, match="smaller than"):
    ops.max_pool(jnp.ones((1, 2, 2, 1)))
  with pytest.raises(ValueError, match="unknown kernel backend"):
    ops.lrn(jnp.ones((4, 2, 2, 1)), backend="cudnn")
