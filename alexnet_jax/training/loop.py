"""The training loop, in the shape of flax's imagenet example: train_and_evaluate runs train.train_step with
evaluation, TensorBoard and JSONL metrics, and orbax checkpoints that a rerun of the same command resumes from. Its
batches come from data/input.py; what stops it early is guard.py's.
"""

import contextlib
import functools
import time

import jax
import ml_collections
import tqdm
from jax.experimental import multihost_utils

from alexnet_jax.config import validate
from alexnet_jax.data import DataError, get_dataset
from alexnet_jax.data.device_batches import random_batch
from alexnet_jax.data.input import input_feed
from alexnet_jax.training import checkpoints, distributed, guard, pictures, pmap, run, workdirs
from alexnet_jax.training.evaluation import evaluate, summarise
from alexnet_jax.training.metrics import MetricWriter
from alexnet_jax.training.restore import weights_from
from alexnet_jax.training.train import (
  Setup,
  Stepping,
  TrainState,
  create_train_state,
  dataset_setup,
  eval_step,
  initial_params,
  jitted,
)


def stepping(config, setup: Setup) -> Stepping:
  """train_step jitted, or under config.parallel_api='pmap' pmap's data parallelism (pmap.py), which holds a
  replica of the state per device."""
  return pmap.stepping(setup) if config.parallel_api == "pmap" else jitted(setup)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains to config.num_epochs (or num_steps), resuming from the newest checkpoint in `workdir` that restores;
  returns the final eval metrics. The run holds the workdir alone (workdirs.claim); SIGTERM, SIGINT or SIGHUP stop it
  after a step, the same on every process, with that step saved (guard.Interrupted); a non-finite loss or state stops
  it without saving (guard.Diverged)."""
  config = validate(config)
  # `closing` closes the metric writer and the feed on the way out of an error too: tensorboardX's own clean-up at
  # exit would print a traceback, and the feed's data workers would outlive the run.
  with (workdirs.claim(workdir, lock=jax.process_index() == 0), guard.Signals() as signals,
        contextlib.ExitStack() as closing):
    return _train_and_evaluate(config, workdir, signals, closing)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, signals: guard.Signals,
                        closing: contextlib.ExitStack) -> dict:
  # --- Data & state: the newest checkpoint that restores, else a new state (or a weights file's) ---
  dataset = get_dataset(config)
  setup = dataset_setup(config, dataset)
  key = jax.random.key(config.seed)
  state = create_train_state(setup, key)
  manager = checkpoints.manager(workdir, config)
  state, position = checkpoints.restore(manager, state, set_aside=True)
  start = int(state.step)
  if position is not None:
    check_position(position, data_position(config, dataset, start))
  elif config.init_from:  # a new run: the weights of a file, not the random ones
    state = state.replace(params=weights_from(config.init_from, setup, state.params))

  # --- Outputs: run.json and the metrics, written by one process ---
  described = run.describe(config, dataset, setup.net.table)
  writer = MetricWriter(workdir, resume_step=start) if distributed.is_writer() else None
  if writer:
    closing.callback(writer.close)
    run.write(workdir, described)
    if start == 0:
      writer.write_config(config)

  # --- Steps ---
  steps = stepping(config, setup)
  p_eval_step = jax.jit(functools.partial(eval_step, setup=setup), static_argnames="crops")
  print(f"{config.network}: {sum(x.size for x in jax.tree.leaves(state.params)):,} parameters, "
        f"mesh {dict(setup.mesh.shape)} on {setup.mesh.devices.flat[0].platform}, "
        f"steps {start}→{setup.total_steps}, workdir {workdir}", flush=True)
  state = steps.into_step(state)

  # --- Input: the batches from `start` on, through a cache sized beside the compiled step ---
  step_memory = functools.partial(step_bytes, steps.step, setup, dataset, config.batch_size, state, key)
  feed = input_feed(config, dataset, setup.batch_layout, setup.image_size, setup.total_steps, start=start,
                    step_memory=step_memory)
  closing.callback(feed.close)

  # --- Train loop ---
  watch = guard.Watch(start, dataset.num_classes, dataset.num_train // config.batch_size)
  eval_metrics, sums, t0, logged, skipped = {}, None, time.time(), start, 0
  bar = tqdm.tqdm(total=setup.total_steps, initial=start, unit="step", dynamic_ncols=True, mininterval=2.0,
                  disable=not distributed.is_writer())
  for step in range(start, setup.total_steps):
    batch, skipped_here = next(feed)
    skipped += skipped_here
    state, m = steps.step(state, batch, key)
    del batch  # on CPU it can be a view of a worker's shared memory, which Grain releases when it is let go
    lr = m.pop("learning_rate")
    sums = guard.accumulate(sums, m)
    done = step + 1
    watch.after(done, signals.check(done))  # the same step on every process
    if done % config.log_every_steps == 0 or done == setup.total_steps:
      window = jax.device_get(sums)
      train = summarise(window)
      said = watch.log(window, train["loss"])
      train |= dict(learning_rate=float(lr), logit_spread=float(window["logit_spread"]),
                    steps_at_chance=watch.at_chance, steps_per_sec=(done - logged) / (time.time() - t0),
                    skipped_images=skipped)
      if writer:
        writer.write("train", done, train)
      bar.set_postfix(loss=f"{train['loss']:.3f}", top1=f"{train['top1']:.3f}")
      if said:
        bar.write(said)
        if writer:
          writer.note(done, said)
      sums, t0, logged = None, time.time(), done
    evaluating = (done % config.eval_every_steps == 0 or done == setup.total_steps) and not watch.stop
    saving = ((done % config.checkpoint_every_steps == 0 or done == setup.total_steps or watch.signalled)
              and not watch.failed and watch.finite(state))  # never write a non-finite state
    if evaluating or saving:
      jax.block_until_ready(state)  # the steps queued so far are training time; what follows is not
      pause, held = time.time(), steps.out_of_step(state)
    if evaluating:
      eval_metrics = evaluate(held, dataset, config, p_eval_step, setup.batch_layout)
      if writer:
        writer.write("eval", done, eval_metrics)
      bar.write(f"step {done}: eval loss {eval_metrics['loss']:.4f}  top-1 {eval_metrics['top1']:.4f}  "
                f"top-5 {eval_metrics['top5']:.4f}")
    if saving:
      checkpoints.save(manager, done, held, data_position(config, dataset, done), described)
    if evaluating or saving:
      t0 += time.time() - pause  # steps_per_sec times the training steps alone
    bar.update(1)
    if watch.stop:
      break
  bar.close()

  # --- Finish: what stopped the run early, else the final metrics and pictures ---
  closing.close()  # the feed (its thread and worker processes, if any) and the metric writer
  checkpoints.wait(manager)
  watch.raise_stop(manager.latest_step(), manager.directory)
  state = steps.out_of_step(state)
  if not eval_metrics:  # nothing left to train: report on the restored state
    eval_metrics = evaluate(state, dataset, config, p_eval_step, setup.batch_layout)
  colour = write_pictures(workdir, setup, state, config)
  if colour:
    print("conv1 colour specialisation: " + ", ".join(f"{k.split('_')[-1]} {v:.3f}" for k, v in colour.items()))
  return eval_metrics


def step_bytes(step, setup: Setup, dataset, batch_size: int, state, key) -> int:
  """The device memory that the compiled training step `step` takes beyond its arguments (XLA's temporaries and
  outputs) on batches of `batch_size` stored images of the dataset, or 4 GiB where the step cannot say (pmap's)."""
  example = random_batch(batch_size, setup.image_size, dataset.num_classes, size=dataset.size)
  example = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=setup.batch_layout.sharding(v.ndim))
             for k, v in example.items()}
  try:
    analysis = step.lower(state, example, key).compile().memory_analysis()
    return int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes)
  except (AttributeError, NotImplementedError, TypeError):
    return 4 << 30


