"""The paper's augmentation and test crops: shapes, bounds, geometry and the statistics of the colour noise; the
device's crops and flips against the numpy reference."""

import jax
import numpy as np
import pytest

from alexnet_jax.data import augment, device_augment, statistics


def test_resize_then_random_crop_and_flip_stay_inside_the_image():
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (300, 500, 3), dtype=np.uint8)
  resized = augment.resize_shorter(image, 256)
  assert resized.shape == (256, 427, 3) and resized.dtype == np.uint8
  np.testing.assert_array_equal(augment.resize_center_crop(image, 256), resized[:, 85:341])  # the paper's storage
  ramp = np.broadcast_to(np.arange(427)[None, :, None], (256, 427, 3))  # a crop's columns tell where it came from
  flips = 0
  offsets, mirrored = augment.crop_flip_draws(200, 256, 427, 224, rng)
  assert offsets.dtype == np.int32 and mirrored.dtype == bool
  for (top, left), flip in zip(offsets, mirrored):
    crop = augment.crop_flip(ramp, top, left, flip, 224)
    assert crop.shape == (224, 224, 3)
    step = np.diff(crop[0, :, 0])
    assert np.all(step == 1) or np.all(step == -1)
    assert 0 <= crop[0, :, 0].min() and crop[0, :, 0].max() <= 426
    flips += step[0] == -1
  assert 60 < flips < 140  # about half the crops are mirrored
  with pytest.raises(ValueError, match="smaller than"):
    augment.crop_flip_draws(1, 100, 427, 224, rng)


def test_ten_crops_are_the_corners_the_centre_and_their_mirrors():
  image = np.arange(8 * 10).reshape(8, 10, 1)
  crops = augment.ten_crops(image, 4)
  assert crops.shape == (10, 4, 4, 1)
  np.testing.assert_array_equal(crops[0], image[:4, :4])
  np.testing.assert_array_equal(crops[1], image[:4, 6:])
  np.testing.assert_array_equal(crops[2], image[4:, :4])
  np.testing.assert_array_equal(crops[3], image[4:, 6:])
  np.testing.assert_array_equal(crops[4], image[2:6, 3:7])
  np.testing.assert_array_equal(crops[4], augment.center_crop(image, 4))
  np.testing.assert_array_equal(crops[5:], crops[:5, :, ::-1])


def test_device_crops_and_flips_equal_the_numpy_reference_for_the_same_draws():
  rng = np.random.default_rng(3)
  images = rng.integers(0, 256, (64, 40, 40, 3), dtype=np.uint8)
  offsets, flips = augment.crop_flip_draws(60, 40, 40, 32, rng)
  offsets = np.concatenate([offsets, [(0, 0), (8, 8), (0, 8), (8, 0)]]).astype(np.int32)  # the range's corners
  flips = np.concatenate([flips, [False, True, True, False]])
  draws = [(t, s, f) for (t, s), f in zip(offsets, flips)]
  assert {t for t, _, _ in draws} == set(range(9))  # every offset in range is drawn
  assert 0 < flips.sum() < len(flips)
  crops = jax.jit(device_augment.crop_flip, static_argnums=3)(images, offsets, flips, 32)
  assert crops.dtype == np.uint8
  np.testing.assert_array_equal(crops, [augment.crop_flip(x, *d, 32) for x, d in zip(images, draws)])


def test_device_centre_and_ten_crops_equal_the_numpy_reference():
  images = np.random.default_rng(4).integers(0, 256, (5, 41, 44, 3), dtype=np.uint8)  # odd margins round down
  np.testing.assert_array_equal(jax.jit(device_augment.center_crop, static_argnums=1)(images, 32),
                                [augment.center_crop(x, 32) for x in images])
  np.testing.assert_array_equal(jax.jit(device_augment.ten_crops, static_argnums=1)(images, 32),
                                [augment.ten_crops(x, 32) for x in images])
  with pytest.raises(ValueError, match="smaller than"):
    device_augment.ten_crops(images, 42)


def test_pca_noise_shifts_colour_with_the_eigen_covariance():
  rng = np.random.default_rng(1)
  eigval, eigvec, sigma = statistics.IMAGENET.eigval, statistics.IMAGENET.eigvec, 0.1
  shifts = augment.pca_shifts(20000, rng, eigval, eigvec, sigma)
  assert shifts.shape == (20000, 3) and shifts.dtype == np.float32  # one RGB shift per image
  # Zero mean and covariance P diag((σλ)²) Pᵀ: along each eigenvector p_i, independent noise of std σλ_i.
  np.testing.assert_allclose(shifts.mean(0), 0, atol=5e-4)
  np.testing.assert_allclose(np.cov(shifts, rowvar=False), eigvec @ np.diag((sigma * eigval) ** 2) @ eigvec.T,
                             atol=2e-5)
  along = shifts @ eigvec
  np.testing.assert_allclose(along.std(0), sigma * eigval, rtol=0.03)
  np.testing.assert_allclose(np.corrcoef(along, rowvar=False), np.eye(3), atol=0.03)


def test_pca_basis_from_data_recovers_the_colour_axes():
  rng = np.random.default_rng(2)
  grey = rng.normal(0, 0.2, (50000, 1)) * np.ones(3) / np.sqrt(3)  # most variance along the grey axis
  pixels = 0.5 + grey + rng.normal(0, 0.02, (50000, 3))
  eigval, eigvec = statistics.pca_basis(pixels)
  assert eigval[0] > 10 * eigval[1] and eigval[1] >= eigval[2]
  assert abs(abs(eigvec[:, 0] @ (np.ones(3) / np.sqrt(3))) - 1) < 1e-3
