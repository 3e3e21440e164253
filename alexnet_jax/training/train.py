"""The train and eval steps, in the shape of flax's imagenet example: a Setup that the config fixes,
create_train_state, train_step and eval_step; the loop that runs them is loop.py.

A step receives batches of stored uint8 images with the host's draws (data/pipeline.py's contract) placed as the
setup's `batch_layout` say, and cuts, flips, shifts and normalises the crops on the devices (data/device_augment.py)
before the network reads them where its placement plan wants them.
"""

import dataclasses
import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from alexnet_jax.config import MAX_STEPS, network_table
from alexnet_jax.data import device_augment
from alexnet_jax.data.device_batches import BatchLayout
from alexnet_jax.data.statistics import IMAGENET
from alexnet_jax.network import placement, sharding
from alexnet_jax.network.model import Network
from alexnet_jax.network.table import Table
from alexnet_jax.training import guard
from alexnet_jax.training.step_input import eval_input, model_input, placed


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any  # float32, as the optimiser updates them
  opt_state: Any
  # Kernels in the network's narrower compute dtype (compute_kernels), written by the update that writes the params:
  # the step would otherwise convert them before reading them (fc6's: 151 MB read and 75 MB written a step). The
  # step holds them (Stepping.into_step); checkpoints, evaluation and exports see None.
  compute_kernels: Any = None


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything that a config fixes before training: the network (its table in `net.table`), its mesh and placement
  plan, where the host puts batches, and the optimiser."""

  net: Network
  mesh: jax.sharding.Mesh
  plan: placement.Plan
  batch_layout: BatchLayout  # how a batch's rows lie on the mesh as the host puts them
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  total_steps: int
  image_size: int  # the crop the network sees, cut on the device from the stored images
  mean: tuple  # the dataset's RGB statistics, [0, 1] units
  std: tuple
  label_smoothing: float = 0.0  # the targets' share spread over every class


def make_setup(config, num_classes: int, num_train: int, mean=IMAGENET.mean, std=IMAGENET.std,
               table: Table | None = None) -> Setup:
  """The setup of `config` for a dataset of `num_classes`, `num_train` examples and these statistics; `table` in
  place of the registered network's (a run's own, from its run.json)."""
  table = table or network_table(config, num_classes)
  if table.towers != config.towers:
    raise ValueError(f"network {config.network!r} has {table.towers} towers, but config.towers={config.towers}")
  mesh = sharding.make_mesh(config.mesh.model, config.mesh.data)
  plan = placement.plan(table, config.strategy, mesh.shape["model"], mesh.shape["data"])
  net = Network(plan.table, dtype=jnp.dtype(config.dtype), weight_init=config.weight_init, plan=plan,
                backend=config.kernel_backend)
  if config.batch_size % mesh.size or config.eval_batch_size % mesh.size:
    raise ValueError(f"config.batch_size and eval_batch_size must be divisible by the mesh's {mesh.size} devices "
                     "(each receives its own rows)")
  # Each device receives the rows its first layer reads; or only its own, the crops then gathered over 'model' on
  # the devices (config.gather_input), which the devices' decoders need: each decodes its own rows.
  spread = config.gather_input or config.dataset.decoder == "gpu"
  rows = BatchLayout(mesh, ("data", "model") if spread else plan.input_axes)
  steps_per_epoch = max(1, num_train // config.batch_size)
  total_steps = config.num_steps or math.ceil(config.num_epochs * steps_per_epoch)
  if total_steps > MAX_STEPS or max((*config.lr_drop_epochs, config.warmup_epochs)) * steps_per_epoch > MAX_STEPS:
    raise ValueError(f"config.num_epochs, lr_drop_epochs and warmup_epochs must stay within {MAX_STEPS:,} steps "
                     f"({steps_per_epoch:,} an epoch here)")
  tx = optax.chain(optax.add_decayed_weights(config.weight_decay),  # added before momentum, as the paper's rule
                   optax.sgd(schedule := learning_rates(config, steps_per_epoch, max(1, total_steps)),
                             momentum=config.momentum))
  return Setup(net, mesh, plan, rows, tx, schedule, max(1, total_steps), config.image_size,
               tuple(map(float, mean)), tuple(map(float, std)), config.label_smoothing)


def learning_rates(config, steps_per_epoch: int, total_steps: int) -> optax.Schedule:
  """The paper's: config.learning_rate divided by 10 after each of lr_drop_epochs; or (lr_schedule 'cosine')
  decayed to 0 over the run; either after a linear warm-up over warmup_steps (or warmup_epochs)."""
  if config.lr_schedule == "steps":
    base = optax.piecewise_constant_schedule(
        config.learning_rate, {int(e * steps_per_epoch): 0.1 for e in config.lr_drop_epochs})
  else:
    base = optax.cosine_decay_schedule(config.learning_rate, total_steps)
  warmup = config.warmup_steps or int(config.warmup_epochs * steps_per_epoch)
  if not warmup:
    return base
  return lambda step: base(step) * jnp.minimum(1.0, (step + 1) / warmup)


def dataset_setup(config, dataset) -> Setup:
  """make_setup for a dataset: its classes, size and pixel statistics."""
  return make_setup(config, dataset.num_classes, dataset.num_train, dataset.statistics.mean, dataset.statistics.std)


def create_train_state(setup: Setup, key) -> TrainState:
  """Initialises the state on the mesh, each tower's weights and their momentum on the tower's device."""
  return train_state_init(setup)(key)


def train_state_init(setup: Setup):
  """The jitted `key -> TrainState` of create_train_state; its `.eval_shape(key)` gives the state's shapes and
  shardings without computing it (what an export is traced with)."""
  return placed_init(setup, functools.partial(initial_params, setup),
                     lambda params: sharding.param_shardings(setup.mesh, setup.net, params))


def initial_params(setup: Setup, key) -> dict:
  """The network's parameters as create_train_state draws them from `key`, unplaced."""
  s = setup.image_size
  # Every tower on one device, where the mesh's plan would spread them: each weight drawn whole.
  return setup.net.clone(plan=None).init(key, jnp.zeros((3, s, s, 1)), train=False)["params"]


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


