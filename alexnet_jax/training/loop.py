"""The training loop, in the shape of flax's imagenet example: train_and_evaluate runs train.train_step with
evaluation, TensorBoard and JSONL metrics, and orbax checkpoints that a rerun of the same command resumes from.
"""

import contextlib
import functools
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm
from jax.experimental import multihost_utils

from alexnet_jax.config import validate
from alexnet_jax.data import DataError, cache, eval_batches, get_dataset, iterate, train_batches
from alexnet_jax.data.feed import Feed
from alexnet_jax.data.device_batches import DevicePut, HostPut, random_batch
from alexnet_jax.network import interchange
from alexnet_jax.training import checkpoints, distributed, guard, pictures, pmap, run, workdirs
from alexnet_jax.training.metrics import MetricWriter
from alexnet_jax.training.train import (
  Setup,
  Stepping,
  TrainState,
  create_train_state,
  dataset_setup,
  eval_step,
  initial_params,
  jitted,
  make_setup,
  train_state_init,
)


def stepping(config, setup: Setup) -> Stepping:
  """train_step jitted, or under config.parallel_api='pmap' pmap's data parallelism (pmap.py), which holds a
  replica of the state per device."""
  return pmap.stepping(setup) if config.parallel_api == "pmap" else jitted(setup)


def putter(config, setup: Setup, dataset, cached: cache.Rule | None = None):
  """What puts the feed's host batches on the devices: the host's images, with the device cache (`cached`) the host's
  and the cache's, or, where the devices decode (dataset.decoder 'gpu'), their JPEGs handed to the devices' decoding
  processes."""
  if cached is not None and cached.slots:
    return cache.cached_put(config.dataset.cache, setup.batch_rows, dataset.size, setup.image_size, cached)
  if dataset.decoder != "gpu":
    return HostPut(setup.batch_rows, dataset.size, setup.image_size)
  return DevicePut(setup.batch_rows, dataset.size, setup.image_size, config.batch_size, dataset.train,
                   config.dataset.gpu_backends)


def summarise(sums: dict) -> dict:
  """Per-example means from summed metrics: loss, top-1 and top-5 accuracy."""
  n = max(float(sums["count"]), 1.0)
  return {k: float(sums[k]) / n for k in ("loss", "top1", "top5")}


def evaluate(state, dataset, config, p_eval_step, rows, crops: int = 1) -> dict:
  """Metrics over the readable examples of the evaluation split (each counted once: `count`; `unreadable` those
  that could not be read), its batches placed as `rows` (data.device_batches.Rows) say; p_eval_step is eval_step jitted
  with `crops` static."""
  total, unreadable = None, 0
  for batch in eval_batches(dataset, config.eval_batch_size, rows.process_rows(config.eval_batch_size)):
    unreadable += int(batch.pop("unreadable"))
    m = p_eval_step(state, rows.put(batch), crops=crops)
    total = m if total is None else jax.tree.map(jnp.add, total, m)
  total = jax.device_get(total)
  unreadable = int(np.sum(multihost_utils.process_allgather(np.int64(unreadable))))  # each process's rows
  return summarise(total) | dict(count=int(total["count"]), unreadable=unreadable)


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


