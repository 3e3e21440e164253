"""Training and evaluation, in the shape of flax's imagenet example: create_train_state, train_step, eval_step and
train_and_evaluate, which runs the loop with evaluation, TensorBoard and JSONL metrics, and orbax checkpoints that a
rerun of the same command resumes from.
"""

import dataclasses
import functools
import math
import os
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from alexnet_jax import checkpoints, distributed, guard, parallel, pictures, workdirs
from alexnet_jax.config import validate
from alexnet_jax.data import DataError, device_augment, eval_batches, get_dataset, iterate, nvdecode, train_batches
from alexnet_jax.data.feed import Feed
from alexnet_jax.data.statistics import IMAGENET
from alexnet_jax.metrics import MetricWriter
from alexnet_jax.model import Network
from alexnet_jax.networks import get_network, with_strategy


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything that a config fixes before training: the network (its table in `net.table`), its mesh and the
  optimiser."""

  net: Network
  mesh: jax.sharding.Mesh
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  total_steps: int
  image_size: int  # the crop the network sees, cut on the device from the stored images
  mean: tuple  # the dataset's RGB statistics, [0, 1] units
  std: tuple


def make_setup(config, num_classes: int, num_train: int, mean=IMAGENET.mean, std=IMAGENET.std) -> Setup:
  table = get_network(config.network, num_classes=num_classes, width=config.width, towers=config.towers,
                      lrn_alpha_over_n=config.lrn_alpha_over_n)
  if table.towers != config.towers:
    raise ValueError(f"network {config.network!r} has {table.towers} towers, but config.towers={config.towers}")
  if config.strategy != "table":
    table = with_strategy(table, config.strategy)
  net = Network(table, dtype=jnp.dtype(config.dtype), weight_init=config.weight_init, backend=config.kernel_backend)
  mesh = parallel.make_mesh(config.mesh.model, config.mesh.data)
  if config.batch_size % mesh.size or config.eval_batch_size % mesh.size:
    raise ValueError(f"config.batch_size and eval_batch_size must be divisible by the mesh's {mesh.size} devices "
                     "(each receives its own rows)")
  steps_per_epoch = max(1, num_train // config.batch_size)
  total_steps = max(1, math.ceil(config.num_epochs * steps_per_epoch))
  # The paper divides the learning rate by 10 three times; boundaries are given in epochs.
  schedule = optax.piecewise_constant_schedule(
      config.learning_rate, {int(e * steps_per_epoch): 0.1 for e in config.lr_drop_epochs})
  # Decay is added to the gradient before momentum, as in the paper's update rule.
  tx = optax.chain(optax.add_decayed_weights(config.weight_decay),
                   optax.sgd(schedule, momentum=config.momentum))
  return Setup(net, mesh, tx, schedule, total_steps, config.image_size, tuple(map(float, mean)),
               tuple(map(float, std)))


def dataset_setup(config, dataset) -> Setup:
  """make_setup for a dataset: its classes, size and pixel statistics."""
  return make_setup(config, dataset.num_classes, dataset.num_train, dataset.statistics.mean, dataset.statistics.std)


def create_train_state(setup: Setup, config, key) -> TrainState:
  """Initialises the state on the mesh, each tower's weights and their momentum on the tower's device."""
  return train_state_init(setup, config)(key)


def train_state_init(setup: Setup, config):
  """The jitted `key -> TrainState` of create_train_state; its `.eval_shape(key)` gives the state's shapes and
  shardings without computing it (what an export is traced with)."""
  s = config.image_size
  return placed_init(setup, lambda key: setup.net.init(key, jnp.zeros((3, s, s, 1)), train=False)["params"],
                     lambda params: parallel.param_shardings(setup.mesh, setup.net, params))


def placed_init(setup: Setup, init_params, shardings):
  """The jitted `key -> TrainState` of the parameters init_params(key) for setup's optimiser, made where
  shardings(parameter shapes) places them."""

  def init(key):
    params = init_params(key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=setup.tx.init(params))

  shapes = jax.eval_shape(init, jax.random.key(0))  # shapes only: any key
  replicated = NamedSharding(setup.mesh, P())
  params = shardings(shapes.params)
  # XLA does not carry the parameters' placement over to zeros made from them: each weight's momentum is given
  # its weight's sharding, or it would all land on one device.
  opt_state = optax.tree_utils.tree_map_params(setup.tx, lambda _, sharding: sharding, shapes.opt_state, params,
                                               transform_non_params=lambda _: replicated)
  return jax.jit(init, out_shardings=TrainState(step=replicated, params=params, opt_state=opt_state))


def check_batch(batch: dict, size: int, image_size: int) -> None:
  """Raises one ValueError if a training batch breaks the contract (pipeline.py) for stored images of side `size`
  and crops of `image_size`: offsets out of range would be clamped on the device, silently. A batch for the
  devices to decode (decoder 'gpu') carries JPEGs instead of images: its draws and labels are checked."""
  n = len(batch["label"]) if "label" in batch else 0
  expected = dict(image=((n, size, size, 3), "uint8"), offset=((n, 2), "int32"), flip=((n,), "bool"),
                  shift=((n, 3), "float32"), label=((n,), "int32"))
  keys = list(batch)
  if "jpeg" in batch:
    del expected["image"]
    keys = [k for k in keys if k in expected]
  got = {k: (np.shape(batch[k]), np.asarray(batch[k]).dtype.name) for k in keys}
  if got != expected:
    raise ValueError(f"expected a batch of {_described(expected)}; got {_described(got)}")
  if n and (batch["offset"].min() < 0 or batch["offset"].max() > size - image_size):
    raise ValueError(f"crop offsets must lie in [0, {size - image_size}] ({size}-pixel images, {image_size}-pixel "
                     f"crops), got {batch['offset'].min()}..{batch['offset'].max()}")


def _described(spec: dict) -> str:
  return ", ".join(f"{k} {shape} {dtype}" for k, (shape, dtype) in spec.items())


def random_batch(n: int, image_size: int, num_classes: int, seed: int = 0, size: int | None = None) -> dict:
  """A training batch of random pixels, crops, flips and labels, for benchmarks and tests of the step alone: images
  of side `size` (default image_size: the crops are the whole images) and no colour shift."""
  rng = np.random.default_rng(seed)
  size = size or image_size
  return dict(image=rng.integers(0, 256, (n, size, size, 3), np.uint8),
              offset=rng.integers(0, size - image_size + 1, (n, 2)).astype(np.int32),
              flip=rng.random(n) < 0.5, shift=np.zeros((n, 3), np.float32),
              label=rng.integers(0, num_classes, n).astype(np.int32))


def batch_sharding(mesh, ndim: int) -> NamedSharding:
  """A batch's rows spread over every device of the mesh, 'data' major: the host sends each device its own rows
  (on one host, half the bytes per GPU of sending the towers the whole batch each), and the step gathers the crops
  over 'model' on the devices (model_input)."""
  return NamedSharding(mesh, P(("data", "model"), *(None,) * (ndim - 1)))


def process_rows(mesh, n: int) -> slice:
  """The rows of an n-row batch that this process's devices hold under batch_sharding: the share it reads. One
  process holds them all; under several, each its devices' block, whatever the mesh, so that the global batch is
  the one a single process would read."""
  held = batch_sharding(mesh, 1).addressable_devices_indices_map((n,)).values()
  blocks = sorted({(s.start or 0, n if s.stop is None else s.stop) for s, in held})
  if not blocks or any(a[1] != b[0] for a, b in zip(blocks, blocks[1:])):
    raise ValueError(f"process {jax.process_index()}'s devices hold rows {blocks} of the batch, not one consecutive "
                     "block: order the mesh's devices by process")
  return slice(blocks[0][0], blocks[-1][1])


def put_batch(mesh, batch: dict) -> dict:
  """Places this process's share of a batch on the mesh, its rows spread over the devices (batch_sharding)."""
  return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(v)), v) for k, v in batch.items()}


