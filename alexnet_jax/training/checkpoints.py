"""Orbax checkpoints in <workdir>/checkpoints: the train state, the input pipeline's position (JSON: the next batch
and the data settings that give that index its meaning), and the run's description (run.py's run.json), so that a
checkpoint's directory says what it holds.

Every save writes a digest of the state's bits beside it (`digest`: per array, a sum and a position-weighted sum
of its elements' bits, mod 2**32), and a restore checks it: orbax's files carry no checksum of their own, and a few
flipped bytes would otherwise restore as other weights without a word. Restoring tries the newest checkpoint first
and falls back to older ones while a checkpoint cannot be read (a truncated file, a step directory emptied or left
incomplete, metadata deleted, numbers that are not those saved or not finite), warning in one line per checkpoint
passed over; nothing is deleted. Saves run in the background; a failure (a full disk) is
raised by the next save or wait as one CheckpointError.
"""

import contextlib
import errno
import logging
import os
import re
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from alexnet_jax.training import guard, workdirs

UNREADABLE_SUFFIX = ".unreadable"  # a step directory set aside: orbax only takes names of digits for steps


class CheckpointError(ValueError):
  """No checkpoint can be restored, one does not fit the configuration, or one cannot be saved."""


class _OrbaxLogs(logging.Filter):
  """Drops orbax's log records from `level` up. Orbax logs a failed background save with its traceback from each
  thread it ran in, then raises the error in the next save or wait, where it is reported in one line; and it warns
  about each file missing from a checkpoint that restore() passes over with its own line."""

  def __init__(self, level: int):
    super().__init__()
    self.level = level

  def filter(self, record):
    return not (record.levelno >= self.level and f"{os.sep}orbax{os.sep}" in record.pathname)


class _OrbaxTasks(logging.Filter):
  """Drops asyncio's "Task (or Future) exception was never retrieved" for orbax's reads and writes (the repr of a
  task's coroutine names orbax's file, a write's error its temporary directory, or the exception's traceback runs
  through orbax): the failed write such a task carries is the one that save() reports in one line."""

  def filter(self, record):
    tb = record.exc_info[2] if record.exc_info else None
    frames = [frame.f_code.co_filename for frame, _ in traceback.walk_tb(tb)]
    return not any(f"{os.sep}orbax{os.sep}" in text or ".orbax-checkpoint-tmp" in text
                   for text in (record.getMessage(), *frames))


@contextlib.contextmanager
def _orbax_quiet(level: int):
  absl_logger = logging.getLogger("absl")
  quiet = _OrbaxLogs(level)
  absl_logger.addFilter(quiet)
  try:
    yield
  finally:
    absl_logger.removeFilter(quiet)


def _abandoned_read(unraisable) -> bool:
  """Whether an exception that Python could not raise comes from the reads or writes of a failed restore or save:
  a callback of tensorstore finding orbax's asyncio loop closed, or an orbax coroutine collected unfinished."""
  if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed":
    return True
  code = getattr(unraisable.object, "cr_code", None)
  return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


def _quiet_for_the_process() -> None:
  """Silences, for the life of the process (saves outlive any call), what orbax and tensorstore print about a
  failure that restore() or save() report themselves: orbax's logged errors, asyncio's word on orbax's failed tasks,
  and the tracebacks of the reads and writes still under way when one of them failed (_abandoned_read)."""
  absl_logger = logging.getLogger("absl")
  if not any(isinstance(f, _OrbaxLogs) and f.level == logging.ERROR for f in absl_logger.filters):
    absl_logger.addFilter(_OrbaxLogs(logging.ERROR))
  asyncio_logger = logging.getLogger("asyncio")
  if not any(isinstance(f, _OrbaxTasks) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_OrbaxTasks())
  previous = sys.unraisablehook
  if not getattr(previous, "drops_closed_loop_callbacks", False):
    def hook(unraisable):
      if not _abandoned_read(unraisable):
        previous(unraisable)
    hook.drops_closed_loop_callbacks = True
    sys.unraisablehook = hook


def manager(workdir: str, config, create: bool = True) -> ocp.CheckpointManager:
  """The checkpoints of a run; create=False for the scripts that only read one, which then create nothing."""
  _quiet_for_the_process()
  with _orbax_quiet(logging.WARNING):  # it warns of each step directory without metadata: restore() says more
    return _while_rotating(lambda: ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir), "checkpoints"),
        item_handlers=dict(state=ocp.StandardCheckpointHandler(), data=ocp.JsonCheckpointHandler(),
                           run=ocp.JsonCheckpointHandler()),
        options=ocp.CheckpointManagerOptions(max_to_keep=config.checkpoints_to_keep, create=create,
                                             read_only=not create)))


