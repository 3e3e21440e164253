"""The training input as one kernel: each stored image's crop, mirrored, shifted in colour and normalised, written
CHWN in the network's dtype (triton_kernels/crops.py). Its XLA twin, and the reference the tests hold it to, is the
data's device augmentation (data/device_augment.py: crop_flip, then normalise), which training runs where the
kernel does not (the 'xla' backend, and any platform but CUDA under 'auto'). No gradient: nothing trains the input.
"""

import jax
import jax.numpy as jnp

from alexnet_jax.ops.kernel import KernelPrimitive, KernelSpec, triton_kernels


def _launch(images, offsets, flips, shifts, *, size, mean, std, dtype):
  return triton_kernels().crops.crops_launch(images.shape, size, mean, std, dtype)


CROPS = KernelPrimitive("chwn_training_crops", KernelSpec(
    launch=_launch,
    outputs=lambda images, *_, size, dtype, **__: [jax.ShapeDtypeStruct((3, size, size, images.shape[0]), dtype)]))


def crops(images, offsets, flips, shifts, *, size: int, mean, std, dtype, mode: str) -> jax.Array:
  """images (N, S, S, 3) uint8, offsets (N, 2) (top, left), flips (N,), shifts (N, 3) → (3, size, size, N) in
  dtype: (crop / 255 + shift − mean) / std, mirrored where flips. Offsets must lie in [0, S − size]."""
  if not 1 <= size <= min(images.shape[1:3]):  # here, not only in the launch, which the interpreter runs later
    raise ValueError(f"crops: a {size}×{size} crop does not fit {images.shape[1]}×{images.shape[2]} images")
  return CROPS(images, offsets.astype(jnp.int32), flips.astype(jnp.int8), shifts.astype(jnp.float32), mode=mode,
               size=size, mean=tuple(map(float, mean)), std=tuple(map(float, std)), dtype=jnp.dtype(dtype).name)[0]