def device_put_fn(config, setup: Setup, dataset):
  """put(host batch) → finish, finish() → (device batch, images skipped on the device), as data.feed.Feed takes
  it: put_batch of the host's images, or, where the devices decode (dataset.decoder 'gpu'), their JPEGs handed to
  the devices' decoding processes, collected by finish."""
  if dataset.decoder != "gpu":
    def put(batch):
      check_batch(batch, dataset.size, setup.image_size)
      on_device = put_batch(setup.mesh, batch)
      return lambda: (on_device, 0)
    return put
  rows = process_rows(setup.mesh, config.batch_size)
  share = rows.stop - rows.start
  decoder = nvdecode.DeviceDecoder(batch_sharding(setup.mesh, 4), config.batch_size, dataset.train, nvdecode.THREADS,
                                   config.dataset.gpu_backends)

  def put_decoded(batch):
    check_batch(batch, dataset.size, setup.image_size)
    if len(batch["label"]) != share:
      raise ValueError(f"expected {share} images in this process's batch, got {len(batch['label'])}")
    decoded = decoder.start(batch)

    def finish():
      images, labels, skipped = decoded()
      rest = dict(offset=batch["offset"], flip=batch["flip"], shift=batch["shift"], label=labels)
      return dict(image=images, **put_batch(setup.mesh, rest)), skipped
    return finish
  put_decoded.close = decoder.close  # its decoding processes: Feed.close stops them
  put_decoded.seconds = decoder.seconds  # where the decoding's time went, for benchmarks
  return put_decoded


