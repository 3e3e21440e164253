"""The evaluation split's metrics of a train state: the training loop's evaluations, a loaded model's
(api.Model.evaluate) and those of a finished run's newest checkpoint (scripts/evaluate.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from alexnet_jax.data import eval_batches, get_dataset
from alexnet_jax.training.restore import restore_newest
from alexnet_jax.training.train import eval_step


def summarise(sums: dict) -> dict:
  """Per-example means from summed metrics: loss, top-1 and top-5 accuracy."""
  n = max(float(sums["count"]), 1.0)
  return {k: float(sums[k]) / n for k in ("loss", "top1", "top5")}


def evaluate(state, dataset, config, p_eval_step, rows, crops: int = 1) -> dict:
  """Metrics over the readable examples of the evaluation split (each counted once: `count`; `unreadable` those
  that could not be read), its batches placed as `rows` (data.device_batches.BatchLayout) say; p_eval_step is
  eval_step jitted with `crops` static."""
  total, unreadable = None, 0
  for batch in eval_batches(dataset, config.eval_batch_size, rows.process_rows(config.eval_batch_size)):
    unreadable += int(batch.pop("unreadable"))
    m = p_eval_step(state, rows.put(batch), crops=crops)
    total = m if total is None else jax.tree.map(jnp.add, total, m)
  total = jax.device_get(total)
  unreadable = int(np.sum(multihost_utils.process_allgather(np.int64(unreadable))))  # each process's rows
  return summarise(total) | dict(count=int(total["count"]), unreadable=unreadable)


def evaluate_checkpoint(workdir: str, config=None, crops=(1, 10)) -> tuple[int, dict]:
  """(step, {crops: metrics}) of the newest checkpoint in workdir, on the evaluation split."""
  described, setup, state = restore_newest(workdir, config)
  dataset = get_dataset(described.config, statistics=described.statistics)
  p_eval_step = jax.jit(functools.partial(eval_step, setup=setup), static_argnames="crops")
  return int(state.step), {c: evaluate(state, dataset, described.config, p_eval_step, setup.batch_layout, c)
                           for c in crops}
