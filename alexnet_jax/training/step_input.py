"""The network's input inside the jitted steps: a training batch's crops cut, flipped, colour-shifted and normalised
on the devices from the stored images, by XLA (data/device_augment.py) or by the input kernel (ops/crops.py), and
an evaluation batch's centre crops; each placed where the network's first layer reads it. `setup` is a
train.Setup."""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from alexnet_jax.data import device_augment
from alexnet_jax.network import sharding
from alexnet_jax.ops import crops as ops_crops
from alexnet_jax.ops.backend import dispatch


def placed(setup, rows: jax.Array, axes: tuple[str, ...]) -> jax.Array:
  """Per-image rows where a layer reads them: split over `axes`, replicated over the others. Where the host put
  them otherwise (config.gather_input), XLA gathers them here over 'model': images while still uint8, the fewest
  bytes they can be sent in; shifts and labels before anything combines them with the towers' work."""
  return lax.with_sharding_constraint(rows, NamedSharding(setup.mesh, P(axes)))


def model_input(setup, batch: dict, place: bool = True) -> jax.Array:
  """A training batch's network input in its compute dtype: each stored image's crop, flipped and shifted as the
  host drew them, normalised; placed where the network's first layer reads it (`place`: not under pmap, whose
  devices hold their own rows). The network's backend decides how: XLA (data/device_augment.py), or the input
  kernel (ops/crops.py), which writes the crops CHWN, as the network reads them, on each device for its rows."""
  axes = setup.plan.input_axes

  def xla(images, offsets, flips, shifts):
    crops = device_augment.crop_flip(images, offsets, flips, setup.image_size)
    # Fused into the write of the network's CHWN input (batch fastest), the crops' gather would read one byte per
    # 32-byte sector of the NHWC images; cut out first, the crops go through XLA's tiled transpose instead.
    crops = lax.optimization_barrier(crops)
    if place:
      crops, shifts = (placed(setup, x, axes) for x in (crops, shifts))
    return device_augment.normalise(crops, shifts, setup.mean, setup.std).astype(setup.net.dtype)

  def kernel(images, offsets, flips, shifts, *, mode):
    run = functools.partial(ops_crops.crops, size=setup.image_size, mean=setup.mean, std=setup.std,
                            dtype=setup.net.dtype, mode=mode)
    fields = images, offsets, flips, shifts
    manual = sharding.manual_axes(setup.mesh, mode) if place else set()
    if manual:  # each device its rows: XLA cannot split a kernel's call itself
      fields = [placed(setup, x, axes) for x in fields]
      rows = tuple(a for a in axes if a in manual) or None
      run = jax.shard_map(run, mesh=setup.mesh, axis_names=manual, in_specs=P(rows),
                          out_specs=P(None, None, None, rows))
    # NHWC, as XLA's input: the network's transpose back to CHWN (logits_fn) cancels this one.
    return jnp.transpose(run(*fields), (3, 1, 2, 0))

  with jax.named_scope("input"):
    return dispatch(setup.net.backend, xla, kernel, batch["image"], batch["offset"], batch["flip"], batch["shift"])


def eval_input(setup, images: jax.Array) -> jax.Array:
  """An evaluation batch's network input: the centre crops of the stored uint8 images (N, S, S, 3), normalised."""
  with jax.named_scope("input"):
    crops = placed(setup, device_augment.center_crop(images, setup.image_size), setup.plan.input_axes)
    return device_augment.normalise(crops, None, setup.mean, setup.std)
