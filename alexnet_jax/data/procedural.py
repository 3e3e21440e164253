"""A built-in, procedurally generated 10-class image dataset for the CPU demo: every example is drawn on demand from
(seed, split, index), so the demo trains anywhere, with no download.

The classes are the product of two independent factors, so that a model needs *both* kinds of feature that AlexNet's
two towers specialised in (grey edge/texture filters in one, colour blobs in the other):
* orientation, a luminance feature: a grey (equal-RGB) sinusoidal grating at 0 (horizontal), 36, 72, 108 or 144
  degrees anticlockwise (±6 degrees jitter), with random phase, spatial frequency, contrast and extent;
* colour, a chrominance feature: one or two blobs whose hue comes from a "warm" family (red..yellow) or a "cool" one
  (cyan..blue).
Label = 2 * orientation + colour family, so a colour-only model can reach at most ~20% and an orientation-only one
~50%. Distractors carry no label information, so neither factor is a trivial global statistic: a grey blob of random
brightness, a blob of off-family hue (green or purple), random background level, tint and luminance ramp, and
per-pixel colour noise.
"""

import functools
import operator

import numpy as np

from alexnet_jax.data.statistics import Statistics

NUM_CLASSES = 10
_ORIENTATIONS_DEG = (0, 36, 72, 108, 144)
_FAMILIES = ("warm", "cool")
CLASS_NAMES: tuple[str, ...] = tuple(f"grating_{o}deg_{f}" for o in _ORIENTATIONS_DEG for f in _FAMILIES)

# The training images' pixel statistics, which the pipeline normalises with and moves the colour noise along: measured
# once on 20,000 images (statistics.measure, seed 0, 32×32), the same at every size and seed within 0.5 %
# (tests/test_procedural.py measures fresh ones against them). Known, as ImageNet's are, so that no run renders a
# thousand images to measure them again.
STATISTICS = Statistics(
    mean=np.array([0.4999, 0.4984, 0.4998], np.float32),
    std=np.array([0.1614, 0.1583, 0.1617], np.float32),
    eigval=np.array([0.0709, 0.0042, 0.0022], np.float32),
    eigvec=np.array([[-0.5761, -0.7324, 0.3628],
                     [-0.5768, 0.0498, -0.8154],
                     [-0.5791, 0.6790, 0.4512]], np.float32))

_SPLITS = {"train": 0, "test": 1}
# Hue bands in degrees, >= 35 degrees apart, so that hue decides the family
# unambiguously but a detector must look at hue, not just "is it colourful".
_FAMILY_HUES = np.array([[0.0, 50.0], [180.0, 240.0]])      # warm, cool
_DISTRACTOR_HUES = np.array([[95.0, 145.0], [270.0, 315.0]])  # green, purple
# Blob slots, composited bottom to top: a grey distractor, an off-family
# colour distractor, then two of the class's family (the first sometimes
# absent), last so that distractors never hide the label.
_NUM_BLOBS = 4
# Uniform draws per example: 16 scalars, 9 per blob, 1 distractor hue band.
_NUM_U = 16 + 9 * _NUM_BLOBS + 1


def _lerp(u, lo, hi):
  return lo + (hi - lo) * u


def _hsv_to_rgb(h, s, v):
  """Hue in degrees, s and v in [0, 1], equal shapes -> (..., 3)."""
  k = (np.array([5.0, 3.0, 1.0]) + (h / 60.0)[..., None]) % 6.0
  return v[..., None] - (v * s)[..., None] * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)


@functools.lru_cache(maxsize=4)
def _noise_bank(size):
  # Pixel noise is pure distraction, so examples may share one fixed bank,
  # each cropping it at its own offset: ~10x cheaper than fresh draws.
  bank = np.random.default_rng(0x5EED).random((2 * size, 2 * size, 3), dtype=np.float32)
  bank.flags.writeable = False
  return bank


def _gauss(centre, sigma, c):
  """Centres and widths of any equal shape over pixel coordinates c -> (..., len(c))."""
  return np.exp(-0.5 * np.square((c - centre[..., None]) / sigma[..., None]))