def logits_fn(setup: Setup):
  """forward(params, NHWC images, key, train) → logits (N, classes): the setup's network on its mesh."""
  apply = sharding.sharded_apply(setup.net, setup.mesh)
  return lambda params, images, key, train: apply(params, jnp.transpose(images, (3, 1, 2, 0)), key, train)


def metrics_of(logits, labels, mask=None):
  """Sums of loss, top-1 and top-5 hits and example count (masked examples count for nothing)."""
  with jax.named_scope("metrics"):
    mask = jnp.ones(labels.shape, bool) if mask is None else mask
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    # The label's rank as a stable top_k orders the classes (ties to the lower index), counted elementwise: XLA does
    # not split top_k's sort over the devices that hold the rows, and would gather every device's logits first.
    classes = jnp.arange(logits.shape[-1])
    label = classes == labels[:, None]
    own = jnp.sum(jnp.where(label, logits, 0), axis=-1, keepdims=True)
    rank = jnp.sum((logits > own) | ((logits == own) & (classes < labels[:, None])), axis=-1)
    # Every comparison with a NaN is false, which would rank the label first: a row not all finite hits nothing.
    rank = jnp.where(jnp.all(jnp.isfinite(logits), axis=-1), rank, jnp.iinfo(rank.dtype).max)
    return dict(loss=jnp.sum(loss * mask), top1=jnp.sum((rank < 1) * mask), top5=jnp.sum((rank < 5) * mask),
                count=jnp.sum(mask))


def train_step(state: TrainState, batch: dict, key, *, setup: Setup, forward=None, pmap_axis: str | None = None):
  """One SGD step; the dropout key is folded with the step so that a resumed run draws the same masks.

  `forward` (params, NHWC images, key, train) → logits stands in for the setup's network (the benchmark's
  plain-XLA one, pmap's). Under jax.pmap, `pmap_axis` names the axis whose devices each took their own rows: the
  gradients are averaged and the metrics summed over it.
  """
  forward = forward or logits_fn(setup)
  key = jax.random.fold_in(key, state.step)
  with jax.named_scope("labels"):
    labels = batch["label"] if pmap_axis else placed(setup, batch["label"], setup.plan.output_axes)

  def loss_fn(params):
    logits = forward(params, model_input(setup, batch, place=not pmap_axis), key, True)
    with jax.named_scope("loss"):
      if setup.label_smoothing:
        targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), setup.label_smoothing)
        loss = optax.softmax_cross_entropy(logits, targets).mean()
      else:
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss, logits

  narrow = state.compute_kernels is not None
  read = state.params
  if narrow:  # each narrowed kernel as float32 values, exactly its own: XLA drops the network's conversion back, and
    # the gradients are computed as where the network converts the float32 params (read bf16 directly, they came out
    # otherwise rounded on one CPU device)
    read = {name: layer | jax.tree.map(lambda k: k.astype(jnp.float32), state.compute_kernels.get(name, {}))
            for name, layer in state.params.items()}
  (_, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(read)
  metrics = metrics_of(logits, labels)
  if pmap_axis:
    # Every device's rows weigh the same: the mean of means is the global mean. One pmean per layer, in its name's
    # scope, so that the compiled step's all-reduces say whose gradients they carry (the comm report).
    grads = {name: _named_pmean(name, g, pmap_axis) for name, g in grads.items()}
    metrics = lax.psum(metrics, pmap_axis)
  updates, opt_state = setup.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  with jax.named_scope("metrics"):  # where the rows are spread (data parallelism), the spread's max and min are reduced
    metrics |= dict(learning_rate=setup.schedule(state.step)) | guard.step_health(state.step, metrics, logits)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                       compute_kernels=compute_kernels(setup, params) if narrow else None), metrics


