"""The paper's augmentation and test crops: shapes, bounds, geometry and the statistics of the colour noise."""

import numpy as np
import pytest

from alexnet_jax.data import augment, statistics


def test_resize_then_random_crop_and_flip_stay_inside_the_image():
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (300, 500, 3), dtype=np.uint8)
  resized = augment.resize_shorter(image, 256)
  assert resized.shape == (256, 427, 3) and resized.dtype == np.uint8
  ramp = np.broadcast_to(np.arange(427)[None, :, None], (256, 427, 3))  # a crop's columns tell where it came from
  flips = 0
  for _ in range(200):
    crop = augment.random_crop_flip(ramp, 224, rng)
    assert crop.shape == (224, 224, 3)
    step = np.diff(crop[0, :, 0])
    assert np.all(step == 1) or np.all(step == -1)
    assert 0 <= crop[0, :, 0].min() and crop[0, :, 0].max() <= 426
    flips += step[0] == -1
  assert 60 < flips < 140  # about half the crops are mirrored
  with pytest.raises(ValueError, match="smaller than"):
    augment.random_crop_flip(ramp[:100], 224, rng)


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


def test_pca_noise_shifts_colour_with_the_eigen_covariance():
  rng = np.random.default_rng(1)
  eigval, eigvec, sigma = statistics.IMAGENET.eigval, statistics.IMAGENET.eigvec, 0.1
  shifts = np.stack([augment.pca_shift(rng, eigval, eigvec, sigma) for _ in range(20000)])
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