def normalise(setup: Setup, images: jax.Array, shift: jax.Array | None = None) -> jax.Array:
  """Float32 images from uint8 (N, …, 3), each shifted in colour by its (N, 3) shift, normalised by the dataset's
  mean and std. Done on the device: the host sends a quarter of the bytes, and its cores decode instead."""
  images = images.astype(jnp.float32) / 255
  if shift is not None:
    images = images + shift.reshape(shift.shape[0], *(1,) * (images.ndim - 2), 3)
  return (images - jnp.array(setup.mean)) / jnp.array(setup.std)


def model_input(setup: Setup, batch: dict) -> jax.Array:
  """A training batch's network input: each stored image's crop, flipped and shifted as the host drew them,
  normalised."""
  crops = device_augment.crop_flip(batch["image"], batch["offset"], batch["flip"], setup.image_size)
  # Fused into the write of the network's CHWN input (batch fastest), the crops' gather would read one byte per
  # 32-byte sector of the NHWC images; cut out first, the crops go through XLA's tiled transpose instead.
  crops = jax.lax.optimization_barrier(crops)
  return normalise(setup, _towers_gather(setup, crops), _towers_gather(setup, batch["shift"]))


def _towers_gather(setup: Setup, rows: jax.Array, end: str = "input") -> jax.Array:
  """Per-image rows spread over every device (batch_sharding), placed where the network's `end` layer ('input' or
  'output') reads or writes its batch: gathered over 'model' where that layer's towers each see the whole batch —
  images while still uint8 crops, the fewest bytes they can be sent in; shifts, labels and masks before anything
  combines them with the towers' work (else XLA would gather the float images, or reduce the metrics over every
  device). A layer placed 'data' keeps its own rows, and nothing moves."""
  axes = parallel.batch_axes(setup.net, end)
  return jax.lax.with_sharding_constraint(rows, NamedSharding(setup.mesh, P(axes)))


def eval_input(setup: Setup, images: jax.Array) -> jax.Array:
  """An evaluation batch's network input: the centre crops of the stored uint8 images (N, S, S, 3), normalised."""
  return normalise(setup, _towers_gather(setup, device_augment.center_crop(images, setup.image_size)))


def logits_fn(setup: Setup):
  apply = parallel.sharded_apply(setup.net, setup.mesh)
  return lambda params, images, key, train: apply(params, jnp.transpose(images, (3, 1, 2, 0)), key, train)


def metrics_of(logits, labels, mask=None):
  """Sums of loss, top-1 and top-5 hits and example count (masked examples count for nothing)."""
  mask = jnp.ones(labels.shape, bool) if mask is None else mask
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  _, top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))
  hits = top5 == labels[:, None]
  return dict(loss=jnp.sum(loss * mask), top1=jnp.sum(hits[:, 0] * mask), top5=jnp.sum(hits.any(-1) * mask),
              count=jnp.sum(mask))


