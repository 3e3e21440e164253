"""Placing the network on a ('data', 'model') mesh: the mesh, where each weight lives, and the shard_map'd forward.

The 'model' axis carries what the placement plan puts on it (placement.py): the towers of 'tower' layers (the
paper's two GPUs: size 2, one tower each; size 1 runs both towers on one device as grouped convolutions), slices of
'model' fc layers, a second split of the batch for 'data' layers. The 'data' axis, size 1 in the paper, splits the
batch for further devices. Inside the shard_map every device runs `Network` on its own part; the only collectives
are the plan's. Gradients come from differentiating through the shard_map, which sums each weight's gradient over
the axes its batch was split over.
"""

import functools

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from alexnet_jax.network import placement
from alexnet_jax.network.model import Network
from alexnet_jax.network.placement import SLICES, TOWERS, Plan
from alexnet_jax.ops.backend import by_platform


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


def mesh_plan(net: Network, mesh) -> Plan:
  """The plan of the network's table on this mesh: the network's own, where it was made for this mesh's shape."""
  if net.plan is not None and (net.plan.model, net.plan.data) == (mesh.shape["model"], mesh.shape["data"]):
    return net.plan
  return placement.plan(net.table, model=mesh.shape["model"], data=mesh.shape["data"])


def param_specs(plan: Plan, params, axis: str | None = "model"):
  """Where each of `Network`'s weights (arrays or shapes) lies over `axis`, as the plan places it: weights on towers
  split on their leading tower axis, weights on slices on their output axis (split='sum': the kernel's input rows);
  whole weights, and the one bias of a split='sum' layer, replicated."""

  def spec(path, _):
    name, leaf = (k.key for k in path[-2:])
    p = plan[name]
    if axis is None or not p.split_weights[leaf]:
      return P()
    if p.weights == TOWERS:
      return P(axis)
    assert p.weights == SLICES
    return P(None, axis) if p.layer.split == "sum" or leaf == "bias" else P(None, None, axis)

  return jax.tree_util.tree_map_with_path(spec, params)


def param_shardings(mesh, net: Network, params):
  """Where each weight lives on the mesh: each device holds its own towers."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(mesh_plan(net, mesh), params))


def _check_split(params, specs, mesh) -> None:
  """One line for a weight that its layer's place cannot split over the mesh (e.g. 10 classes over 4 devices)."""
  leaves = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))
  for (path, x), spec in zip(jax.tree_util.tree_leaves_with_path(params), leaves):
    for size, axis in zip(x.shape, spec):
      if axis and size % mesh.shape[axis]:
        layer, leaf = (k.key for k in path[-2:])
        raise ValueError(f"layer {layer}: its {leaf} {tuple(x.shape)} does not split over the {mesh.shape[axis]} "
                         f"devices of '{axis}'")


def manual_axes(mesh, backend: str) -> set[str]:
  """The mesh axes a shard_map around kernel calls makes manual: those of more than one device (an axis of one
  would add collectives that move nothing); every axis for the interpreter, whose host callbacks need them all."""
  return {axis for axis in mesh.axis_names if mesh.shape[axis] > 1 or backend == "interpret"}


def sharded_apply(net: Network, mesh):
  """Returns apply(params, images_chwn, dropout_key, train) → logits (N, classes), the batch placed at each end as
  the plan says (over 'data', and 'model' too where the end's layer is placed 'data').

  `net` is the module with all towers local; inside the shard_map it is rebuilt for the device's share, the mesh
  axes `manual_axes` names manual. Backend 'auto' chooses for
  the whole network, outside the shard_map (ops.backend.by_platform): inside it, XLA's SPMD pipeline keeps the
  per-op choices until after it has chosen layouts, and XLA:CPU then ran convolutions in CHWN, several times slower.
  """
  plan = mesh_plan(net, mesh)
  manual = manual_axes(mesh, net.backend)
  batch_in, batch_out = (tuple(a for a in axes if a in manual) or None
                         for axes in (plan.input_axes, plan.output_axes))
  local_net = net.clone(tower_axis="model" if "model" in manual else None,
                        batch_axis="data" if "data" in manual else None, plan=plan)
  specs = functools.partial(param_specs, plan, axis=local_net.tower_axis)

  def run_with(backend, train):
    node = local_net.clone(backend=backend)

    def apply(params, images, key):  # dropout masks are drawn for the global batch (network/layers/dropout.py)
      return node.apply({"params": params}, images, train=train, rngs={"dropout": key})

    if not manual:
      return apply

    def run(params, images, key):
      _check_split(params, specs(params), mesh)
      fn = jax.shard_map(apply, mesh=mesh, axis_names=manual,
                         in_specs=(specs(params), P(None, None, None, batch_in), P()), out_specs=P(batch_out, None))
      return fn(params, images, key)

    return run

  def run(params, images, key, train=False):
    return by_platform(net.backend, lambda backend: run_with(backend, train))(params, images, key)

  return run
