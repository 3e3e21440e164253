"""The convolution kernels on the CPU interpreter against float64 numpy written from the definitions, CHWN throughout.

Outputs live inside NaN-filled buffers with guard cells on both sides: every element must be written, and nothing
outside. bfloat16 is not tested here: the interpreter's bf16 tl.dot is wrong (triton#11584).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, in case this file runs alone

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from triton_kernels import conv  # noqa: E402
from triton_kernels.interpret import run  # noqa: E402

GUARD = 64
def poisoned(shape, dtype):
  """A NaN array inside a NaN buffer with GUARD spare cells on each side, which `untouched` checks afterwards."""
  size = int(np.prod(shape))
  buf = np.full(size + 2 * GUARD, np.nan, dtype)
  return buf[GUARD:GUARD + size].reshape(shape), buf


def untouched(buf):
  assert np.isnan(buf[:GUARD]).all() and np.isnan(buf[-GUARD:]).all(), "a store landed outside the output"


TOL = {"float32": 1e-4, "float16": 1e-2}  # of the largest |reference| value

# (C, H, W, N, F, K, stride, padding, groups): ragged everywhere, since every tile edge is a mask.
SHAPES = [
    (3, 15, 18, 3, 8, 11, 4, 2, 1),  # conv1's family: C = 3, 11×11 stride 4; the last column is never read
    (8, 9, 7, 5, 12, 5, 1, 2, 2),  # 5×5 pad 2, two towers, odd H ≠ W
    (3, 7, 9, 1, 8, 3, 1, 1, 1),  # 3×3 pad 1, C = 3, N = 1
    (20, 5, 5, 33, 24, 1, 1, 0, 2),  # 1×1, N = 33
    (6, 5, 6, 130, 4, 3, 2, 1, 1),  # N = 130 spans two column tiles at one pixel; stride 2
    (34, 4, 5, 2, 136, 2, 3, 0, 1),  # 136 filters: two filter tiles; C not a multiple of the K step; stride 3
    # 32 channels and 32 filters a group, multiples of the forward's and the data gradient's K steps: each step
    # within one (kh, kw)
    (64, 5, 6, 3, 64, 3, 1, 1, 2),  # 3×3 pad 1, two groups
    (32, 7, 7, 2, 32, 3, 2, 1, 1),  # stride 2
]


def geometry(x, w, stride, padding):
  (_, h, wd, _), (_, kh, kw, _) = x.shape, w.shape
  return (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1


def windows(x, w, stride, padding, groups):
  """(group channels, filters, oh, ow, padded-image window) for every output pixel of every group."""
  cg, kh, kw, f = w.shape
  fg = f // groups
  oh, ow = geometry(x, w, stride, padding)
  for g in range(groups):
    for i in range(oh):
      for j in range(ow):
        yield (slice(g * cg, (g + 1) * cg), slice(g * fg, (g + 1) * fg), i, j,
               (slice(i * stride, i * stride + kh), slice(j * stride, j * stride + kw)))


def pad(x, padding):
  return np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))


def fwd_numpy(x, w, stride, padding, groups):
  xp = pad(x, padding)
  y = np.zeros((w.shape[3], *geometry(x, w, stride, padding), x.shape[3]))
  for cs, fs, i, j, (hs, ws) in windows(x, w, stride, padding, groups):
    y[fs, i, j] = np.einsum("chwn,chwf->fn", xp[cs, hs, ws], w[..., fs])
  return y


def dgrad_numpy(dy, x, w, stride, padding, groups):
  dxp = np.zeros(pad(x, padding).shape)
  for cs, fs, i, j, (hs, ws) in windows(x, w, stride, padding, groups):
    dxp[cs, hs, ws] += np.einsum("fn,chwf->chwn", dy[fs, i, j], w[..., fs])
  return dxp[:, padding:padding + x.shape[1], padding:padding + x.shape[2]]


def wgrad_numpy(dy, x, w, stride, padding, groups):
  xp = pad(x, padding)
  dw = np.zeros(w.shape)
  for cs, fs, i, j, (hs, ws) in windows(x, w, stride, padding, groups):
    dw[..., fs] += np.einsum("chwn,fn->chwf", xp[cs, hs, ws], dy[fs, i, j])
  return dw


def operands(shape, dtype, seed=0):
  """x, w and dy in dtype (the reference takes these values to float64) and a float32 bias."""
  c, h, wd, n, f, k, stride, padding, groups = shape
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(c, h, wd, n)).astype(dtype)
  w = rng.normal(size=(c // groups, k, k, f)).astype(dtype)
  dy = rng.normal(size=(f, *geometry(x, w, stride, padding), n)).astype(dtype)
  b = rng.normal(size=f).astype(np.float32)
  return x, w, dy, b


def run_fwd(x, w, b, stride, padding, groups, relu=False, has_bias=True, images="plain", m=None):
  launch = conv.conv_fwd_launch(x.shape, w.shape, stride, padding, groups, relu, has_bias, str(x.dtype),
                                images=images)
  y, buf = poisoned((w.shape[3], *geometry(x, w, stride, padding), x.shape[3]), x.dtype)
  run(launch, x, w, b, unread(x) if m is None else m, y)
  untouched(buf)
  return y


def run_dgrad(dy, x_shape, w, stride, padding, groups, m=None):
  launch = conv.conv_dgrad_launch(x_shape, w.shape, stride, padding, groups, str(dy.dtype), masked=m is not None)
  dx, buf = poisoned(x_shape, dy.dtype)
  run(launch, dy, w, np.full(x_shape, np.nan, dy.dtype) if m is None else m, dx)  # NaN: unread without a mask
  untouched(buf)
  return dx


def run_wgrad(x, dy, w_shape, stride, padding, groups, split=None, bias=False, images="plain", m=None):
  """dw, and with `bias` (dw, db): the caller's sums of the partials. Without it the bias output stays unwritten."""
  launch = conv.conv_wgrad_launch(x.shape, w_shape, stride, padding, groups, str(x.dtype), split=split, bias=bias,
                                  images=images)
  dw, buf = poisoned((launch.constexprs["SPLIT"], *w_shape), np.float32)
  db, db_buf = poisoned((launch.constexprs["SPLIT"], w_shape[3]), np.float32)
  assert launch.grid[1] == launch.constexprs["SPLIT"]
  with np.errstate(invalid="ignore"):
    run(launch, x, dy, unread(x) if m is None else m, dw, db)
  untouched(buf)
  untouched(db_buf)
  if not bias:
    assert np.isnan(db).all(), "the bias partials were written without bias"
  return (dw.sum(0), db.sum(0)) if bias else dw.sum(0)


