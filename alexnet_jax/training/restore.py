"""States from outside the training loop: a finished run's newest checkpoint, laid out as its run.json describes it,
for what reads the run (evaluating, exporting, drawing, predicting); and the weights of a file that a new run starts
from (config.init_from)."""

import os

import jax
from jax.experimental import multihost_utils

from alexnet_jax.config import validate
from alexnet_jax.network import interchange
from alexnet_jax.training import checkpoints, run
from alexnet_jax.training.train import Setup, TrainState, make_setup, train_state_init


def run_setup(described: run.Run) -> Setup:
  """The setup of a run from its description alone (run.json): its network, classes and statistics."""
  return make_setup(described.config, len(described.classes), described.num_train, described.statistics.mean,
                    described.statistics.std, table=described.table)


def restore_newest(workdir: str, config=None) -> tuple[run.Run, Setup, TrainState]:
  """(run, setup, state) of the newest checkpoint in workdir, for what reads a finished run; `config` (the run's,
  with a reader's overrides) in place of the run's own."""
  described = run.read(workdir)
  if config is not None:
    described = run.with_overrides(described, validate(config, described.table))
  manager = checkpoints.existing(workdir, described.config)
  if manager.latest_step() is None:
    raise ValueError(f"no checkpoint in {os.path.join(workdir, 'checkpoints')}")
  setup = run_setup(described)
  abstract = train_state_init(setup).eval_shape(jax.random.key(0))  # restore lays out into its shapes and places
  state, _ = checkpoints.restore(manager, abstract)
  return described, setup, state


def weights_from(path: str, setup: Setup, params):
  """`params` (on the mesh) replaced by those of a weights file in the PyTorch/Caffe layout, placed like them; a last
  layer of another number of classes stays as `params` made it (interchange.start_from)."""
  fresh = multihost_utils.process_allgather(params, tiled=True)
  loaded = interchange.start_from(path, setup.net.table, setup.image_size, fresh)
  return jax.tree.map(lambda x, like: jax.make_array_from_callback(like.shape, like.sharding, lambda i: x[i]),
                      loaded, params)