def train_step(state: TrainState, batch: dict, key, *, setup: Setup, forward=None):
  """One SGD step; the dropout key is folded with the step so that a resumed run draws the same masks. `forward`
  (params, NHWC images, key, train) → logits stands in for the setup's network (the benchmark's plain-XLA one)."""
  forward = forward or logits_fn(setup)
  key = jax.random.fold_in(key, state.step)
  labels = _towers_gather(setup, batch["label"], "output")

  def loss_fn(params):
    logits = forward(params, model_input(setup, batch), key, True)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss, logits

  (_, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = setup.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = metrics_of(logits, labels) | dict(learning_rate=setup.schedule(state.step))
  metrics |= guard.step_health(state.step, metrics["loss"])
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(state: TrainState, batch: dict, *, setup: Setup, crops: int = 1):
  """Metrics of one evaluation batch of stored images (N, S, S, 3), on their centre crops (crops=1) or the paper's 10
  crops, cut on the device; 10 crops are scored by their mean softmax (the loss is then the cross-entropy of that
  mean)."""
  forward, s = logits_fn(setup), setup.image_size
  labels, mask = (_towers_gather(setup, batch[k], "output") for k in ("label", "mask"))
  if crops == 1:
    images = eval_input(setup, batch["image"])
    return metrics_of(forward(state.params, images, jax.random.key(0), False), labels, mask)
  if crops != 10:
    raise ValueError(f"crops must be 1 (centre) or 10 (corners, centre and mirrors), got {crops}")
  n = batch["image"].shape[0]
  images = normalise(setup, _towers_gather(setup, device_augment.ten_crops(batch["image"], s)))
  images = images.reshape(n * crops, s, s, 3)
  probs = jax.nn.softmax(forward(state.params, images, jax.random.key(0), False).astype(jnp.float32))
  probs = probs.reshape(n, crops, -1).mean(1)
  return metrics_of(jnp.log(probs + 1e-30), labels, mask)  # finite loss where a mean is 0


@dataclasses.dataclass(frozen=True)
class Stepping:
  """How the training loop steps: `step(state, batch, key)` → (state, metrics) on batches from put_batch, and the
  state as the step holds it (`enter`) from the state as checkpoints, evaluation and pictures hold it, and back
  (`leave`)."""

  step: Any
  enter: Any = lambda state: state
  leave: Any = lambda state: state


def stepping(config, setup: Setup) -> Stepping:
  """train_step jitted, or under config.parallel_api='pmap' pmap's data parallelism (pmap_data.py), which holds a
  replica of the state per device."""
  if config.parallel_api == "pmap":
    from alexnet_jax import pmap_data  # noqa: PLC0415  (it builds on this module)

    return pmap_data.stepping(setup)
  return Stepping(jax.jit(functools.partial(train_step, setup=setup), donate_argnums=0))


def summarise(sums: dict) -> dict:
  """Per-example means from summed metrics: loss, top-1 and top-5 accuracy."""
  n = max(float(sums["count"]), 1.0)
  return {k: float(sums[k]) / n for k in ("loss", "top1", "top5")}


def evaluate(state, dataset, config, p_eval_step, mesh, crops: int = 1) -> dict:
  """Metrics over the evaluation split; p_eval_step is eval_step jitted with `crops` static."""
  total = None
  for batch in eval_batches(dataset, config.eval_batch_size, process_rows(mesh, config.eval_batch_size)):
    m = p_eval_step(state, put_batch(mesh, batch), crops=crops)
    total = m if total is None else jax.tree.map(jnp.add, total, m)
  total = jax.device_get(total)
  return summarise(total) | dict(count=int(total["count"]))


def restore_newest(config, workdir: str):
  """(setup, dataset, state) of the newest checkpoint in workdir, for the scripts that read a finished run."""
  config = validate(config)
  manager = checkpoints.existing(workdir, config)
  dataset = get_dataset(config)
  setup = dataset_setup(config, dataset)
  if manager.latest_step() is None:
    raise ValueError(f"no checkpoint in {os.path.join(workdir, 'checkpoints')}")
  state, _ = checkpoints.restore(manager, create_train_state(setup, config, jax.random.key(config.seed)))
  return setup, dataset, state


def evaluate_checkpoint(config, workdir: str, crops=(1, 10)) -> tuple[int, dict]:
  """(step, {crops: metrics}) of the newest checkpoint in workdir, on the evaluation split."""
  setup, dataset, state = restore_newest(config, workdir)
  p_eval_step = jax.jit(functools.partial(eval_step, setup=setup), static_argnames="crops")
  return int(state.step), {c: evaluate(state, dataset, config, p_eval_step, setup.mesh, c) for c in crops}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains to config.num_epochs, resuming from the newest checkpoint in `workdir` that restores; returns the final
  eval metrics. The run holds the workdir alone (workdirs.claim); SIGTERM or SIGINT stop it after a step, with that
  step saved (guard.Interrupted); a non-finite loss or state stops it without saving (guard.Diverged)."""
  config = validate(config)
  with workdirs.claim(workdir, lock=jax.process_index() == 0), guard.stop_on_signals():
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  dataset = get_dataset(config)
  setup = dataset_setup(config, dataset)
  key = jax.random.key(config.seed)
  state = create_train_state(setup, config, key)
  manager = checkpoints.manager(workdir, config)
  state, position = checkpoints.restore(manager, state, set_aside=True)
  start = int(state.step)
  if position is not None:
    check_position(position, data_position(config, dataset, start))
  writer = MetricWriter(workdir, resume_step=start) if distributed.is_writer() else None  # one process writes
  if writer and start == 0:
    writer.write_config(config)
  steps = stepping(config, setup)
  p_eval_step = jax.jit(functools.partial(eval_step, setup=setup), static_argnames="crops")
  print(f"{config.network}: {sum(x.size for x in jax.tree.leaves(state.params)):,} parameters, "
        f"mesh {dict(setup.mesh.shape)} on {setup.mesh.devices.flat[0].platform}, "
        f"steps {start}→{setup.total_steps}, workdir {workdir}", flush=True)
  state = steps.enter(state)

  batches = train_batches(dataset, config.batch_size, rows=process_rows(setup.mesh, config.batch_size))
  batches_on_device = Feed(iterate(batches, start, input_workers(config)), device_put_fn(config, setup, dataset))
  eval_metrics, sums, t0, logged, skipped = {}, None, time.time(), start, 0
  diverged = signalled = None  # (step, what) once the loss or the state is not finite; a signal (guard.py)
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
    signalled = guard.signalled()
    if done % config.log_every_steps == 0 or done == setup.total_steps:
      window = jax.device_get(sums)
      train = summarise(window)
      train |= dict(learning_rate=float(lr), steps_per_sec=(done - logged) / (time.time() - t0),
                    skipped_images=skipped)
      if writer:
        writer.write("train", done, train)
      bar.set_postfix(loss=f"{train['loss']:.3f}", top1=f"{train['top1']:.3f}")
      sums, t0, logged = None, time.time(), done
      if (bad := guard.first_nonfinite(window)) is not None:
        diverged = bad, "a non-finite loss"
    evaluating = (done % config.eval_every_steps == 0 or done == setup.total_steps) and not (diverged or signalled)
    saving = (done % config.checkpoint_every_steps == 0 or done == setup.total_steps or signalled) and not diverged
    if saving and not guard.all_finite(state):  # never write a non-finite state
      saving, diverged = False, (done, "a non-finite state")
    if evaluating or saving:
      jax.block_until_ready(state)  # the steps queued so far are training time; what follows is not
      pause, held = time.time(), steps.leave(state)
    if evaluating:
      eval_metrics = evaluate(held, dataset, config, p_eval_step, setup.mesh)
      if writer:
        writer.write("eval", done, eval_metrics)
      bar.write(f"step {done}: eval loss {eval_metrics['loss']:.4f}  top-1 {eval_metrics['top1']:.4f}  "
                f"top-5 {eval_metrics['top5']:.4f}")
    if saving:
      checkpoints.save(manager, done, held, data_position(config, dataset, done))
    if evaluating or saving:
      t0 += time.time() - pause  # steps_per_sec times the training steps alone
    bar.update(1)
    if diverged or signalled:
      break
  bar.close()
  batches_on_device.close()  # stops its thread and the worker processes, if any
  checkpoints.wait(manager)
  if writer:
    writer.close()
  if diverged:
    raise guard.Diverged(*diverged, manager.latest_step(), manager.directory)
  if signalled:
    raise guard.Interrupted(signalled, done, manager.directory)
  state = steps.leave(state)
  if not eval_metrics:  # nothing left to train: report on the restored state
    eval_metrics = evaluate(state, dataset, config, p_eval_step, setup.mesh)
  colour = write_pictures(workdir, setup, state)
  if colour:
    print("conv1 colour specialisation: " + ", ".join(f"{k.split('_')[-1]} {v:.3f}" for k, v in colour.items()))
  return eval_metrics


def input_workers(config) -> int:
  """config.dataset.workers, with -1 resolved: none on CPU (XLA's compute needs the cores), else a process per 2
  cores. Measured on the 32-core host of 2×H200 (2026-11-30, the paper's store, batch 512, the training loop's input
  path; docs/BENCHMARKS.md): 16 processes of 4 threads fed 37,236 images/s, 24 of 2 34,214, 8 of 16 24,925, one
  process of 32 threads 5,191."""
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


def write_pictures(workdir: str, setup: Setup, state: TrainState) -> dict:
  """curves.png and the first conv layer's filters per tower (conv1_filters.png) in the workdir, by process 0 (every
  process takes part in gathering the filters from the devices that hold them); {} elsewhere."""
  first = next(layer.name for layer in setup.net.table.layers if layer.kind == "conv")
  kernel = multihost_utils.process_allgather(state.params[first]["kernel"], tiled=True)
  return pictures.write_all(workdir, kernel) if distributed.is_writer() else {}
