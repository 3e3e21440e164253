"""The paper's image augmentation and test-time crops, on single HWC uint8/float images: the numpy reference that
device_augment.py's batched JAX functions equal, and the draws (crop_flip_draws, pca_shifts) that the host makes for
them, a batch at a time.

Storage: shorter side resized to 256, then the central 256×256 patch (resize_center_crop).
Train: a random 224 crop (227 for Caffe's variant), a random horizontal flip, and
"fancy PCA" colour noise: each image gets Σ_i α_i λ_i p_i added to every pixel, with α_i ~ N(0, σ = 0.1) drawn once
per image and (λ_i, p_i) the eigenvalues and eigenvectors of the RGB covariance of the training pixels.
Test: the centre crop, or the paper's 10 crops (four corners and the centre, and their mirror images), whose
softmax outputs are averaged.
"""

import numpy as np
from PIL import Image


def pca_shifts(n: int, rng: np.random.Generator, eigval: np.ndarray, eigvec: np.ndarray, sigma: float) -> np.ndarray:
  """(n, 3) float32: the colour shift, in [0, 1] units, that each of n images gets on every pixel, along a dataset's
  covariance basis (statistics.Statistics' eigval and eigvec)."""
  alpha = rng.normal(0.0, sigma, (n, 3)).astype(np.float32)
  return ((alpha * eigval) @ eigvec.T).astype(np.float32)


def resize_shorter(image: np.ndarray, size: int = 256) -> np.ndarray:
  """Scales (H, W, 3) uint8 so that its shorter side is `size`, keeping the aspect ratio (a no-op for images stored
  at that size, as `make prepare` writes them)."""
  h, w = image.shape[:2]
  if min(h, w) == size:
    return image
  scale = size / min(h, w)
  shape = (max(size, round(w * scale)), max(size, round(h * scale)))
  return np.asarray(Image.fromarray(image).resize(shape, Image.BILINEAR))


def resize_center_crop(image: np.ndarray, size: int) -> np.ndarray:
  """The paper's stored image: (H, W, 3) uint8 scaled to a shorter side of `size`, then its central size×size
  patch."""
  return center_crop(resize_shorter(image, size), size)


def crop_flip_draws(n: int, h: int, w: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """(offsets (n, 2) int32, flips (n,) bool): the (top, left) of n random size×size crops of h×w images, each
  mirrored where its flip is set: the draws alone, so that the host can send them and the device apply them
  (device_augment.crop_flip) to what was decoded."""
  if h < size or w < size:
    raise ValueError(f"a {h}×{w} image is smaller than the {size}×{size} crop")
  offsets = rng.integers(0, (h - size + 1, w - size + 1), (n, 2)).astype(np.int32)
  return offsets, rng.random(n) < 0.5


def crop_flip(image: np.ndarray, top: int, left: int, flip: bool, size: int) -> np.ndarray:
  crop = image[top:top + size, left:left + size]
  return crop[:, ::-1] if flip else crop


def center_crop(image: np.ndarray, size: int) -> np.ndarray:
  h, w = image.shape[:2]
  top, left = (h - size) // 2, (w - size) // 2
  return image[top:top + size, left:left + size]


def ten_crops(image: np.ndarray, size: int) -> np.ndarray:
  """(10, size, size, C): top-left, top-right, bottom-left, bottom-right, centre, then the same five mirrored."""
  h, w = image.shape[:2]
  if h < size or w < size:
    raise ValueError(f"a {h}×{w} image is smaller than the {size}×{size} crop")
  corners = [(0, 0), (0, w - size), (h - size, 0), (h - size, w - size), ((h - size) // 2, (w - size) // 2)]
  crops = np.stack([image[t:t + size, s:s + size] for t, s in corners])
  return np.concatenate([crops, crops[:, :, ::-1]])
