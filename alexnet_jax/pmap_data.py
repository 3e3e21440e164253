"""Data parallelism with `jax.pmap` and `lax.pmean`, beside the shard_map strategy 'data', for users who study pmap.

Every device holds the whole state (pmap's leading device axis) and takes its consecutive rows of the global batch;
each computes the loss of its rows, the gradients are averaged over the pmap axis and every device applies the same
update. The network runs all towers locally and numbers its examples by the pmap axis (model.Network's batch_axis),
so its dropout masks are those of the global batch: a step gives the numbers of train.train_step under
strategy='data' on as many devices (tests/test_strategies.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from alexnet_jax import train
from alexnet_jax.data import device_augment

AXIS = "batch"


def _stacked(devices) -> NamedSharding:
  """A leading axis of one entry per device, as pmap takes its mapped arguments."""
  return NamedSharding(Mesh(np.array(list(devices)), (AXIS,)), P(AXIS))


def replicate(state: train.TrainState, devices) -> train.TrainState:
  """The state on every device, stacked on a leading device axis (host values, or arrays of any placement)."""
  host = jax.device_get(state)
  return jax.device_put(jax.tree.map(lambda x: np.stack([x] * len(devices)), host), _stacked(devices))


def split(batch: dict, devices) -> dict:
  """A host batch as pmap takes it: (devices, rows per device, …), device d holding rows d·n … (d+1)·n − 1."""
  d = len(devices)
  stacked = {k: np.asarray(v).reshape(d, -1, *np.shape(v)[1:]) for k, v in batch.items()}
  return jax.device_put(stacked, _stacked(devices))


def train_step(setup: train.Setup, devices):
  """The pmapped step: (replicated state, split batch, key) → (replicated state, metrics summed over devices)."""
  net = setup.net.clone(tower_axis=None, batch_axis=AXIS)

  def step(state, batch, key):
    key = jax.random.fold_in(key, state.step)

    def loss_fn(params):
      crops = device_augment.crop_flip(batch["image"], batch["offset"], batch["flip"], setup.image_size)
      images = jnp.transpose(train.normalise(setup, crops, batch["shift"]), (3, 1, 2, 0))  # NHWC → CHWN
      logits = net.apply({"params": params}, images, train=True, rngs={"dropout": key})
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits

    (_, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    grads = lax.pmean(grads, AXIS)  # every device's rows weigh the same: the mean of means is the global mean
    updates, opt_state = setup.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = lax.psum(train.metrics_of(logits, batch["label"]), AXIS) | dict(learning_rate=setup.schedule(state.step))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return jax.pmap(step, axis_name=AXIS, in_axes=(0, 0, None), devices=list(devices), donate_argnums=0)