def unread(x):
  """The mask source of a kernel that reads none: NaN, which a kernel that read it would turn into zeros."""
  return np.full(x.shape, np.nan, x.dtype)


def assert_close(got, want, dtype):
  assert got.shape == want.shape
  assert np.isfinite(got).all(), "an output element was left unwritten (still NaN)"
  err = np.abs(got.astype(np.float64) - want).max()
  assert err <= TOL[dtype] * np.abs(want).max(), f"max error {err} against max |ref| {np.abs(want).max()}"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[",".join(map(str, s)) for s in SHAPES])
def test_fwd_dgrad_wgrad_match_direct_convolution(shape, dtype):
  *_, stride, padding, groups = shape
  x, w, dy, b = operands(shape, dtype)
  x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
  want = fwd_numpy(x64, w64, stride, padding, groups) + b[:, None, None, None]
  assert_close(run_fwd(x, w, b, stride, padding, groups), want, dtype)
  assert_close(run_dgrad(dy, x.shape, w, stride, padding, groups),
               dgrad_numpy(dy64, x64, w64, stride, padding, groups), dtype)
  assert_close(run_wgrad(x, dy, w.shape, stride, padding, groups),
               wgrad_numpy(dy64, x64, w64, stride, padding, groups), dtype)


def test_bias_relu_epilogue():
  shape = (8, 9, 7, 5, 12, 5, 1, 2, 2)
  *_, stride, padding, groups = shape
  x, w, _, b = operands(shape, "float32", seed=1)
  conv_only = fwd_numpy(x.astype(np.float64), w.astype(np.float64), stride, padding, groups)
  assert_close(run_fwd(x, w, b, stride, padding, groups, relu=True),
               np.maximum(conv_only + b[:, None, None, None], 0), "float32")
  relu = run_fwd(x, w, np.full_like(b, np.nan), stride, padding, groups, relu=True, has_bias=False)
  assert_close(relu, np.maximum(conv_only, 0), "float32")  # without bias the bias pointer is never read
  assert (relu == 0).mean() > 0.3


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1], SHAPES[5], SHAPES[6], (64, 5, 5, 3, 8, 1, 1, 0, 1)],
                         ids=["conv1-like", "grouped", "two-filter-tiles", "steps-within-one-kh-kw", "rows-fill-tiles"])
