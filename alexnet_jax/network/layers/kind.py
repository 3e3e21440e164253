"""A layer kind as one record, in the spirit of cuda-convnet2's layer classes: everything the framework needs to
know of a kind of layer, which the table, the shapes, the placement plan, the network, the plain-XLA and PyTorch
peers and the kernel tools read from here, and nowhere else.

A kind's functions take the table's `Layer`; `run` and `plain` also take the module that applies it (model.Network,
measure.baseline.PlainNetwork), whose services they use: a layer's weights, the devices it is spread over, its rows
of the batch. `steps` is the one pass that fuses layers for our kernels: a conv's ReLU left to the kernels of the
layer after it, and a layer and the next as one op.
"""

import dataclasses
from collections.abc import Callable, Mapping

from triton_kernels.launch import out_size

_KINDS: dict[str, "Kind"] = {}


def _no_check(layer) -> None:
  del layer


def windowed(layer, shape, what: str) -> tuple[int, int]:
  """(OH, OW) of a layer that slides size×size filters or a window over the map `shape` (C, H, W, N); one clear
  error where they do not fit, `what` naming them with their verb ('filters do', 'window does')."""
  _, h, w, _ = shape
  if min(h, w) + 2 * layer.padding < layer.size:
    raise ValueError(f"layer {layer.name}'s {layer.size}×{layer.size} {what} not fit the {h}×{w} map that "
                     "reaches it")
  return out_size(h, layer.size, layer.stride, layer.padding), out_size(w, layer.size, layer.stride, layer.padding)


def _same_shape(layer, shape):
  del layer
  return shape


@dataclasses.dataclass(frozen=True)
class Kind:
  name: str
  # (net: model.Network, step: Step, x, train) -> y: the layer on one device's share, CHWN or (features, N)
  run: Callable
  # (net: baseline.PlainNetwork, p: placement.LayerPlan, x, train) -> y: as a JAX user writes it, NHWC or (N, F)
  plain: Callable
  # (layer, torch.nn, input shape, towers) -> [modules]: PyTorch's, NCHW; `towers`: tower blocks of the input maps
  torch: Callable
  output_shape: Callable = _same_shape  # (layer, input shape (C, H, W, N) or (F, N)) -> output shape
  check: Callable = _no_check  # (layer) -> None, or a ValueError naming the layer
  # Weighted kinds: (layer, the input shape one tower reads) -> the kernel's shape before its output axis
  fan: Callable | None = None
  flat: bool = False  # reads the maps flattened (an fc layer): every tower's, whatever its `inputs`
  maps: bool = True  # reads (C, H, W, N) maps; False: also (features, N)
  flattens: bool = False  # leaves (features, N): what a network's logits must be
  sliced: bool = False  # may be placed 'model': split over devices by its units (fc layers and their dropout)
  # writes its output clamped at 0 but leaves the ReLU's gradient mask to the kernels of the layer after it, when
  # that one `takes_relu`: they mask it as they write their own gradient, where XLA would take a pass over the maps
  defers_relu: bool = False
  takes_relu: bool = False  # its kernels apply the mask of the layer before's ReLU (LRN's and pools' the ReLU too)
  # {kind of the next layer: (net, step, x) -> (this layer's output or None, the next one's)}: both as one op
  fuses: Mapping[str, Callable] = dataclasses.field(default_factory=dict)
  # (layer, **keywords) -> the op this kind's kernels compute on one tower's maps, for the kernel checks and tools
  op: Callable | None = None

  @property
  def weighted(self) -> bool:
    return self.fan is not None


def register_kind(kind: Kind) -> Kind:
  """Makes `kind` a layer kind that tables may name. Registering a name again replaces it only with the same
  definition's record (a module reloaded)."""
  old = _KINDS.get(kind.name)
  if old is not None and old.run.__module__ != kind.run.__module__:
    raise ValueError(f"layer kind {kind.name!r} is already registered by {old.run.__module__}")
  _KINDS[kind.name] = kind
  return kind


def kinds() -> tuple[str, ...]:
  return tuple(_KINDS)


def kind_of(layer) -> Kind:
  """The record of `layer.kind`, or one line naming the kinds there are."""
  try:
    return _KINDS[layer.kind]
  except KeyError:
    raise ValueError(f"layer {layer.name}: unknown kind {layer.kind!r}; choose one of {', '.join(_KINDS)}") from None


@dataclasses.dataclass(frozen=True)
class Step:
  """One op of the network as our kernels run it: a layer, or a layer and the next as one op (`plans`, the
  placement plan's rows); `relu_in`: apply the ReLU's mask that the layer before left to this op; `relu_out`: leave
  this layer's ReLU's mask to the next op."""

  plans: tuple
  relu_in: bool = False
  relu_out: bool = False

  @property
  def plan(self):
    return self.plans[0]

  @property
  def layer(self):
    return self.plans[0].layer


def steps(layer_plans) -> tuple[Step, ...]:
  """The placement plan's layers as ops: a layer whose kind fuses with the next kind's runs both, where the next
  reads its input as it lies (nothing gathered or cut between them); a layer that defers its ReLU leaves it to the
  next layer if that one takes it."""
  out, i, relu_in = [], 0, False
  while i < len(layer_plans):
    p, kind = layer_plans[i], kind_of(layer_plans[i].layer)
    after = layer_plans[i + 1] if i + 1 < len(layer_plans) else None
    together = after is not None and after.layer.kind in kind.fuses and not after.read and not after.gather_batch
    plans = (p, after) if together else (p,)
    following = layer_plans[i + len(plans)] if i + len(plans) < len(layer_plans) else None
    relu_out = (kind.defers_relu and p.layer.relu and following is not None
                and kind_of(following.layer).takes_relu and not together)
    out.append(Step(plans, relu_in, relu_out))
    relu_in, i = relu_out, i + len(plans)
  return tuple(out)
