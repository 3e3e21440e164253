"""What stops a training run early, and how: divergence (a non-finite loss or state) and the signals of a
preemption (SIGTERM), of Ctrl-C (SIGINT) or of a closed terminal (SIGHUP).

Divergence is seen without a host sync per step: each step's metrics carry `nonfinite_from` (the step number if its
loss was not finite), which the metrics window keeps the minimum of and the loop reads at log time; before each
save the whole state is checked, so a non-finite state is never written, and `checkpoints_to_keep` can only rotate
finite checkpoints away. A signal is turned into a request that the loop reads after each step: it saves, closes
its writers and raises Interrupted; a second signal ends the process at once. The loop keeps what it has seen of
all these in a Watch, which raises what stopped the run once it has closed its writers.
"""

import os
import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np

from alexnet_jax.data.workers import SIGNALS  # a preemption, Ctrl-C, a closed terminal

NEVER = np.iinfo(np.int32).max  # `nonfinite_from` of a window whose every loss was finite
NONFINITE_LOSS = "a non-finite loss"  # what Diverged says of a step whose loss was not finite
NONFINITE_STATE = "a non-finite state"  # what Diverged says of a state found not finite before a save


class Diverged(ValueError):
  """The loss or the state stopped being finite: training stopped without saving the non-finite state. `what`
  says which: 'a non-finite loss' or 'a non-finite state'."""

  def __init__(self, step: int, what: str, last_checkpoint: int | None, directory: str, first: bool = False):
    where = (f"the last finite checkpoint is step {last_checkpoint} in {directory}: rerun with a lower "
             "config.learning_rate to resume from it" if last_checkpoint is not None else
             f"and no checkpoint in {directory}: rerun with a lower config.learning_rate")
    if first:  # the loss of weights no update has touched yet: the learning rate is not the cause
      super().__init__(f"{what} at step {step}, the first of this run, before any update: the images or the "
                       "weights the run starts from give no finite loss (the weights of an init_from file, the "
                       "pixel statistics in run.json); stopped without saving")
    else:
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


def step_health(step: jax.Array, metrics: dict, logits: jax.Array) -> dict:
  """A train step's metrics for the guard, from its sums (metrics_of) and logits: `nonfinite_from`, the step's
  number (counted from 1) if its loss is not finite, else NEVER; `logit_spread`, each class's logit's range over the
  batch (max − min), averaged over the classes: exactly 0 once the outputs no longer depend on the input;
  `learning_at`, the step's number if its batch scored above chance (above_chance), else 0. All read what every
  device already holds after the last layer, so they cost no collective: a gradient norm would need an all-reduce
  over the devices that split the weights, the only one outside conv3 and fc6-fc8 in the paper's step. A non-finite
  gradient shows up as a non-finite loss one step later, and in the state check before every save."""
  loss, count = metrics["loss"], metrics["count"]
  learning = above_chance(loss / count, metrics["top1"] / count, count, logits.shape[-1])
  return dict(nonfinite_from=jnp.where(jnp.isfinite(loss), NEVER, step + 1).astype(jnp.int32),
              logit_spread=jnp.mean(jnp.ptp(logits.astype(jnp.float32), axis=0)),
              learning_at=jnp.where(learning, step + 1, 0).astype(jnp.int32))


# How the metrics window combines a key over its steps: the first non-finite step, the largest spread, the last step
# above chance; else sums.
_WINDOW = dict(nonfinite_from=jnp.minimum, logit_spread=jnp.maximum, learning_at=jnp.maximum)

STALL_STEPS = 100  # steps in a row no better than chance (and at least an epoch's) before a run has stalled
STALL_LOSS = 0.05  # a loss this share below ln C, the uniform prediction's, is better than chance


def above_chance(loss, top1, count, classes: int):
  """Whether a batch's mean loss or top-1 beats chance by more than a batch's noise: the loss STALL_LOSS below
  ln C, or top-1 three standard deviations (of a batch's share of right guesses at chance, 1/C each) above 1/C."""
  p = 1 / classes
  noise = jnp.maximum(0.05, 3 * jnp.sqrt(p * (1 - p) / jnp.maximum(count, 1)))
  return (loss < (1 - STALL_LOSS) * np.log(classes)) | (top1 > p + noise)