def test_wgrad_sums_the_bias_gradient_from_the_same_pass(shape):
  # Where the filter's rows leave a row of the last row tile free (all but the last shape), the sums are that row's,
  # of ones; else the first row tile's programs sum their dy tiles.
  *_, stride, padding, groups = shape
  x, w, dy, _ = operands(shape, "float32", seed=4)
  rows = conv.conv_wgrad_launch(x.shape, w.shape, stride, padding, groups, "float32").constexprs["BLOCK_R"]
  assert (w[..., 0].size % rows == 0) == (shape == (64, 5, 5, 3, 8, 1, 1, 0, 1))
  dw, db = run_wgrad(x, dy, w.shape, stride, padding, groups, split=3, bias=True)
  dy64 = dy.astype(np.float64)
  assert_close(dw, wgrad_numpy(dy64, x.astype(np.float64), w.astype(np.float64), stride, padding, groups), "float32")
  assert_close(db, dy64.sum(axis=(1, 2, 3)), "float32")


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1], SHAPES[6]],
                         ids=["conv1-like", "grouped", "steps-within-one-kh-kw"])
def test_images_read_through_a_mask(shape):
  # The tangents of a ReLU's output: the forward and filter gradient read x where the mask source m is positive; the
  # data gradient writes zeros where it is not.
  *_, stride, padding, groups = shape
  x, w, dy, b = operands(shape, "float32", seed=5)
  m = np.random.default_rng(6).normal(size=x.shape).astype(np.float32)
  x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
  read = np.where(m > 0, x64, 0)
  assert_close(run_fwd(x, w, b, stride, padding, groups, images="masked", m=m),
               fwd_numpy(read, w64, stride, padding, groups) + b[:, None, None, None], "float32")
  assert_close(run_wgrad(x, dy, w.shape, stride, padding, groups, images="masked", m=m),
               wgrad_numpy(dy64, read, w64, stride, padding, groups), "float32")
  masked = run_dgrad(dy, x.shape, w, stride, padding, groups, m=m)
  assert_close(masked, np.where(m > 0, dgrad_numpy(dy64, x64, w64, stride, padding, groups), 0), "float32")
  assert (masked[m <= 0] == 0).all() and (masked[m > 0] != 0).mean() > 0.9


@pytest.mark.parametrize("split", [2, 3, 100])
def test_wgrad_split_partials_sum_to_the_gradient(split):
  shape = (6, 5, 6, 130, 4, 3, 2, 1, 1)  # 1170 columns
  *_, stride, padding, groups = shape
  x, w, dy, _ = operands(shape, "float32", seed=2)
  launch = conv.conv_wgrad_launch(x.shape, w.shape, stride, padding, groups, "float32", split=split)
  assert 1 < launch.constexprs["SPLIT"] <= split and launch.grid[1] == launch.constexprs["SPLIT"]
  assert_close(run_wgrad(x, dy, w.shape, stride, padding, groups, split=split),
               wgrad_numpy(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64), stride, padding,
                           groups), "float32")


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1], SHAPES[6]],
                         ids=["conv1-like", "grouped", "steps-within-one-kh-kw"])
def test_nan_reaches_exactly_its_receptive_field(shape):
  *_, stride, padding, groups = shape
  x, w, dy, b = operands(shape, "float32", seed=3)
  x[shape[0] - 1, 2, 3, 1] = np.nan  # in the last group's last channel
  x[0, -3, 0, 0] = np.nan  # conv1-like: also where the last tile's masked columns past the end would read
  dy[0, 1, 1, 0] = np.nan
  x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
  with np.errstate(invalid="ignore"):
    want_y = fwd_numpy(x64, w64, stride, padding, groups)
    want_dx = dgrad_numpy(dy64, x64, w64, stride, padding, groups)
    want_dw = wgrad_numpy(np.nan_to_num(dy64), x64, w64, stride, padding, groups)
  assert 0 < np.isnan(want_y).sum() < want_y.size and 0 < np.isnan(want_dx).sum() < want_dx.size
  np.testing.assert_array_equal(np.isnan(run_fwd(x, w, b, stride, padding, groups, relu=True)), np.isnan(want_y))
  np.testing.assert_array_equal(np.isnan(run_dgrad(dy, x.shape, w, stride, padding, groups)), np.isnan(want_dx))
  dw = run_wgrad(x, np.nan_to_num(dy), w.shape, stride, padding, groups)
  np.testing.assert_array_equal(np.isnan(dw), np.isnan(want_dw))


