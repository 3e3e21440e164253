"""The paper's image augmentation and test-time crops, on single HWC uint8/float images (numpy, host side).

Train: shorter side resized to 256, a random 224 crop (227 for Caffe's variant), a random horizontal flip, and
"fancy PCA" colour noise: each image gets Σ_i α_i λ_i p_i added to every pixel, with α_i ~ N(0, σ = 0.1) drawn once
per image and (λ_i, p_i) the eigenvalues and eigenvectors of the RGB covariance of the training pixels.
Test: the centre crop, or the paper's 10 crops (four corners and the centre, and their mirror images), whose
softmax outputs are averaged.
"""

import numpy as np
from PIL import Image

# ImageNet's RGB pixel covariance in [0, 1] units (the values used since AlexNet's reimplementations): eigenvalues
# and, as columns, eigenvectors.
IMAGENET_EIGVAL = np.array([0.2175, 0.0188, 0.0045], np.float32)
IMAGENET_EIGVEC = np.array([[-0.5675, 0.7192, 0.4009],
                            [-0.5808, -0.0045, -0.8140],
                            [-0.5836, -0.6948, 0.4203]], np.float32)


def pca_basis(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(eigenvalues, eigenvectors as columns) of the RGB covariance of `images` (…, 3) in [0, 1], largest first."""
  pixels = np.asarray(images, np.float64).reshape(-1, 3)
  eigval, eigvec = np.linalg.eigh(np.cov(pixels, rowvar=False))
  order = np.argsort(eigval)[::-1]
  return eigval[order].astype(np.float32), eigvec[:, order].astype(np.float32)


def pca_shift(rng: np.random.Generator, eigval=IMAGENET_EIGVAL, eigvec=IMAGENET_EIGVEC,
              sigma: float = 0.1) -> np.ndarray:
  """The (3,) colour shift, in [0, 1] units, that one image gets on every pixel."""
  alpha = rng.normal(0.0, sigma, 3).astype(np.float32)
  return eigvec @ (alpha * eigval)


def resize_shorter(image: np.ndarray, size: int = 256) -> np.ndarray:
  """Scales (H, W, 3) uint8 so that its shorter side is `size`, keeping the aspect ratio (a no-op for images stored
  at that size, as `make prepare` writes them)."""
  h, w = image.shape[:2]
  if min(h, w) == size:
    return image
  scale = size / min(h, w)
  shape = (max(size, round(w * scale)), max(size, round(h * scale)))
  return np.asarray(Image.fromarray(image).resize(shape, Image.BILINEAR))


def random_crop_flip(image: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  h, w = image.shape[:2]
  if h < size or w < size:
    raise ValueError(f"a {h}×{w} image is smaller than the {size}×{size} crop")
  top, left = rng.integers(0, h - size + 1), rng.integers(0, w - size + 1)
  crop = image[top:top + size, left:left + size]
  return crop[:, ::-1] if rng.random() < 0.5 else crop


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
