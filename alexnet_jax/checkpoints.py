"""Orbax checkpoints in <workdir>/checkpoints: the train state, and the input pipeline's position (JSON: the next
batch and the data settings that give that index its meaning)."""

import os

import jax
import orbax.checkpoint as ocp


def manager(workdir: str, config) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), "checkpoints"),
      item_handlers=dict(state=ocp.StandardCheckpointHandler(), data=ocp.JsonCheckpointHandler()),
      options=ocp.CheckpointManagerOptions(max_to_keep=config.checkpoints_to_keep, create=True))


def save(mngr: ocp.CheckpointManager, step: int, state, data: dict) -> None:
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data)))


def _shapes(tree) -> dict[tuple, tuple]:
  """Leaf shapes by key path, the path spelled the same for dataclasses, dicts and sequences."""
  name = lambda k: str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))  # noqa: E731
  return {tuple(map(name, path)): tuple(x.shape) for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def restore(mngr: ocp.CheckpointManager, state) -> tuple:
  """(state, data position) of the newest checkpoint, the state laid out like `state` (same shardings);
  (`state`, None) where there is none.

  Shapes are compared with the checkpoint's metadata first, so that a checkpoint of another network is refused
  with one message, before orbax starts reading.
  """
  step = mngr.latest_step()
  if step is None:
    return state, None
  stored, wanted = _shapes(mngr.item_metadata(step)["state"]), _shapes(state)
  if stored != wanted:
    diff = sorted(set(stored.items()) ^ set(wanted.items()))[:2]
    detail = "; ".join(f"{'.'.join(k)}: checkpoint {stored.get(k)} vs config {wanted.get(k)}" for k, _ in diff)
    raise ValueError(f"the checkpoint of step {step} in {mngr.directory} does not fit this configuration "
                     f"({detail}); resume with the config it was written with, or train in a new --workdir")
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                        data=ocp.args.JsonRestore()))
  return restored["state"], restored["data"]
