"""Orbax checkpoints of the train state in <workdir>/checkpoints, written every config.checkpoint_every_steps."""

import os

import jax
import orbax.checkpoint as ocp


def manager(workdir: str, config) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), "checkpoints"),
      options=ocp.CheckpointManagerOptions(max_to_keep=config.checkpoints_to_keep,
                                           save_interval_steps=config.checkpoint_every_steps, create=True))


def save(mngr: ocp.CheckpointManager, step: int, state, force: bool = False) -> None:
  mngr.save(step, args=ocp.args.StandardSave(state), force=force)


def restore(mngr: ocp.CheckpointManager, state):
  """The newest checkpoint, laid out like `state` (same shardings); `state` itself where there is none."""
  step = mngr.latest_step()
  if step is None:
    return state
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  try:
    return mngr.restore(step, args=ocp.args.StandardRestore(abstract))
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"the checkpoint of step {step} in {mngr.directory} does not fit this configuration "
                     f"({type(e).__name__}: {str(e).splitlines()[0][:300]}); resume with the config it was "
                     "written with, or train in a new --workdir") from None