class Stall:
  """Counts the steps in a row no better than chance (step_health's `learning_at`, read at each log) and says once,
  in one line, when they reach STALL_STEPS or an epoch, whichever is longer: a healthy run leaves chance within its
  first steps; one that stays there (the paper's initialisation and learning rate on a small set, say) has stalled,
  though its logits may still vary a little (where `Collapsed`, for logits that do not vary at all, stops it)."""

  def __init__(self, start: int, classes: int, steps_per_epoch: int):
    self.learning_at, self.classes, self.said = start, classes, False
    self.limit = max(STALL_STEPS, steps_per_epoch)

  def steps(self, window: dict, done: int) -> int:
    """The steps in a row no better than chance up to step `done`, with the window just read."""
    self.learning_at = max(self.learning_at, int(window["learning_at"]))
    return done - self.learning_at

  def message(self, steps: int, done: int, loss: float) -> str | None:
    """The one line to say, the first time `steps` reach the limit; else None."""
    if self.said or steps < self.limit:
      return None
    self.said = True
    return (f"warning: training has stalled: for {steps} steps (since step {done - steps + 1}) the loss has stayed "
            f"near or above ln {self.classes} = {np.log(self.classes):.3f} (now {loss:.3f}) and top-1 at chance: the "
            "network is not learning. Try --config.weight_init=he, a lower --config.learning_rate, or "
            "--config.warmup_steps=100; configs/own_images.py learns on small sets")


def accumulate(sums: dict | None, metrics: dict) -> dict:
  """The metrics window with one more step (_WINDOW), in one dispatch: an op per key would hold Python's lock for
  each, every step, against the feed's thread (data/feed.py)."""
  if sums is None:
    return metrics
  return _accumulated(sums, metrics)


@jax.jit
def _accumulated(sums: dict, metrics: dict) -> dict:
  return {k: _WINDOW.get(k, jnp.add)(v, metrics[k]) for k, v in sums.items()}


COLLAPSE_LOGS = 3  # consecutive logs that find the network collapsed before the run is stopped


class Collapsed(ValueError):
  """The network's outputs stopped depending on its input: every prediction the prior, no gradient left."""

  def __init__(self, step: int, since: int, loss: float, classes: int):
    super().__init__(
        f"training collapsed: since step {since} the loss is {loss:.4f} ≈ ln {classes}, the same prediction for every "
        f"image, and no weight receives a gradient (the ReLUs are dead); stopped at step {step}, as it will not learn "
        "again. Try --config.weight_init=he, a lower --config.learning_rate or --config.warmup_epochs=1")
    self.step, self.since = step, since


def collapsed(window: dict, loss: float, classes: int) -> bool:
  """Whether a metrics window (fetched to the host; `loss` its mean loss) looks like a collapsed network: the loss
  at ln(classes) — uniform predictions — and the same logits for every image over the whole window (the last
  layer's inputs all zero: no weight below it receives a gradient either)."""
  return abs(loss - np.log(classes)) < 1e-3 * np.log(classes) and float(window["logit_spread"]) < 1e-6


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


class Watch:
  """What the loop has seen that stops a run, from step `start` on: a non-finite loss (each log's window) or state
  (before each save), a collapse (COLLAPSE_LOGS logs in a row), a signal (Signals.check after each step); and a stall,
  which it says once and lets run. `stop` once any has been seen; `failed` once the run must not save."""

  def __init__(self, start: int, classes: int, steps_per_epoch: int):
    self.start, self.classes = start, classes
    self.stall = Stall(start, classes, steps_per_epoch)
    self.done, self.logged = start, start  # the last step checked, and logged
    self.at_chance = 0  # the steps in a row no better than chance, as of the last log
    self.diverged = None  # (step, what) once the loss or the state is not finite
    self.collapse = None  # Collapsed, once COLLAPSE_LOGS logs in a row say so
    self.signalled = None  # the signal to stop with (Signals.check)
    self._dead_logs, self._dead_since = 0, None

  @property
  def failed(self) -> bool:
    return bool(self.diverged or self.collapse)

  @property
  def stop(self) -> bool:
    return self.failed or bool(self.signalled)

  def after(self, done: int, signalled: int | None) -> None:
    """After step `done`: the signal Signals.check gave for it."""
    self.done, self.signalled = done, signalled

  def log(self, window: dict, loss: float) -> str | None:
    """A log's metrics window up to the last step (fetched to the host) and its mean loss: the stall's one line,
    the first time there is one to say; else None."""
    self.at_chance = self.stall.steps(window, self.done)
    said = self.stall.message(self.at_chance, self.done, loss)
    if (bad := first_nonfinite(window)) is not None:
      self.diverged = bad, NONFINITE_LOSS
    if collapsed(window, loss, self.classes):
      self._dead_logs, self._dead_since = self._dead_logs + 1, self._dead_since or self.logged + 1
    else:
      self._dead_logs, self._dead_since = 0, None
    if self._dead_logs == COLLAPSE_LOGS:
      self.collapse = Collapsed(self.done, self._dead_since, loss, self.classes)
    self.logged = self.done
    return said

  def finite(self, state) -> bool:
    """Whether `state` may be saved: a non-finite one never is, and stops the run."""
    if all_finite(state):
      return True
    self.diverged = self.done, NONFINITE_STATE
    return False

  def raise_stop(self, last_checkpoint: int | None, directory: str) -> None:
    """Raises what stopped the run, if anything did (Diverged, Collapsed, Interrupted); `last_checkpoint`, the
    newest step saved in `directory`."""
    if self.diverged:
      first = self.diverged == (self.start + 1, NONFINITE_LOSS)  # no update had touched the weights yet
      raise Diverged(*self.diverged, last_checkpoint, directory, first=first)
    if self.collapse:
      raise self.collapse
    if self.signalled:
      raise Interrupted(self.signalled, self.done, directory)


