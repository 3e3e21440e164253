"""Tests of the built-in procedural dataset (numpy only, a few seconds)."""

import numpy as np
import pytest

from alexnet_jax.data import procedural as P
from alexnet_jax.data.sources import ProceduralSource
from alexnet_jax.data.statistics import pca_basis


def test_class_names():
  assert P.NUM_CLASSES == 10
  assert len(P.CLASS_NAMES) == P.NUM_CLASSES == len(set(P.CLASS_NAMES))
  assert P.CLASS_NAMES[0] == "grating_0deg_warm" and P.CLASS_NAMES[-1] == "grating_144deg_cool"


@pytest.mark.parametrize("size", [32, 57, 112])
def test_shapes_dtypes_range(size):
  x, y = P.generate(0, "train", 3, 11, size)
  assert x.shape == (11, size, size, 3) and x.dtype == np.float32 and x.flags.c_contiguous
  assert y.shape == (11,) and y.dtype == np.int32
  assert np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0
  assert ((0 <= y) & (y < P.NUM_CLASSES)).all()
  assert x.std() > 0.05  # not blank


def test_empty():
  x, y = P.generate(0, "test", 7, 0, 32)
  assert x.shape == (0, 32, 32, 3) and x.dtype == np.float32
  assert y.shape == (0,) and y.dtype == np.int32


def test_deterministic_and_independent_of_start_count():
  x, y = P.generate(4, "train", 0, 30, 40)
  x2, y2 = P.generate(4, "train", 0, 30, 40)
  np.testing.assert_array_equal(x, x2)
  np.testing.assert_array_equal(y, y2)
  # Windows that start, end and straddle anywhere: each example draws from its own generator.
  for start, count in [(5, 3), (7, 10), (29, 1), (13, 17)]:
    xs, ys = P.generate(4, "train", start, count, 40)
    np.testing.assert_array_equal(xs, x[start:start + count])
    np.testing.assert_array_equal(ys, y[start:start + count])


def test_splits_and_seeds_differ():
  train, _ = P.generate(0, "train", 0, 20, 32)
  test, _ = P.generate(0, "test", 0, 20, 32)
  other_seed, _ = P.generate(1, "train", 0, 20, 32)
  for other in (test, other_seed):
    # No example of one appears anywhere in the other.
    dist = np.abs(train[:, None] - other[None]).reshape(20, 20, -1).max(-1)
    assert dist.min() > 0.1


def test_labels_balanced():
  _, y = P.generate(0, "train", 0, 2000, 32)
  counts = np.bincount(y, minlength=P.NUM_CLASSES)
  assert counts.min() >= 150 and counts.max() <= 250, counts  # expect 200 +- 13


def test_the_known_statistics_hold_for_other_images_sizes_and_seeds():
  # The pipeline normalises with statistics measured once (seed 0, 32×32): they must hold for any split, size and seed.
  x, _ = P.generate(5, "test", 0, 600, 64)
  x = x.astype(np.float64)
  stats = P.STATISTICS
  assert ProceduralSource(5, "train", 64, 3000).statistics is stats
  np.testing.assert_allclose(stats.mean, x.mean((0, 1, 2)), atol=0.01)
  np.testing.assert_allclose(stats.std, x.std((0, 1, 2)), atol=0.01)
  eigval, eigvec = pca_basis(x)
  np.testing.assert_allclose(stats.eigval, eigval, rtol=0.1, atol=5e-4)
  assert abs(stats.eigvec[:, 0] @ eigvec[:, 0]) > 0.999  # the grey axis: luminance varies most
  np.testing.assert_allclose(stats.eigvec.T @ stats.eigvec, np.eye(3), atol=1e-3)


@pytest.mark.parametrize("kwargs, message", [
  (dict(split="val"), "split"),
  (dict(image_size=31), "image_size"),
  (dict(count=-1), "count"),
  (dict(start=-2), "start"),
  (dict(seed=-1), "seed"),
])
def test_bad_input(kwargs, message):
  args = dict(seed=0, split="train", start=0, count=4, image_size=32) | kwargs
  with pytest.raises(ValueError, match=message):
    P.generate(**args)


# --- learnability: hand-made grey and colour features + nearest class mean ---