def evaluate_checkpoint(workdir: str, config=None, crops=(1, 10)) -> tuple[int, dict]:
  """(step, {crops: metrics}) of the newest checkpoint in workdir, on the evaluation split."""
  described, setup, state = restore_newest(workdir, config)
  dataset = get_dataset(described.config, statistics=described.statistics)
  p_eval_step = jax.jit(functools.partial(eval_step, setup=setup), static_argnames="crops")
  return int(state.step), {c: evaluate(state, dataset, described.config, p_eval_step, setup.batch_rows, c)
                           for c in crops}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains to config.num_epochs (or num_steps), resuming from the newest checkpoint in `workdir` that restores;
  returns the final eval metrics. The run holds the workdir alone (workdirs.claim); SIGTERM, SIGINT or SIGHUP stop it after a step,
  the same on every process, with that step saved (guard.Interrupted); a non-finite loss or state stops it without
  saving (guard.Diverged)."""
  config = validate(config)
  # `closing` closes the metric writer and the feed on the way out of an error too: tensorboardX's own clean-up at
  # exit would print a traceback, and the feed's data workers would outlive the run.
  with (workdirs.claim(workdir, lock=jax.process_index() == 0), guard.Signals() as signals,
        contextlib.ExitStack() as closing):
    return _train_and_evaluate(config, workdir, signals, closing)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, signals: guard.Signals,
                        closing: contextlib.ExitStack) -> dict:
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
  described = run.describe(config, dataset, setup.net.table)
  writer = MetricWriter(workdir, resume_step=start) if distributed.is_writer() else None  # one process writes
  if writer:
    closing.callback(writer.close)
    run.write(workdir, described)
    if start == 0:
      writer.write_config(config)
  steps = stepping(config, setup)
  p_eval_step = jax.jit(functools.partial(eval_step, setup=setup), static_argnames="crops")
  print(f"{config.network}: {sum(x.size for x in jax.tree.leaves(state.params)):,} parameters, "
        f"mesh {dict(setup.mesh.shape)} on {setup.mesh.devices.flat[0].platform}, "
        f"steps {start}→{setup.total_steps}, workdir {workdir}", flush=True)
  state = steps.enter(state)

  cached = cache_rule(config, setup, dataset, steps, state, key, start)
  batches = train_batches(dataset, config.batch_size, rows=setup.batch_rows.process_rows(config.batch_size),
                          cached=cached)
  with guard.left_to_this_thread():
    batches_on_device = Feed(iterate(batches, start, input_workers(config)), putter(config, setup, dataset, cached))
  closing.callback(batches_on_device.close)
  eval_metrics, sums, t0, logged, skipped = {}, None, time.time(), start, 0
  diverged = signalled = None  # (step, what) once the loss or the state is not finite; a signal (guard.py)
  collapse, dead_logs, dead_since = None, 0, None  # guard.Collapsed, once COLLAPSE_LOGS logs in a row say so
  stall = guard.Stall(start, dataset.num_classes, dataset.num_train // config.batch_size)
  bar = tqdm.tqdm(total=setup.total_steps, initial=start, unit="step", dynamic_ncols=True, mininterval=2.0,
                  disable=not distributed.is_writer())
  for step in range(start, setup.total_steps):
    batch, skipped_here = next(batches_on_device)
    skipped += skipped_here
    state, m = steps.step(state, batch, key)
    del batch  # on CPU it can be a view of a worker's shared memory, which Grain releases when it is let go
    lr = m.pop("learning_rate")
    sums = guard.accumulate(sums, m)
    done = step + 1
    signalled = signals.check(done)  # the same step on every process
    if done % config.log_every_steps == 0 or done == setup.total_steps:
      window = jax.device_get(sums)
      train = summarise(window)
      train |= dict(learning_rate=float(lr), logit_spread=float(window["logit_spread"]),
                    steps_at_chance=stall.steps(window, done),
                    steps_per_sec=(done - logged) / (time.time() - t0), skipped_images=skipped)
      if writer:
        writer.write("train", done, train)
      bar.set_postfix(loss=f"{train['loss']:.3f}", top1=f"{train['top1']:.3f}")
      if said := stall.message(train["steps_at_chance"], done, train["loss"]):
        bar.write(said)
        if writer:
          writer.note(done, said)
      if (bad := guard.first_nonfinite(window)) is not None:
        diverged = bad, guard.NONFINITE_LOSS
      dead = guard.collapsed(window, train, dataset.num_classes)
      dead_logs, dead_since = (dead_logs + 1, dead_since or logged + 1) if dead else (0, None)
      if dead_logs == guard.COLLAPSE_LOGS:
        collapse = guard.Collapsed(done, dead_since, train["loss"], dataset.num_classes)
      sums, t0, logged = None, time.time(), done
    stopping = diverged or collapse
    evaluating = (done % config.eval_every_steps == 0 or done == setup.total_steps) and not (stopping or signalled)
    saving = (done % config.checkpoint_every_steps == 0 or done == setup.total_steps or signalled) and not stopping
    if saving and not guard.all_finite(state):  # never write a non-finite state
      saving, diverged = False, (done, "a non-finite state")
    if evaluating or saving:
      jax.block_until_ready(state)  # the steps queued so far are training time; what follows is not
      pause, held = time.time(), steps.leave(state)
    if evaluating:
      eval_metrics = evaluate(held, dataset, config, p_eval_step, setup.batch_rows)
      if writer:
        writer.write("eval", done, eval_metrics)
      bar.write(f"step {done}: eval loss {eval_metrics['loss']:.4f}  top-1 {eval_metrics['top1']:.4f}  "
                f"top-5 {eval_metrics['top5']:.4f}")
    if saving:
      checkpoints.save(manager, done, held, data_position(config, dataset, done), described)
    if evaluating or saving:
      t0 += time.time() - pause  # steps_per_sec times the training steps alone
    bar.update(1)
    if diverged or collapse or signalled:
      break
  bar.close()
  closing.close()  # the feed (its thread and worker processes, if any) and the metric writer
  checkpoints.wait(manager)
  if diverged:
    raise guard.Diverged(*diverged, manager.latest_step(), manager.directory, first=diverged == (start + 1, guard.NONFINITE_LOSS))
  if collapse:
    raise collapse
  if signalled:
    raise guard.Interrupted(signalled, done, manager.directory)
  state = steps.leave(state)
  if not eval_metrics:  # nothing left to train: report on the restored state
    eval_metrics = evaluate(state, dataset, config, p_eval_step, setup.batch_rows)
  colour = write_pictures(workdir, setup, state, config)
  if colour:
    print("conv1 colour specialisation: " + ", ".join(f"{k.split('_')[-1]} {v:.3f}" for k, v in colour.items()))
  return eval_metrics


def cache_rule(config, setup: Setup, dataset, steps: Stepping, state, key, start: int) -> cache.Rule | None:
  """The cache's rule for a run that starts at step `start` (config.dataset.cache 'device', 'sharded' or 'host'),
  sized where config.dataset.cache_bytes leaves it to the memory: the devices' beside the compiled step, or the
  host's; None without a cache."""
  if config.dataset.cache == "none":
    return None
  limit = config.dataset.cache_bytes
  if config.dataset.cache == "host":
    slots, where = cache.host_slots(limit, dataset.num_train, dataset.size), "in this process's memory"
  else:
    need = 0 if limit else step_bytes(steps.step, setup, dataset, config.batch_size, state, key)
    shards = setup.batch_rows.blocks if config.dataset.cache == "sharded" else 1
    slots = cache.slots(limit, dataset.num_train, dataset.size, setup.mesh, need, shards)
    where = "on each device" if shards == 1 else f"over {shards} devices' memory (a block on each)"
  rule = cache.Rule(slots, dataset.num_train, config.batch_size, setup.batch_rows.blocks, start)
  print(f"cache: {slots:,} of {dataset.num_train:,} training images {where} "
        f"({slots * cache.image_bytes(dataset.size) / 2**30:.1f} GiB), read there from step "
        f"{min(setup.total_steps, rule.fill_end // config.batch_size)}", flush=True)
  return rule


