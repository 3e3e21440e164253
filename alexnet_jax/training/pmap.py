"""Data parallelism with `jax.pmap` and `lax.pmean`, beside the shard_map strategy 'data', for users who study pmap
(`--config.parallel_api=pmap`, or the benchmark's IMPL:pmap systems).

Every device holds the whole state (pmap's leading device axis) and takes its consecutive rows of the global batch;
train.train_step computes the loss of its rows, averages the gradients over the pmap axis and every device applies
the same update. The network runs all towers locally and numbers its examples by the pmap axis (Network's
batch_axis), so its dropout masks are those of the global batch: a step gives the numbers of train.train_step under
strategy='data' on as many devices (tests/test_strategies.py; training in two processes, tests/test_multihost.py).

The devices are the setup's mesh, in its order; the state and batches move between the mesh's layout (where
checkpoints, evaluation and pictures hold the state, and where the input pipeline puts each batch) and pmap's without
leaving the devices: each device already holds its replica and its rows.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec as P

from alexnet_jax.ops.backend import by_platform
from alexnet_jax.training import train

AXIS = "batch"


def _per_device(mesh, fn, in_spec: P, out_spec: P):
  """fn applied by every device of the mesh to its own block of each array of a pytree, no collective (pmap's device
  d is the mesh's device d in its flat order: the spec ('data', 'model'))."""
  return jax.jit(jax.shard_map(lambda tree: jax.tree.map(fn, tree), mesh=mesh, in_specs=in_spec, out_specs=out_spec,
                               check_vma=False))


def _devices_spec(mesh) -> P:
  return P(tuple(mesh.axis_names))


def stack(mesh, state):
  """A state replicated on the mesh as pmap takes it: a leading axis of one replica per device."""
  return _per_device(mesh, lambda x: x[None], P(), _devices_spec(mesh))(state)


def unstack(mesh, stacked):
  """pmap's stacked replicas as one state replicated on the mesh (each device keeps its own replica: they are
  equal). Under several processes pmap gives each its own devices' replicas, which are made one global array
  first."""
  stacked = multihost_utils.host_local_array_to_global_array(stacked, mesh, _devices_spec(mesh))
  return _per_device(mesh, lambda x: x[0], _devices_spec(mesh), P())(stacked)


def rows(mesh, batch: dict) -> dict:
  """A batch spread over the mesh by rows (strategy 'data' places it so) as pmap takes it: (devices, rows per
  device, …)."""
  return _per_device(mesh, lambda x: x[None], _devices_spec(mesh), _devices_spec(mesh))(batch)


def train_step(setup: train.Setup):
  """train.train_step pmapped over the setup mesh's devices: (stacked state, stacked batch, key) → (stacked state,
  metrics summed over the devices, as train.train_step gives them)."""
  net = setup.net.clone(tower_axis=None, batch_axis=AXIS, plan=None)  # every device a replica: no model axis

  def forward(params, images, key, training):
    def run(backend):
      return lambda p, x, k: net.clone(backend=backend).apply({"params": p}, x, train=training, rngs={"dropout": k})

    return by_platform(net.backend, run)(params, jnp.transpose(images, (3, 1, 2, 0)), key)

  step = functools.partial(train.train_step, setup=setup, forward=forward, pmap_axis=AXIS)
  # The metrics are the same on every device (summed, or of the same step): one copy comes back, not one per device.
  return jax.pmap(step, axis_name=AXIS, in_axes=(0, 0, None), out_axes=(0, None),
                  devices=list(setup.mesh.devices.flat), donate_argnums=0)


def stepping(setup: train.Setup) -> train.Stepping:
  """The training loop's step with pmap: batches by rows stacked on the way in, the state stacked on entry and
  unstacked to be saved, evaluated or drawn."""
  pmapped, mesh = train_step(setup), setup.mesh
  return train.Stepping(lambda state, batch, key: pmapped(state, rows(mesh, batch), key),
                           functools.partial(stack, mesh), functools.partial(unstack, mesh))