def _orientation_energy(plane):
  """Fraction of mid-frequency power in a wedge around each class orientation."""
  plane = plane - plane.mean((1, 2), keepdims=True)
  power = np.abs(np.fft.fft2(plane)) ** 2
  f = np.fft.fftfreq(plane.shape[1]) * plane.shape[1]  # cycles per image
  fy, fx = np.meshgrid(f, f, indexing="ij")
  # Rows count down, so -fy is "up"; stripes at angle a have wave vector a + 90.
  wave_angle = np.degrees(np.arctan2(-fy, fx)) % 180
  band = (np.hypot(fx, fy) >= 3) & (np.hypot(fx, fy) <= 10)
  feats = []
  for stripes in (0, 36, 72, 108, 144):
    d = np.abs(wave_angle - (stripes + 90) % 180)
    wedge = band & (np.minimum(d, 180 - d) < 18)
    feats.append((power * wedge).sum((1, 2)))
  e = np.stack(feats, 1)
  return e / (e.sum(1, keepdims=True) + 1e-12)


def _hue_share(x):
  """Saturation-weighted share of warm and of cool hues among the pixels."""
  r, g, b = np.moveaxis(x, -1, 0)
  hue = np.degrees(np.arctan2(np.sqrt(3) * (g - b), 2 * r - g - b)) % 360
  w = np.maximum(x.max(-1) - x.min(-1) - 0.15, 0)
  warm, cool = (hue < 55) | (hue > 355), (hue > 175) & (hue < 245)
  tot = w.sum((1, 2)) + 1e-6
  return np.stack([(w * warm).sum((1, 2)) / tot, (w * cool).sum((1, 2)) / tot], 1)


def _ncm_accuracy(f_train, y_train, f_test, y_test):
  mu, sd = f_train.mean(0), f_train.std(0) + 1e-9
  f_train, f_test = (f_train - mu) / sd, (f_test - mu) / sd
  classes = np.unique(y_train)
  means = np.stack([f_train[y_train == c].mean(0) for c in classes])
  pred = classes[((f_test[:, None] - means[None]) ** 2).sum(-1).argmin(1)]
  return (pred == y_test).mean()


@pytest.fixture(scope="module")
def features():
  xtr, ytr = P.generate(0, "train", 0, 2000, 32)
  xte, yte = P.generate(0, "test", 0, 1000, 32)

  def f(x):
    return dict(grey=_orientation_energy(x.mean(-1)), colour=_hue_share(x),
                chroma_orient=_orientation_energy(x[..., 0] - x[..., 1]),
                global_stats=np.c_[x.mean((1, 2)), x.std((1, 2))])

  return f(xtr), ytr, f(xte), yte


def test_learnable_only_with_both_grey_and_colour(features):
  ftr, ytr, fte, yte = features

  def acc(*keys):
    return _ncm_accuracy(np.hstack([ftr[k] for k in keys]), ytr, np.hstack([fte[k] for k in keys]), yte)

  both, grey, colour = acc("grey", "colour"), acc("grey"), acc("colour")
  # Measured: both 0.997, grey 0.49 (<= 0.5 by design), colour 0.20 (<= 0.2).
  assert both > 0.9, both
  assert grey < 0.6 and colour < 0.3, (grey, colour)
  assert both - max(grey, colour) > 0.3
  # Global per-channel mean/std carry almost nothing (measured 0.11).
  assert acc("global_stats") < 0.25


def test_factors_are_grey_orientation_and_hue(features):
  ftr, ytr, fte, yte = features
  orient_tr, orient_te, fam_tr, fam_te = ytr // 2, yte // 2, ytr % 2, yte % 2
  # Measured 0.997 and 1.0 (chance 0.2 and 0.5).
  assert _ncm_accuracy(ftr["grey"], orient_tr, fte["grey"], orient_te) > 0.9
  assert _ncm_accuracy(ftr["colour"], fam_tr, fte["colour"], fam_te) > 0.95
  # The grating is equal-RGB: a chroma channel shows no orientation (chance 0.2).
  assert _ncm_accuracy(ftr["chroma_orient"], orient_tr, fte["chroma_orient"], orient_te) < 0.35
