"""Placing the network: a ('data', 'model') mesh and the shard_map'd forward pass.

The 'model' axis carries what each layer's `place` puts on it (networks.py): the towers of 'tower' layers (the
paper's two GPUs: size 2, one tower each; size 1 runs both towers on one device as grouped convolutions), slices of
'model' fc layers, a second split of the batch for 'data' layers. The 'data' axis, size 1 in the paper, splits the
batch for further devices. Inside the shard_map every device runs `Network` on its own part; the only collectives
are the ones the layer table asks for. Gradients come from differentiating through the shard_map, which sums each
weight's gradient over the axes its batch was split over.
"""

import functools

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from alexnet_jax.model import Network


def make_mesh(model: int, data: int = 1, devices=None) -> jax.sharding.Mesh:
  """A data × model mesh over the first data·model devices; data=-1 takes every device left."""
  devices = list(devices if devices is not None else jax.devices())
  if data == -1:
    data = len(devices) // model
  if model < 1 or data < 1 or data * model > len(devices):
    raise ValueError(f"a mesh of data={data} × model={model} needs {data * model} devices, but "
                     f"{len(devices)} are available ({devices[0].platform}); on CPU set "
                     "jax_num_cpu_devices (scripts/train.py does this from the config)")
  # Auto axes: outside the shard_map (loss, optimizer) XLA propagates the shardings; explicit axes would make
  # every such op state its output sharding.
  return jax.make_mesh((data, model), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                       devices=devices[: data * model])


def param_specs(net: Network, params, tower_axis: str | None = "model"):
  """Where each weight of `params` (arrays or shapes) lies over `tower_axis`, by its layer's place: a 'tower'
  layer's tower axis (the one bias of a split='sum' layer replicated), a 'model' layer's output axis (split='sum':
  its kernel's input rows, its bias replicated); a 'data' layer's weights are replicated."""
  layers = {layer.name: layer for layer in net.table.layers}

  def spec(path, _):
    name, leaf = (k.key for k in path[-2:])
    layer = layers[name]
    if tower_axis is None or layer.place == "data" or (layer.split == "sum" and leaf == "bias"):
      return P()
    if layer.place == "model":
      return P(None, tower_axis) if layer.split == "sum" or leaf == "bias" else P(None, None, tower_axis)
    return P(tower_axis)

  return jax.tree_util.tree_map_with_path(spec, params)


def batch_axes(net: Network, end: str = "input") -> tuple[str, ...]:
  """The mesh axes the batch is split over at the network's input (or output, end='output'): 'data', and 'model'
  too where that end's layer is placed 'data'."""
  layer = net.table.layers[0 if end == "input" else -1]
  return ("data", "model") if layer.place == "data" else ("data",)


def param_shardings(mesh, net: Network, params):
  """Where each weight lives on the mesh: each device holds its own towers."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(net, params))


def shard_params(mesh, net: Network, params):
  """Places host parameters (all towers) on the mesh."""
  return jax.device_put(params, param_shardings(mesh, net, params))


def _check_split(params, specs, mesh) -> None:
  """One line for a weight that its layer's place cannot split over the mesh (e.g. 10 classes over 4 devices)."""
  leaves = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))
  for (path, x), spec in zip(jax.tree_util.tree_leaves_with_path(params), leaves):
    for size, axis in zip(x.shape, spec):
      if axis and size % mesh.shape[axis]:
        layer, leaf = (k.key for k in path[-2:])
        raise ValueError(f"layer {layer}: its {leaf} {tuple(x.shape)} does not split over the {mesh.shape[axis]} "
                         f"devices of '{axis}'")


def sharded_apply(net: Network, mesh):
  """Returns apply(params, images_chwn, dropout_key, train) → logits (N, classes), batch split over 'data'.

  `net` is the module with all towers local; inside the shard_map it is rebuilt for the device's share. Only mesh
  axes of more than one device are manual: an axis of one device would add collectives that move nothing. The
  interpreter backend is the exception: its host callbacks need every mesh axis manual. Backend 'auto' stages the
  network twice, with the Triton kernels and with the XLA references, and the lowering platform picks one.
  """
  model_size = mesh.shape["model"]
  if net.table.placed("tower") and net.table.towers % model_size:
    raise ValueError(f"{net.table.towers} towers cannot be spread evenly over a model axis of {model_size} devices")
  manual = {axis for axis in ("data", "model") if mesh.shape[axis] > 1 or net.backend == "interpret"}
  batch_in, batch_out = (tuple(a for a in batch_axes(net, end) if a in manual) or None for end in ("input", "output"))
  local_net = net.clone(tower_axis="model" if "model" in manual else None,
                        batch_axis="data" if "data" in manual else None)

  def run_with(backend):
    node = local_net.clone(backend=backend)

    def apply(params, images, key, train):  # dropout masks are drawn for the global batch (model.Network._dropout)
      return node.apply({"params": params}, images, train=train, rngs={"dropout": key})

    def run(params, images, key, train=False):
      if not manual:
        return apply(params, images, key, train)
      specs = param_specs(net, params, local_net.tower_axis)
      _check_split(params, specs, mesh)
      fn = jax.shard_map(functools.partial(apply, train=train), mesh=mesh, axis_names=manual,
                         in_specs=(specs, P(None, None, None, batch_in), P()), out_specs=P(batch_out, None))
      return fn(params, images, key)

    return run

  if net.backend != "auto":
    return run_with(net.backend)
  # One choice per lowering platform for the whole network, outside the shard_map: inside it, XLA's SPMD pipeline
  # keeps the per-op conditionals of 'auto' until after it has chosen layouts, and XLA:CPU then ran convolutions
  # in CHWN, 4× slower.
  kernels, reference = run_with("triton"), run_with("xla")

  def run(params, images, key, train=False):
    return jax.lax.platform_dependent(params, images, key, cuda=functools.partial(kernels, train=train),
                                      default=functools.partial(reference, train=train))

  return run