def alexnet_grouped(batch=128):
  """(x_shape, w_shape, stride, padding, groups) of each conv layer with the two towers on one device."""
  from alexnet_jax.measure.kernel_shapes import grouped_convs  # noqa: PLC0415
  from alexnet_jax.network.table import alexnet  # noqa: PLC0415

  return [(s.x, s.w, s.stride, s.padding, s.groups) for s in grouped_convs(alexnet(), 224, batch)]


ALEXNET = alexnet_grouped()


@pytest.mark.parametrize("x_shape,w_shape,stride,padding,groups", ALEXNET)
def test_launches_for_alexnet(x_shape, w_shape, stride, padding, groups):
  args = (x_shape, w_shape, stride, padding, groups)
  fwd = conv.conv_fwd_launch(*args, True, True, "bfloat16")
  dgrad = conv.conv_dgrad_launch(*args, "bfloat16")
  wgrad = conv.conv_wgrad_launch(*args, "bfloat16")
  for launch in (fwd, dgrad, wgrad):
    blocks = [v for k, v in launch.constexprs.items() if k.startswith("BLOCK_")]
    assert all(v >= 16 and v & (v - 1) == 0 for v in blocks), launch  # tl.dot's minimum, powers of two
    assert launch.grid[-1] == groups
  # The split covers the reduction once, a few thousand columns a program, none left empty.
  _, h, _, n = x_shape
  oh = (h + 2 * padding - w_shape[1]) // stride + 1
  chunk = wgrad.constexprs["SPLIT_STEPS"] * wgrad.constexprs["BLOCK_P"]
  assert (wgrad.constexprs["SPLIT"] - 1) * chunk < oh * oh * n <= wgrad.constexprs["SPLIT"] * chunk
  assert 1024 <= chunk <= 2 * conv.WGRAD_COLUMNS_PER_PROGRAM


def test_bad_shapes_are_refused():
  with pytest.raises(ValueError, match="channels"):
    conv.conv_fwd_launch((3, 8, 8, 1), (2, 3, 3, 4), 1, 0, 1, False, False, "float32")
  with pytest.raises(ValueError, match="do not fit"):
    conv.conv_dgrad_launch((3, 2, 2, 1), (3, 5, 5, 4), 1, 0, 1, "float32")
  with pytest.raises(ValueError, match="input_precision"):
    conv.conv_wgrad_launch((3, 8, 8, 1), (3, 3, 3, 4), 1, 0, 1, "float32", input_precision="fast")
  with pytest.raises(ValueError, match="read as one of"):
    conv.conv_fwd_launch((3, 8, 8, 1), (3, 3, 3, 4), 1, 0, 1, False, False, "float32", images="relu")


def test_tuned_tiles_are_valid_and_name_layers_a_device_runs():
  from alexnet_jax.measure.kernel_shapes import grouped_convs, tower_convs  # noqa: PLC0415
  from alexnet_jax.network.table import alexnet, vgg16  # noqa: PLC0415
  from triton_kernels.conv_tiles import TUNED  # noqa: PLC0415

  assert TUNED
  shapes = {n: tower_convs(alexnet(), 224, n) + grouped_convs(alexnet(), 224, n) + grouped_convs(vgg16(), 224, n)
            for n in {k[1] for k in TUNED}}
  for key, fields in TUNED.items():
    kernel, n = key[:2]
    match = [s for s in shapes[n] if conv.tile_key(kernel, s.x, s.w, s.stride, s.padding, s.groups) == key]
    assert match, f"{key} is no AlexNet or VGG-16 layer as a device runs it"
    s = match[0]
    assert conv.tiles_for(kernel, s.x, s.w, s.stride, s.padding, s.groups, "bfloat16") == conv.Tiles(*fields)
    # float32 keeps the rule of thumb: the tuned tiles may not fit its shared memory
    assert conv.tiles_for(kernel, s.x, s.w, s.stride, s.padding, s.groups, "float32") == conv.rule_of_thumb(
        kernel, s.x, s.w, s.stride, s.padding, s.groups)