def existing(workdir: str, config) -> ocp.CheckpointManager:
  """The checkpoints of a run that exists: a CheckpointError if `workdir` holds none."""
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    what = "does not exist" if not os.path.isdir(workdir) else "has no checkpoints"
    raise CheckpointError(f"--workdir {workdir} {what}: pass the workdir of a training run")
  return manager(workdir, config, create=False)


@contextlib.contextmanager
def _saving(mngr: ocp.CheckpointManager):
  try:
    yield
  except CheckpointError:
    raise
  except Exception as e:  # orbax and tensorstore raise a ValueError, or a bare Exception, for one full disk
    raise CheckpointError(f"cannot save a checkpoint in {mngr.directory}: {_reason(e)}; {_remedy(e)}") from None


def _remedy(e: BaseException) -> str:
  """What to do about a failed save, by its cause: only a full disk is helped by freeing space."""
  again = "then rerun the same command to resume from the last checkpoint"
  code = _errno(e)
  if code in workdirs.FULL:
    return f"free space, {again}"
  if code == errno.ENOENT:
    return f"a file of the checkpoint went while it was written (another process removing it?): stop that, {again}"
  if code in (errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS):
    return f"make that path a writable directory, {again}"
  return again


def _errno(e: BaseException) -> int | None:
  """The errno of the innermost OSError in e's chain, or of the os_error_code that tensorstore puts in its text."""
  while e is not None:
    if isinstance(e, OSError) and e.errno:
      return e.errno
    if m := re.search(r"os_error_code='?(\d+)", str(e)):
      return int(m.group(1))
    e = e.__cause__ or e.__context__
  return None


DIGEST = "state_digest"  # the key of the digest in a checkpoint's data item


def save(mngr: ocp.CheckpointManager, step: int, state, data: dict, run: dict) -> None:
  data = data | {DIGEST: digest(state)}
  with _saving(mngr):
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data),
                                            run=ocp.args.JsonSave(run)))


def digest(state) -> list[list[int]]:
  """Per array of `state`, [sum, position-weighted sum] of its elements' bits as unsigned integers, mod 2**32: the
  same wherever the array's shards lie."""
  return np.asarray(_digest(state)).tolist()


@jax.jit
def _digest(tree) -> jax.Array:
  sums = []
  for x in jax.tree.leaves(tree):
    bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}")) if x.dtype != bool else x
    bits = bits.astype(jnp.uint32)
    index = jnp.zeros(bits.shape, jnp.uint32)  # each element's position, from iotas: no reshape of a sharded array
    for axis in range(bits.ndim):
      stride = int(np.prod(bits.shape[axis + 1:], dtype=np.uint64) % 2**32)
      index = index + jax.lax.broadcasted_iota(jnp.uint32, bits.shape, axis) * jnp.uint32(stride)
    weight = index * jnp.uint32(2654435761) | jnp.uint32(1)  # Knuth's multiplicative hash: odd, position-dependent
    sums.append(jnp.stack([jnp.sum(bits, dtype=jnp.uint32), jnp.sum(bits * weight, dtype=jnp.uint32)]))
  return jnp.stack(sums) if sums else jnp.zeros((0, 2), jnp.uint32)


def wait(mngr: ocp.CheckpointManager) -> None:
  """Waits for the save in the background, if any: a CheckpointError if it failed."""
  with _saving(mngr):
    mngr.wait_until_finished()


def _reason(e: BaseException) -> str:
  """A short line for an orbax or tensorstore error: the innermost cause's first line, without its spec."""
  while e.__cause__ is not None:
    e = e.__cause__
  text = str(e).strip()
  if m := re.search(r"os_error_code='(\d+)'", text):
    return os.strerror(int(m.group(1)))
  first = (text.splitlines() or [""])[0].split(" [tensorstore_spec")[0].split(" See full TensorStore")[0]
  return f"{type(e).__name__}: {first[:200]}"