def step_bytes(step, setup: Setup, dataset, batch_size: int, state, key) -> int:
  """The device memory that the compiled training step `step` takes beyond its arguments (XLA's temporaries and
  outputs) on batches of `batch_size` stored images of the dataset, or 4 GiB where the step cannot say (pmap's)."""
  example = random_batch(batch_size, setup.image_size, dataset.num_classes, size=dataset.size)
  example = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=setup.batch_rows.sharding(v.ndim))
             for k, v in example.items()}
  try:
    analysis = step.lower(state, example, key).compile().memory_analysis()
    return int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes)
  except (AttributeError, NotImplementedError, TypeError):
    return 4 << 30


def input_workers(config) -> int:
  """config.dataset.workers, with -1 resolved: none on CPU (XLA's compute needs the cores), else a process per 2
  cores, which fed training fastest of the splits of a 32-core host into processes and threads tried
  (docs/BENCHMARKS.md)."""
  if config.dataset.workers >= 0:
    return config.dataset.workers
  return 0 if jax.default_backend() == "cpu" else max(1, (os.cpu_count() or 4) // 2)


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


def weights_from(path: str, setup: Setup, params):
  """`params` (on the mesh) replaced by those of a weights file in the PyTorch/Caffe layout, placed like them; a last
  layer of another number of classes stays as `params` made it (interchange.start_from)."""
  fresh = multihost_utils.process_allgather(params, tiled=True)
  loaded = interchange.start_from(path, setup.net.table, setup.image_size, fresh)
  return jax.tree.map(lambda x, like: jax.make_array_from_callback(like.shape, like.sharding, lambda i: x[i]),
                      loaded, params)


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