def test_a_batch_not_tuned_takes_the_nearest_tuned_one():
  x, w = (256, 13, 13, 0), (256, 3, 3, 192)  # conv3 as a device of the split runs it
  layer = (256, 13, 13, 192, 3, 3, 1, 1, 1)
  tuned = {k[1]: conv.Tiles(*v) for k, v in conv.TUNED.items() if k[0] == "fwd" and k[2:] == layer}
  assert {128, 512} <= set(tuned)
  for n, want in ((2, 128), (200, 128), (256, 512), (300, 512), (100_000, max(tuned))):
    assert conv.tiles_for("fwd", x[:3] + (n,), w, 1, 1, 1, "bfloat16") == tuned[want], n


def test_a_group_count_not_tuned_takes_the_layer_s_other_entries():
  # conv2's filter gradient, the towers side by side (two groups): its own entry at 512, a tower's at 128
  x, w = (96, 27, 27, 512), (48, 5, 5, 256)
  entry = lambda n, g: conv.Tiles(*conv.TUNED["wgrad", n, 48, 27, 27, 128, 5, 5, 1, 2, g])  # noqa: E731
  assert entry(512, 2) != entry(512, 1)
  assert conv.tiles_for("wgrad", x, w, 1, 2, 2, "bfloat16") == entry(512, 2)
  assert conv.tiles_for("wgrad", x[:3] + (128,), w, 1, 2, 2, "bfloat16") == entry(128, 1)
  assert ("wgrad", 128, 48, 27, 27, 128, 5, 5, 1, 2, 2) not in conv.TUNED


# (shape, the filter gradient's programs along its columns, 64 columns a program in steps of 32)
@pytest.mark.parametrize("shape, split", [((8, 9, 7, 5, 12, 3, 1, 1, 2), 5),  # 9·7·5 = 315 columns
                                          ((64, 9, 7, 3, 64, 3, 2, 1, 2), 1)],  # 5·4·3 = 60; 32 channels a group
                         ids=["steps-across-kh-kw", "steps-within-one-kh-kw"])
@pytest.mark.parametrize("kernel", ["fwd", "dgrad", "wgrad"])
def test_other_tiles_compute_the_same_convolution(kernel, shape, split):
  *_, stride, padding, groups = shape
  x, w, dy, b = operands(shape, "float16", seed=4)
  args = (x.shape, w.shape, stride, padding, groups)
  tiles = conv.Tiles(32, 64, 16, 4, 2) if kernel != "wgrad" else conv.Tiles(32, 16, 32, 2, 2, columns=64)
  x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
  if kernel == "fwd":
    launch = conv.conv_fwd_launch(*args, False, True, "float16", tiles=tiles)
    got = np.empty((w.shape[3], *geometry(x, w, stride, padding), x.shape[3]), np.float16)
    run(launch, x, w, b, unread(x), got)
    want = fwd_numpy(x64, w64, stride, padding, groups) + b[:, None, None, None]
  elif kernel == "dgrad":
    launch = conv.conv_dgrad_launch(*args, "float16", tiles=tiles)
    got = np.empty(x.shape, np.float16)
    run(launch, dy, w, unread(x), got)
    want = dgrad_numpy(dy64, x64, w64, stride, padding, groups)
  else:
    launch = conv.conv_wgrad_launch(*args, "float16", tiles=tiles, bias=True)
    assert launch.constexprs["SPLIT"] == split
    partials = np.empty((launch.constexprs["SPLIT"], *w.shape), np.float32)
    bias_partials = np.empty((launch.constexprs["SPLIT"], w.shape[3]), np.float32)
    run(launch, x, dy, unread(x), partials, bias_partials)
    assert_close(bias_partials.sum(0), dy64.sum(axis=(1, 2, 3)), "float16")
    got, want = partials.sum(0), wgrad_numpy(dy64, x64, w64, stride, padding, groups)
  assert launch.num_warps == tiles.num_warps and launch.num_stages == 2
  assert_close(got, want, "float16")


def test_tiles_refuse_what_tl_dot_cannot_run():
  with pytest.raises(ValueError, match="powers of two"):
    conv.Tiles(48, 64, 32, 4, 3)
  with pytest.raises(ValueError, match="powers of two"):
    conv.Tiles(64, 64, 8, 4, 3)