def _shapes(tree) -> dict[tuple, tuple]:
  """Leaf shapes by key path, the path spelled the same for dataclasses, dicts and sequences."""
  name = lambda k: str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))  # noqa: E731
  return {tuple(map(name, path)): getattr(x, "shape", None) and tuple(x.shape)
          for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def _misfit(mngr, step: int, stored: dict, wanted: dict) -> CheckpointError:
  diff = sorted((k for k in stored.keys() | wanted.keys() if stored.get(k) != wanted.get(k)),
                key=lambda k: ("params" not in k, k))  # the weights first: their momentum says the same again
  detail = "; ".join(f"{'.'.join(k)}: checkpoint {stored.get(k)} vs config {wanted.get(k)}" for k in diff[:2])
  detail += f"; {len(diff) - 2} more" if len(diff) > 2 else ""
  return CheckpointError(f"the checkpoint of step {step} in {mngr.directory} does not fit this configuration "
                         f"({detail}); resume with the config it was written with, or train in a new --workdir")


def _restore_step(mngr: ocp.CheckpointManager, step: int, state, wanted: dict):
  """The restored items of `step`, or None if its shapes are another network's; raises whatever orbax raises for
  an unreadable checkpoint, and ValueError for an incomplete or non-finite one."""
  stored = _shapes(mngr.item_metadata(step)["state"])
  if not stored or None in stored.values():
    raise ValueError("its metadata is incomplete")
  if stored != wanted:
    raise _misfit(mngr, step, stored, wanted)
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                        data=ocp.args.JsonRestore()))
  if restored["data"] is None:
    raise ValueError("its input position is missing")
  saved = restored["data"].pop(DIGEST, None)  # checkpoints written before digests were have none
  if saved is not None and saved != digest(restored["state"]):
    raise ValueError("its numbers are not those that were saved (their digest differs): a file was altered or "
                     "damaged")
  if not guard.all_finite(restored["state"]):
    raise ValueError("it holds non-finite numbers")
  return restored


def restore(mngr: ocp.CheckpointManager, state, set_aside: bool = False) -> tuple:
  """(state, data position) of the newest checkpoint that restores, the state laid out like `state` (same
  shardings); (`state`, None) where there is none.

  Shapes are compared with the checkpoint's metadata first, so that a checkpoint of another network is refused
  with one message, before orbax starts reading. A checkpoint that cannot be read is passed over with a warning;
  with set_aside (training, which will save those steps again) its directory is renamed <step>.unreadable, out of
  orbax's sight. A checkpoint that goes while it is read was rotated away by a run still saving: the steps are
  listed again and the newest tried anew. A CheckpointError if there are checkpoints and none restores.
  """
  wanted, failed = _shapes(state), {}
  for _ in range(ROTATIONS):
    steps, failed = sorted(mngr.all_steps(), reverse=True), {}
    for step in steps:
      try:
        with _orbax_quiet(logging.WARNING):
          restored = _restore_step(mngr, step, state, wanted)
      except CheckpointError:
        raise
      except Exception as e:  # orbax and tensorstore raise KeyError, ValueError or a bare Exception for one fault
        failed[step] = _reason(e)
        continue
      _passed_over(mngr, failed, set_aside, step)
      return restored["state"], restored["data"]
    _listed_anew(mngr)
    if sorted(mngr.all_steps(), reverse=True) == steps:
      break  # none went and none came: they cannot be read
    # A run still saving rotated them away while they were read (orbax deletes a step's items one by one): the
    # newer ones are read instead, and nothing is said of those that went.
  _passed_over(mngr, failed, set_aside)
  if failed:
    raise CheckpointError(f"none of the checkpoints in {mngr.directory} can be restored (steps "
                          f"{', '.join(map(str, failed))}; warnings above){_unreadable_remedy(set_aside)}")
  return state, None


def _passed_over(mngr: ocp.CheckpointManager, failed: dict, set_aside: bool, resumed: int | None = None) -> None:
  """Warns of each checkpoint that could not be restored and is still there; with set_aside, renames them."""
  there = [step for step in failed if os.path.isdir(os.path.join(mngr.directory, str(step)))]
  for step in there:
    logging.warning("checkpoint %d in %s cannot be restored (%s): trying the one before", step, mngr.directory,
                    failed[step])
  if there and set_aside and resumed is not None:
    moved = [_set_aside(mngr, step) for step in there]
    _listed_anew(mngr)
    logging.warning("resuming from checkpoint %d; set aside, not deleted: %s", resumed, ", ".join(moved))


def _listed_anew(mngr: ocp.CheckpointManager) -> None:
  _while_rotating(mngr.reload)


def _while_rotating(list_steps):
  """list_steps() (which lists the checkpoints' steps, then reads each one's time), again while a run still saving
  removes a step between the two (a step's folder half removed reads as not a folder)."""
  for attempt in range(ROTATIONS):
    try:
      return list_steps()
    except (FileNotFoundError, NotADirectoryError):
      if attempt == ROTATIONS - 1:
        raise
  return None


ROTATIONS = 5  # times the steps are listed again when a checkpoint goes while it is read


def _unreadable_remedy(training: bool) -> str:
  """What to do when no checkpoint restores: a reader keeps them (a run may still be writing them)."""
  if training:
    return ": they are left as they are; to train afresh, pass another --workdir"
  return ": if a run is still saving in that workdir, rerun once it has saved again"


def _set_aside(mngr: ocp.CheckpointManager, step: int) -> str:
  source = os.path.join(mngr.directory, str(step))
  target, n = source + UNREADABLE_SUFFIX, 1
  while os.path.exists(target):
    n += 1
    target = f"{source}{UNREADABLE_SUFFIX}.{n}"
  os.rename(source, target)
  return target
