"""Placing the towers: a ('data', 'model') mesh and the shard_map'd forward pass.

The 'model' axis carries the towers (the paper's two GPUs: size 2, one tower each; size 1 runs both towers on one
device as grouped convolutions). The 'data' axis, size 1 in the paper, splits the batch for further devices. Inside
the shard_map every device runs `Network` on its own towers and batch slice; the only collectives are the ones the
layer table asks for. Gradients come from differentiating through the shard_map, which sums weight gradients over
'data' where that axis is larger than 1.
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
  """Tower axis over `tower_axis` for every weight of `params` (arrays or shapes), except the one bias of a
  split='sum' layer (replicated)."""
  summed = {layer.name for layer in net.table.layers if layer.split == "sum"}

  def spec(path, _):
    layer, leaf = (k.key for k in path[-2:])
    return P() if (layer in summed and leaf == "bias") or tower_axis is None else P(tower_axis)

  return jax.tree_util.tree_map_with_path(spec, params)


def param_shardings(mesh, net: Network, params):
  """Where each weight lives on the mesh: each device holds its own towers."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(net, params))


def shard_params(mesh, net: Network, params):
  """Places host parameters (all towers) on the mesh."""
  return jax.device_put(params, param_shardings(mesh, net, params))


def sharded_apply(net: Network, mesh):
  """Returns apply(params, images_chwn, dropout_key, train) → logits (N, classes), batch split over 'data'.

  `net` is the module with all towers local; inside the shard_map it is rebuilt for the device's share. Only mesh
  axes of more than one device are manual: an axis of one device would add collectives that move nothing. The
  interpreter backend is the exception: its host callbacks need every mesh axis manual. Backend 'auto' stages the
  network twice, with the Triton kernels and with the XLA references, and the lowering platform picks one.
  """
  model_size = mesh.shape["model"]
  if net.table.towers % model_size:
    raise ValueError(f"{net.table.towers} towers cannot be spread evenly over a model axis of {model_size} devices")
  manual = {axis for axis in ("data", "model") if mesh.shape[axis] > 1 or net.backend == "interpret"}
  batch = "data" if "data" in manual else None
  local_net = net.clone(tower_axis="model" if "model" in manual else None)

  def run_with(backend):
    node = local_net.clone(backend=backend)

    def apply(params, images, key, train):
      if mesh.shape["data"] > 1:  # each data shard draws its own dropout masks; towers fold in theirs in the model
        key = jax.random.fold_in(key, jax.lax.axis_index("data"))
      return node.apply({"params": params}, images, train=train, rngs={"dropout": key})

    def run(params, images, key, train=False):
      if not manual:
        return apply(params, images, key, train)
      specs = param_specs(net, params, local_net.tower_axis)
      fn = jax.shard_map(functools.partial(apply, train=train), mesh=mesh, axis_names=manual,
                         in_specs=(specs, P(None, None, None, batch), P()), out_specs=P(batch, None))
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