def _named_pmean(name: str, tree, axis: str):
  with jax.named_scope(name):
    return lax.pmean(tree, axis)


CROPS = (1, 5, 10)  # the centre crop; the four corners' and the centre's; those and their mirrors (the paper's)


def multi_crop(config) -> int:
  """The many-crop evaluation that fits a run of `config`: the paper's 10 where training mirrored its crops, else
  the 5 unmirrored, as a mirror is an image such a run never saw (and a mirrored grating or letter may be another
  class). The procedural set is never cropped nor mirrored."""
  return 10 if config.dataset.flip and config.dataset.name != "procedural" else 5


def class_log_probs(setup: Setup, params, images: jax.Array, crops: int = 1) -> jax.Array:
  """log p(class | image) (N, classes) for stored uint8 images (N, S, S, 3): of their centre crops (crops=1), or the
  log of the mean softmax of 5 crops (corners and centre) or the paper's 10 (and their mirrors), cut on the
  device."""
  forward, key = logits_fn(setup), jax.random.key(0)  # no dropout outside training: the key is unused
  if crops == 1:
    return jax.nn.log_softmax(forward(params, eval_input(setup, images), key, False).astype(jnp.float32))
  if crops not in CROPS:
    raise ValueError(f"crops must be 1 (centre), 5 (corners and centre) or 10 (and their mirrors), got {crops}")
  n, s = images.shape[0], setup.image_size
  with jax.named_scope("input"):
    tens = placed(setup, device_augment.ten_crops(images, s)[:, :crops], setup.plan.input_axes)
    tens = device_augment.normalise(tens, None, setup.mean, setup.std).reshape(n * crops, s, s, 3)
  probs = jax.nn.softmax(forward(params, tens, key, False).astype(jnp.float32)).reshape(n, crops, -1).mean(1)
  return jnp.log(probs + 1e-30)  # finite where a mean is 0


def eval_step(state: TrainState, batch: dict, *, setup: Setup, crops: int = 1):
  """Metrics of one evaluation batch of stored images (N, S, S, 3) on `crops` (class_log_probs); 5 or 10 crops are
  scored by their mean softmax, the loss then the cross-entropy of that mean."""
  with jax.named_scope("labels"):
    labels, mask = (placed(setup, batch[k], setup.plan.output_axes) for k in ("label", "mask"))
  return metrics_of(class_log_probs(setup, state.params, batch["image"], crops), labels, mask)


@dataclasses.dataclass(frozen=True)
class Stepping:
  """How the training loop steps: `step(state, batch, key)` → (state, metrics) on batches that the setup's
  `batch_layout` placed, and the state as the step holds it (`into_step`) from the state as checkpoints, evaluation
  and pictures hold it, and back (`out_of_step`)."""

  step: Any
  into_step: Any = lambda state: state
  out_of_step: Any = lambda state: state


def compute_kernels(setup: Setup, params) -> dict:
  """{layer: {'kernel': …}}: the kernels that the network reads in a compute dtype narrower than their float32,
  narrowed; not those whose gradients are summed over devices, which are summed in float32 (placement.Plan.traffic),
  nor the biases, which it adds in float32."""
  if setup.net.dtype == jnp.float32:
    return {}
  return {name: {"kernel": layer["kernel"].astype(setup.net.dtype)} for name, layer in params.items()
          if "kernel" in layer and setup.plan.gradient_summed_over(name) == 1}


def with_compute_kernels(setup: Setup, state: TrainState) -> TrainState:
  """The state with its compute_kernels, each placed as its kernel (none: the state as it is); of arrays, or of
  their shapes (jax.eval_shape's)."""
  narrow = functools.partial(compute_kernels, setup)
  kernels = jax.eval_shape(narrow, state.params)
  if not kernels:
    return state
  narrow = jax.jit(narrow, out_shardings={name: {"kernel": state.params[name]["kernel"].sharding} for name in kernels})
  abstract = isinstance(jax.tree.leaves(state.params)[0], jax.ShapeDtypeStruct)
  return state.replace(compute_kernels=jax.eval_shape(narrow, state.params) if abstract else narrow(state.params))


def without_compute_kernels(state: TrainState) -> TrainState:
  return state.replace(compute_kernels=None)


def jitted(setup: Setup) -> Stepping:
  return Stepping(jax.jit(functools.partial(train_step, setup=setup), donate_argnums=0),
                  functools.partial(with_compute_kernels, setup), without_compute_kernels)