def data_position(config, dataset, next_batch: int) -> dict:
  """What a checkpoint records of the input pipeline: the next batch's index, and the settings without which that
  index would name different examples. The number of processes is not one: each reads its rows of the same global
  batch (process_rows), so a run resumes on more or fewer processes. (Checkpoints written before this still record
  `processes`; check_position reads only what this lists.)"""
  return dict(next_batch=next_batch, dataset=config.dataset.name, num_train=dataset.num_train,
              batch_size=config.batch_size, seed=config.seed)


def check_position(saved: dict, now: dict) -> None:
  changed = [f"{k} {saved.get(k)!r} → {now[k]!r}" for k in now if saved.get(k) != now[k]]
  if changed:
    raise DataError(f"the checkpoint's input position does not fit this run ({'; '.join(changed)}): resume with the "
                    "data settings it was written with, or train in a new --workdir")


def write_pictures(workdir: str, setup: Setup, state: TrainState, config) -> dict:
  """curves.png and the first conv layer's filters per tower (conv1_filters.png) in the workdir, and what training
  changed in them (conv1_learned.png: the initial filters are made again from config.seed, unless the run started
  from a weights file), by process 0 (every process takes part in gathering the filters from the devices that hold
  them); {} elsewhere."""
  first = next(layer.name for layer in setup.net.table.layers if layer.kind == "conv")
  kernel = multihost_utils.process_allgather(state.params[first]["kernel"], tiled=True)
  initial = None
  if not config.init_from:  # the first layer's alone: XLA leaves the other layers' draws out of the program
    initial = jax.jit(lambda key: initial_params(setup, key)[first]["kernel"])(jax.random.key(config.seed))
  return pictures.write_all(workdir, kernel, int(state.step), initial) if distributed.is_writer() else {}
