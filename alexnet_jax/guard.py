"""What stops a training run early, and how: divergence (a non-finite loss or state) and the signals of a
preemption (SIGTERM) or of Ctrl-C (SIGINT).

Divergence is seen without a host sync per step: each step's metrics carry `nonfinite_from` (the step number if its
loss was not finite), which the metrics window keeps the minimum of and the loop reads at log time; before each
save the whole state is checked, so a non-finite state is never written, and `checkpoints_to_keep` can only rotate
finite checkpoints away. A signal is turned into a request that the loop reads after each step: it saves, closes
its writers and raises Interrupted; a second signal ends the process at once.
"""

import contextlib
import os
import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np

NEVER = np.iinfo(np.int32).max  # `nonfinite_from` of a window whose every loss was finite
SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []  # signals caught while stop_on_signals is active, oldest first


class Diverged(ValueError):
  """The loss or the state stopped being finite: training stopped without saving the non-finite state. `what`
  says which: 'a non-finite loss' or 'a non-finite state'."""

  def __init__(self, step: int, what: str, last_checkpoint: int | None, directory: str):
    where = (f"the last finite checkpoint is step {last_checkpoint} in {directory}: rerun with a lower "
             "config.learning_rate to resume from it" if last_checkpoint is not None else
             f"and no checkpoint in {directory}: rerun with a lower config.learning_rate")
    super().__init__(f"training diverged: {what} at step {step}; stopped without saving, {where}")
    self.step, self.last_checkpoint = step, last_checkpoint


class Interrupted(Exception):
  """A signal stopped training after a step, with a checkpoint of that step saved."""

  def __init__(self, signum: int, step: int, directory: str):
    super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}, saved in {directory}; "
                     "rerun the same command to resume")
    self.signum, self.step = signum, step

  @property
  def exit_status(self) -> int:
    return 128 + self.signum  # the shell's convention for a process ended by a signal


def step_health(step: jax.Array, loss: jax.Array) -> dict:
  """A train step's metric for the guard: `nonfinite_from`, the step's number (counted from 1) if its loss is not
  finite, else NEVER. The loss is already summed over the mesh, so this costs no collective; a non-finite gradient
  shows up as a non-finite loss one step later, and in the state check before every save."""
  return dict(nonfinite_from=jnp.where(jnp.isfinite(loss), NEVER, step + 1).astype(jnp.int32))


def accumulate(sums: dict | None, metrics: dict) -> dict:
  """The metrics window with one more step: sums, and the first non-finite step."""
  if sums is None:
    return metrics
  return {k: jnp.minimum(v, metrics[k]) if k == "nonfinite_from" else v + metrics[k] for k, v in sums.items()}


def first_nonfinite(window: dict | None) -> int | None:
  """The first step of a window (fetched to the host) whose loss was not finite, or None."""
  if window is None or int(window["nonfinite_from"]) == NEVER:
    return None
  return int(window["nonfinite_from"])


@jax.jit
def _all_finite(tree) -> jax.Array:
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else jnp.array(True)


def all_finite(tree) -> bool:
  """Whether every floating-point number of a pytree (a train state) is finite."""
  return bool(_all_finite(tree))


@contextlib.contextmanager
def stop_on_signals():
  """Within: SIGTERM or SIGINT asks the training loop to stop after its current step (signalled() says so); a
  second one ends the process at once. Outside the main thread (where Python cannot catch signals) it does
  nothing."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handle(signum, frame):
    if _received:
      os.write(2, f"\n{signal.Signals(signum).name} again: stopping at once\n".encode())
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    _received.append(signum)
    # os.write, not print: the handler may run in the middle of a print to stderr (the progress bar's).
    os.write(2, f"\n{signal.Signals(signum).name}: stopping after this step and saving a checkpoint (send it "
                "again to stop at once)\n".encode())

  _received.clear()
  previous = {s: signal.signal(s, handle) for s in SIGNALS}
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    _received.clear()


def signalled() -> int | None:
  """The signal that asked training to stop, or None."""
  return _received[0] if _received else None