def generate(seed: int, split: str, start: int, count: int, image_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Examples start..start+count-1 of `split` ('train' or 'test').

  Returns images float32 (count, H, W, 3) NHWC in [0, 1] and labels int32
  (count,). Example i depends only on (seed, split, i), whatever start and
  count it is asked with, and the two splits never share an example.
  """
  if split not in _SPLITS:
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  seed, start, count, size = (operator.index(v) for v in (seed, start, count, image_size))
  if size < 32:
    raise ValueError(f"image_size must be >= 32, got {size}")
  if count < 0:
    raise ValueError(f"count must be >= 0, got {count}")
  if start < 0:
    raise ValueError(f"start must be >= 0, got {start}")
  if seed < 0:
    raise ValueError(f"seed must be >= 0, got {seed}")

  # One generator per example is what makes example i independent of
  # start/count; it draws only a few scalars, the pixel work is batched.
  u = np.empty((count, _NUM_U))
  offsets = np.empty((count, 2), np.int64)
  for n in range(count):
    rng = np.random.default_rng([seed, _SPLITS[split], start + n])
    u[n] = rng.random(_NUM_U)
    offsets[n] = rng.integers(0, size, 2)
  labels = np.minimum(u[:, 0] * NUM_CLASSES, NUM_CLASSES - 1).astype(np.int32)
  orient, family = np.divmod(labels, len(_FAMILIES))

  theta = np.deg2rad(np.array(_ORIENTATIONS_DEG)[orient] + _lerp(u[:, 1], -6.0, 6.0))
  # Frequency in cycles per image, so an example looks alike at any size;
  # 9 cycles still leaves ~3.5 px per period at the smallest size (32).
  k = np.pi * _lerp(u[:, 2], 4.0, 9.0)  # radians per unit, the image spans 2 units
  phase = _lerp(u[:, 3], 0.0, 2.0 * np.pi)
  contrast = _lerp(u[:, 4], 0.10, 0.30)
  # A third of the gratings fill the image, the rest a soft random patch,
  # so orientation has to be found locally, not only over the whole frame.
  win_sigma = np.where(u[:, 5] < 0.35, np.inf, _lerp(u[:, 8], 0.3, 0.6))
  win_x, win_y = _lerp(u[:, 6], -0.5, 0.5), _lerp(u[:, 7], -0.5, 0.5)
  noise_amp = _lerp(u[:, 9], 0.02, 0.10)
  background = _lerp(u[:, 10], 0.3, 0.7) - 0.5 * noise_amp  # centres the noise
  tint = _lerp(u[:, 11:14], -0.04, 0.04)
  ramp = _lerp(u[:, 14:16], -0.1, 0.1)

  b = u[:, 16:16 + 9 * _NUM_BLOBS].reshape(count, 9, _NUM_BLOBS)
  family_band = _FAMILY_HUES[family]
  hue = _lerp(b[:, 0], family_band[:, :1], family_band[:, 1:])
  distractor_band = _DISTRACTOR_HUES[(u[:, -1] < 0.5).astype(int)]
  hue[:, 1] = _lerp(b[:, 0, 1], distractor_band[:, 0], distractor_band[:, 1])
  sat = _lerp(b[:, 1], 0.55, 1.0)
  sat[:, 0] = 0.0  # the grey distractor
  val = _lerp(b[:, 2], 0.45, 1.0)
  val[:, 0] = _lerp(b[:, 2, 0], 0.1, 0.9)
  present = b[:, 3] < np.array([0.7, 0.5, 0.5, 1.0])
  blob_alpha = _lerp(b[:, 4], 0.75, 1.0) * present
  blob_x, blob_y = _lerp(b[:, 5], -0.8, 0.8), _lerp(b[:, 6], -0.8, 0.8)
  blob_sx = _lerp(b[:, 7], 0.08, 0.2)
  blob_sy = blob_sx * _lerp(b[:, 8], 0.8, 1.25)
  blob_rgb = _hsv_to_rgb(hue, sat, val)  # (N, blobs, 3)

  # Everything the pixels need, as separable (N, H) and (N, W) factors.
  f32 = lambda a: np.asarray(a, np.float32)
  c = (np.arange(size) + 0.5) * (2.0 / size) - 1.0  # pixel centres in [-1, 1]
  # Stripes run along (cos theta, sin theta) with y up; rows count down.
  wave_y = f32((-k * np.cos(theta))[:, None] * c)
  wave_x = f32((-k * np.sin(theta))[:, None] * c + phase[:, None])
  window_y = f32(_gauss(win_y, win_sigma, c) * contrast[:, None])
  window_x = f32(_gauss(win_x, win_sigma, c))
  ramp_y = f32(ramp[:, 1:] * c)
  ramp_x = f32(background[:, None] + ramp[:, :1] * c)
  blob_y = f32(_gauss(blob_y, blob_sy, c) * blob_alpha[..., None])
  blob_x = f32(_gauss(blob_x, blob_sx, c))
  colours = f32(np.concatenate([blob_rgb, tint[:, None], np.ones((count, 1, 3))], axis=1))

  out = _render(wave_y, wave_x, window_y, window_x, ramp_y, ramp_x, blob_y, blob_x, colours)
  bank = _noise_bank(size)
  for n, (oy, ox) in enumerate(offsets):
    out[n] += bank[oy:oy + size, ox:ox + size] * np.float32(noise_amp[n])
  return np.clip(out, 0.0, 1.0, out=out), labels


def _render(wave_y, wave_x, window_y, window_x, ramp_y, ramp_x, blob_y, blob_x, colours):
  """Pixels (n, H, W, 3) of images from their separable factors."""
  n, size = wave_y.shape
  # Luminance: windowed grating + background + ramp.
  lum = np.sin(wave_y[:, :, None] + wave_x[:, None, :])
  lum *= window_y[:, :, None]
  lum *= window_x[:, None, :]
  lum += ramp_y[:, :, None]
  lum += ramp_x[:, None, :]

  # Alpha-compositing the blobs in order is a weighted sum of the layers'
  # colours: layer j's weight is its alpha times the transparency of all
  # later layers. Doing the sum as one batched matmul that writes NHWC
  # directly avoids slow full-size broadcasts over the 3-channel axis.
  weights = np.empty((n, _NUM_BLOBS + 2, size, size), np.float32)
  clear = weights[:, -2]  # what is left uncovered: the background's weight
  for j in reversed(range(_NUM_BLOBS)):
    alpha = np.multiply(blob_y[:, j, :, None], blob_x[:, j, None, :], out=weights[:, j])
    if j == _NUM_BLOBS - 1:
      np.subtract(1.0, alpha, out=clear)
    else:
      alpha *= clear
      clear -= alpha  # clear *= 1 - a_j, as alpha now holds a_j * clear
  np.multiply(lum, clear, out=weights[:, -1])  # grey luminance, equal in R, G, B
  pixels = np.matmul(weights.reshape(n, _NUM_BLOBS + 2, size * size).transpose(0, 2, 1), colours)
  return pixels.reshape(n, size, size, 3)
