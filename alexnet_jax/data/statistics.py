"""The RGB pixel statistics of a training set: the device normalises images with its mean and std, and the "fancy
PCA" colour noise moves along its covariance's eigenvectors.

A source that knows its statistics says so (`source.statistics`: tfds's imagenet2012 has ImageNet's published
values, the procedural set its own, measured once); for any other, the pipeline measures them here on a seeded
sample of its training images.
"""

import dataclasses
import logging

import numpy as np

SAMPLE_IMAGES = 1000  # how many training images estimate the statistics of a source that does not know its own
MIN_STD = 1 / 255  # a channel that varies less than one 8-bit level is normalised as if it varied that much
CHANNELS = ("red", "green", "blue")


@dataclasses.dataclass(frozen=True)
class Statistics:
  """Per-channel mean and std, and the RGB covariance's eigenvalues (largest first) and eigenvectors (as columns),
  all float32 in [0, 1] units."""

  mean: np.ndarray
  std: np.ndarray
  eigval: np.ndarray
  eigvec: np.ndarray


# ImageNet's training set: mean and std as used since the torchvision models, the covariance basis as used since
# AlexNet's reimplementations.
IMAGENET = Statistics(
    mean=np.array([0.485, 0.456, 0.406], np.float32),
    std=np.array([0.229, 0.224, 0.225], np.float32),
    eigval=np.array([0.2175, 0.0188, 0.0045], np.float32),
    eigvec=np.array([[-0.5675, 0.7192, 0.4009],
                     [-0.5808, -0.0045, -0.8140],
                     [-0.5836, -0.6948, 0.4203]], np.float32))


def measure(source, n: int = SAMPLE_IMAGES, seed: int = 0) -> Statistics:
  """The statistics of the RGB pixels of n images of `source`, picked by a seeded permutation: the same on every run,
  so a resumed run normalises exactly as before."""
  picks = np.random.default_rng(seed).permutation(len(source))[:n]
  pixels = np.concatenate([_pixels(source[int(i)]["image"]) for i in picks])
  eigval, eigvec = pca_basis(pixels)
  return Statistics(pixels.mean(0).astype(np.float32), floored(pixels.std(0)), eigval, eigvec)


def floored(std: np.ndarray) -> np.ndarray:
  """std with MIN_STD for a channel that barely varies (a blue channel always 0): dividing by its std of 0 would
  make every image NaN; divided by MIN_STD it normalises to about 0, and carries nothing, as it carries nothing."""
  std = np.asarray(std, np.float64)
  if flat := [name for name, s in zip(CHANNELS, std) if not s >= MIN_STD]:
    logging.warning("the %s channel%s of the training images %s almost constant (std below 1/255 in the sample): "
                    "normalised with std 1/255, so %s about 0 in every image", " and ".join(flat),
                    "s" * (len(flat) > 1), "are" if len(flat) > 1 else "is", "they are" if len(flat) > 1 else "it is")
  return np.maximum(std, MIN_STD).astype(np.float32)


def pca_basis(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(eigenvalues, eigenvectors as columns) of the RGB covariance of `pixels` (…, 3) in [0, 1], largest first."""
  pixels = np.asarray(pixels, np.float64).reshape(-1, 3)
  eigval, eigvec = np.linalg.eigh(np.cov(pixels, rowvar=False))
  order = np.argsort(eigval)[::-1]
  return eigval[order].astype(np.float32), eigvec[:, order].astype(np.float32)


def _pixels(image: np.ndarray, most: int = 4096) -> np.ndarray:
  """At most `most` evenly spaced pixels of one uint8 image, (P, 3) float64 in [0, 1]."""
  flat = image.reshape(-1, 3)
  return flat[:: max(1, len(flat) // most)].astype(np.float64) / 255