class Signals:
  """`with Signals() as signals:` a SIGTERM, SIGINT or SIGHUP asks training to stop after a step: `signals.check(step)`,
  called after every step, returns the signal once it is time to stop, with the same step on every process of the
  run; a second signal ends the process at once. Outside the main thread (where Python cannot catch signals) it
  catches none.

  A signal may reach one process of several (a node's SIGTERM, a Ctrl-C in one terminal): a watcher thread in each
  process posts its own signal to the run's key-value store, and, once any has posted one, every watcher publishes
  the last step its loop checked, waits for the others' and takes the largest + 1 as the step to stop after. The
  watchers agree off the training threads, which may be blocked in a collective that waits for another process's
  next step; `check` costs a lock per step. (JAX's own preemption sync point installs a SIGTERM handler that
  Python's replaces, counts steps from the start of the process, so that a resumed run never reaches it, and knows
  no SIGINT or SIGHUP: distributed.initialize turns it off.)
  """

  POLL_S = 0.1  # how often a watcher asks the store whether a process was signalled
  TIMEOUT_S = 300  # how long the watchers wait for every process to publish its step

  def __init__(self):
    self.local = None  # the signal this process received
    self.signum, self.stop_after = None, None  # the run's signal and the step after which every process stops
    self.last, self.error = -1, None  # the last step checked; a failure of the watcher, raised by check
    self._lock, self._done = threading.Lock(), threading.Event()
    self._previous = {}
    self._client = _distributed_client()
    if self._client is not None:
      global _agreements
      _agreements += 1  # the same count on every process: each agreement has keys of its own
      self._keys = f"alexnet_jax/stop/{_agreements}/"

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
      if self._client is not None:
        threading.Thread(target=self._watch, name="stop-agreement", daemon=True).start()
    return self

  def __exit__(self, *exc):
    self._done.set()
    for s, handler in self._previous.items():
      signal.signal(s, handler)

  def _handle(self, signum, frame):
    if self.local is not None:
      os.write(2, f"\n{signal.Signals(signum).name} again: stopping at once\n".encode())
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self.local = signum
    # os.write, not print: the handler may run in the middle of a print to stderr (the progress bar's).
    os.write(2, f"\n{signal.Signals(signum).name}: stopping after this step and saving a checkpoint (send it "
                "again to stop at once)\n".encode())

  def _watch(self):
    client, pid = self._client, jax.process_index()
    try:
      posted = False
      while not self._done.wait(self.POLL_S):
        if self.local is not None and not posted:
          client.key_value_set(self._keys + "signal", str(self.local), allow_overwrite=True)
          posted = True
        try:
          signum = int(client.key_value_try_get(self._keys + "signal"))
        except Exception:  # noqa: BLE001  (not found: no process was signalled yet)
          continue
        with self._lock:  # this process's loop stays at its step while the processes agree
          client.key_value_set(f"{self._keys}step/{pid}", str(self.last), allow_overwrite=True)
          client.wait_at_barrier(self._keys + "steps", self.TIMEOUT_S * 1000)
          steps = [int(v) for _, v in client.key_value_dir_get(self._keys + "step/")]
          self.stop_after, self.signum = max(steps) + 1, signum
        return
    except Exception as e:  # noqa: BLE001  (a process gone, or the service: check raises it in the loop)
      self.error = e

  def check(self, step: int) -> int | None:
    """After the loop's step `step` (counted from 1, every step, on every process): the signal to stop with once
    this is the agreed step, else None."""
    if self._client is None:
      return self.local
    with self._lock:
      if self.error is not None:
        raise RuntimeError(f"the run's processes could not agree on a step to stop at: {self.error}")
      self.last = step
      return self.signum if self.stop_after is not None and step >= self.stop_after else None


_agreements = 0  # Signals made in this process while it belongs to a run of several


def _distributed_client():
  """The client of the run's key-value store (jax.distributed), or None for a run of one process. JAX exports no
  name for it; orbax reads it from the same place."""
  from jax._src import distributed  # noqa: PLC0415

  return distributed.global_state.client if jax.process_count() > 1 else None
