"""The paper's crops, flips and colour shifts on the device, over batches of the stored images (N, S, S, 3) uint8 as
the host sends them: the batched JAX twins of augment.py's numpy functions, which they equal exactly. The host draws
each image's crop, flip and colour shift (augment.py) and only decodes; the device cuts the crops out of the S×S
images, so it receives the whole stored image instead of a crop (256² against 224² pixels for the paper's net) and
the host's cores spend no time copying windows.
"""

import jax
import jax.numpy as jnp


def crop_flip(images: jax.Array, offsets: jax.Array, flips: jax.Array, size: int) -> jax.Array:
  """(N, size, size, C): image n's size×size window at offsets[n] = (top, left), mirrored where flips[n]. Offsets
  must lie in [0, S - size] (data.device_batches.check_batch sees to it: out of range, XLA would clamp them
  silently)."""

  def one(image, offset, flip):
    crop = jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (size, size, image.shape[-1]))
    return jnp.where(flip, crop[:, ::-1], crop)

  return jax.vmap(one)(images, offsets, flips)


def center_crop(images: jax.Array, size: int) -> jax.Array:
  """(N, size, size, C): each image's central window, as augment.center_crop."""
  h, w = images.shape[1:3]
  top, left = (h - size) // 2, (w - size) // 2
  return images[:, top:top + size, left:left + size]


def ten_crops(images: jax.Array, size: int) -> jax.Array:
  """(N, 10, size, size, C): top-left, top-right, bottom-left, bottom-right, centre, then the same five mirrored, as
  augment.ten_crops."""
  h, w = images.shape[1:3]
  if h < size or w < size:
    raise ValueError(f"{h}×{w} images are smaller than the {size}×{size} crop")
  corners = [(0, 0), (0, w - size), (h - size, 0), (h - size, w - size), ((h - size) // 2, (w - size) // 2)]
  crops = jnp.stack([images[:, t:t + size, s:s + size] for t, s in corners], axis=1)
  return jnp.concatenate([crops, crops[:, :, :, ::-1]], axis=1)


def normalise(images: jax.Array, shift: jax.Array | None, mean, std) -> jax.Array:
  """Float32 images from uint8 (N, …, 3), each shifted in colour by its (N, 3) shift, normalised by the dataset's
  mean and std. Done on the device: the host sends a quarter of the bytes, and its cores decode instead."""
  images = images.astype(jnp.float32) / 255
  if shift is not None:
    images = images + shift.reshape(shift.shape[0], *(1,) * (images.ndim - 2), 3)
  return (images - jnp.array(mean)) / jnp.array(std)
