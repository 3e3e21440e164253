"""The devices' JPEG decoding on CUDA GPUs (`pytest -m gpu tests/test_gpu_decode.py`): nvImageCodec's nvJPEG into
the buffers that JAX owns, against the host's libjpeg-turbo, and a buffer never rewritten while a step still reads
it. Without a CUDA device the module is skipped."""

import io

import jax
import numpy as np
import pytest
from PIL import Image

from alexnet_jax.config import GPU_BACKENDS
from alexnet_jax.data import decode, nvdecode
from alexnet_jax.data.device_batches import BatchLayout
from alexnet_jax.network import sharding

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU")]
SIZE = 256
MAX_LEVELS = 1  # nvJPEG's IDCT against libjpeg-turbo's accurate one, in levels of 255 (nvdecode.py)


class Photos:
  """SIZE×SIZE JPEGs at quality 90 (4:2:0 chroma) of noisy colour gradients, as a store's reader gives them."""

  resize, statistics = SIZE, None

  def __init__(self, n):
    rng, self.examples = np.random.default_rng(0), []
    y, x = np.mgrid[:SIZE, :SIZE] / SIZE
    for i in range(n):
      pixels = 127 + 100 * np.sin(rng.uniform(1, 9, 3) * x[..., None] + rng.uniform(1, 9, 3) * y[..., None])
      pixels = np.clip(pixels + rng.normal(0, 12, pixels.shape), 0, 255).astype(np.uint8)
      out = io.BytesIO()
      Image.fromarray(pixels).save(out, "JPEG", quality=90)
      self.examples.append(dict(jpeg=out.getvalue(), label=i % 7))

  def __len__(self):
    return len(self.examples)

  def __getitem__(self, i):
    return self.examples[i]


@pytest.mark.parametrize("backends", GPU_BACKENDS)
def test_devices_decode_as_the_host_does_within_a_level(backends):
  n = 32 * len(jax.devices())
  photos = Photos(n + 8)
  host = decode.Decoder(photos, SIZE, threads=8)
  spread = BatchLayout(sharding.make_mesh(1, len(jax.devices())), ("data", "model")).sharding(4)
  decoder = nvdecode.DeviceDecoder(spread, n, host, 8, backends)
  for first in range(nvdecode.SLOTS + 2):  # every buffer, and again: each batch its own images
    indices = np.arange(first, first + n) % len(photos)
    batch, _ = host.jpeg_batch(indices, np.array([3], np.int32))
    images, labels, skipped = decoder(batch)
    expected, expected_labels, _ = host.batch(indices)
    assert images.sharding == spread and skipped == 0
    error = np.abs(np.asarray(images).astype(int) - expected)
    assert error.max() <= MAX_LEVELS and error[3].max() == 0, (first, error.max())  # row 3: the host's
    np.testing.assert_array_equal(labels, expected_labels)


def test_a_buffer_is_not_rewritten_before_its_copy_has_run():
  """Work queued ahead of the copies holds them back while decoding goes on, on a stream of its own: a buffer
  rewritten before its copy ran would give an earlier batch a later one's images."""
  photos = Photos(16)
  host = decode.Decoder(photos, SIZE, threads=8)
  decoder = nvdecode.DeviceDecoder(jax.sharding.SingleDeviceSharding(jax.devices()[0]), 8, host, 8)
  halves = [np.arange(8), np.arange(8, 16)]
  expected = [host.batch(h)[0] for h in halves]
  busy = jax.jit(lambda x: jax.lax.fori_loop(0, 3000, lambda _, y: jax.numpy.sin(y) * 1.0001, x))
  held_back = busy(jax.numpy.ones((4096, 4096)))  # ~a second of work in front of every copy
  arrays = [decoder(host.jpeg_batch(halves[k % 2], np.zeros(0, np.int32))[0])[0] for k in range(2 * nvdecode.SLOTS)]
  held_back.block_until_ready()
  for k, images in enumerate(arrays):
    assert np.abs(np.asarray(images).astype(int) - expected[k % 2]).max() <= MAX_LEVELS, k
