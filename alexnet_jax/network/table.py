"""Networks as data: layer tables in the spirit of cuda-convnet's layer definition files.

A `Table` is a tuple of `Layer`s applied in order and the number of towers (the paper's two GPUs) they are split
over. Every layer with weights gives each tower `filters / towers` outputs and reads its own tower's maps
(`inputs='tower'`) or every tower's (`inputs='all'`, the cross-device layers); `split='sum'` is cuda-convnet's fc
layer with one input per tower, the towers' partial outputs summed (one bias). An LRN layer carries its constants as
cuda-convnet2's `[rnorm]` section does.

Each layer's `place` says where its work lies on a (data, model) mesh: 'tower' spreads the towers over 'model' and
the batch over 'data' (the paper); 'data' keeps weights whole and splits the batch over all devices; 'model' splits
an fc layer's weights over 'model' (the fc half of Krizhevsky's "one weird trick"). 'data' layers come first.
`with_places` places layers one by one, `with_strategy` a whole table (tower, data or hybrid); placement.py decides
what each placement moves between devices (docs/parallelism.md). A new network is a builder registered with
`@register("name")`, here or in a config file; here are AlexNet, ZFNet, VGG-11 and VGG-16.
"""

import dataclasses
from collections.abc import Callable

from alexnet_jax.network.layers import kind_of

PLACES = ("tower", "data", "model")
STRATEGIES = ("tower", "data", "hybrid")


@dataclasses.dataclass(frozen=True)
class Layer:
  name: str
  kind: str  # a registered kind (network/layers): conv, fc, lrn, pool, avg_pool, global_avg_pool, dropout
  filters: int = 0  # conv/fc outputs, all towers together
  size: int = 0  # conv kernel, pool window or LRN channel window
  stride: int = 1
  padding: int = 0  # of the map on each side, for a conv or an average pool
  inputs: str = "tower"  # 'tower' or 'all' (conv/fc): what each tower reads
  split: str = "out"  # 'out' or 'sum' (fc): how the layer's work is divided between towers
  relu: bool = True
  bias_init: float = 0.0  # the paper: 1 in conv2, conv4, conv5, fc6, fc7 "to give ReLUs positive inputs"
  rate: float = 0.0  # dropout rate
  # LRN: a / (k + α·Σa²)^β over `size` neighbouring channels; alpha_over_n: α/size (Caffe's, cuda-convnet's code)
  k: float = 0.0
  alpha: float = 0.0
  beta: float = 0.0
  alpha_over_n: bool = False
  place: str = "tower"  # one of PLACES: how the layer's work is spread over the mesh

  def __post_init__(self):
    kind = kind_of(self)
    if self.inputs not in ("tower", "all") or self.split not in ("out", "sum"):
      raise ValueError(f"layer {self.name}: inputs must be 'tower' or 'all' and split 'out' or 'sum'")
    if self.split == "sum" and not kind.flat:
      raise ValueError(f"layer {self.name}: split='sum' is for fc layers that read their own tower")
    kind.check(self)
    if self.place not in PLACES:
      raise ValueError(f"layer {self.name}: unknown place {self.place!r}; choose one of {', '.join(PLACES)}")
    if self.place == "model" and not kind.sliced:
      raise ValueError(f"layer {self.name}: place='model' is for fc layers and their dropout")

  @property
  def weighted(self) -> bool:
    return kind_of(self).weighted


INITS = ("paper", "he", "glorot")


def initial_weights(layer: Layer, fan_in: int, fan_out: int, weight_init: str) -> tuple[float, float]:
  """(std of the kernel's normal draws, bias value) of `layer` under `weight_init`: 'paper' N(0, 0.01) and the
  table's biases; 'he' N(0, 2/fan_in) (He et al. 2015), 'glorot' N(0, 2/(fan_in + fan_out)) (Glorot & Bengio
  2010), each with zero biases. fan_out counts a kernel's outputs per input: filters × KH × KW for a conv."""
  if weight_init == "paper":
    return 0.01, layer.bias_init
  return (2.0 / (fan_in if weight_init == "he" else fan_in + fan_out)) ** 0.5, 0.0


@dataclasses.dataclass(frozen=True)
class Table:
  """A network: its layers in order, and the towers that every weighted layer is split over."""

  layers: tuple[Layer, ...]
  towers: int = 2

  def __post_init__(self):
    object.__setattr__(self, "layers", tuple(self.layers))  # hashable, as a flax module field must be
    if self.towers < 1:
      raise ValueError(f"a table needs at least one tower, got towers={self.towers}")
    names = [layer.name for layer in self.layers]
    if len(set(names)) != len(names):
      raise ValueError(f"layer names must be unique: {', '.join(names)}")
    flat = None  # the layer that left (features, N)
    for layer in self.layers:
      if flat and kind_of(layer).maps:
        raise ValueError(f"layer {layer.name} reads (C, H, W, N) maps, but {flat.name} left (features, N)")
      flat = flat or (layer if kind_of(layer).flattens else None)
    if not flat:
      raise ValueError("a layer table must end with fc layers (or a global average pool), and dropout: logits are "
                       "(classes, N)")
    for layer, in_blocks in zip(self.layers, self.tower_blocks()):
      if layer.weighted and layer.split == "out" and layer.filters % self.towers:
        raise ValueError(f"layer {layer.name}: {layer.filters} filters do not split over {self.towers} towers")
      if layer.split == "sum" and not in_blocks:
        raise ValueError(f"layer {layer.name}: split='sum' needs per-tower inputs, but its input is not split")
      # One tower's maps are all the maps: a one-tower table's fc layers read them with the default inputs.
      if self.towers > 1 and kind_of(layer).flat and in_blocks and layer.inputs == "tower" and layer.split == "out":
        raise ValueError(f"layer {layer.name}: an fc layer reading its own tower needs split='sum'")
    places = [layer.place for layer in self.layers]
    for before, layer in zip(self.layers, self.layers[1:]):
      if not layer.weighted and layer.place != before.place:
        raise ValueError(f"layer {layer.name}: a layer without weights works where its input lies: place it "
                         f"{before.place!r} like {before.name}")
    if "data" in places and any(p != "data" for p in places[:len(places) - places[::-1].index("data")]):
      raise ValueError("place='data' layers must come first: the batch is gathered over 'model' once, where the "
                       "first layer of another place starts")

  def tower_blocks(self) -> tuple[bool, ...]:
    """For each layer, whether its input holds one block of maps per tower, then the same of the network's output.

    The image is read whole by every tower; a split='out' layer leaves its output in tower blocks, a split='sum'
    layer leaves it whole.
    """
    in_blocks = [False]
    for layer in self.layers:
      in_blocks.append(layer.split == "out" if layer.weighted else in_blocks[-1])
    return tuple(in_blocks)

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(layer.name for layer in self.layers)

  def weighted(self) -> tuple[Layer, ...]:
    return tuple(layer for layer in self.layers if layer.weighted)

  def placed(self, place: str) -> bool:
    """Whether any layer is placed `place`."""
    return any(layer.place == place for layer in self.layers)


def with_places(table: Table, places: dict[str, str]) -> Table:
  """The table with each layer named in `places` ({layer name: place}) placed there; a layer without weights that it
  does not name works where the layer before it does, and a weighted layer it does not name keeps its place."""
  unknown = sorted(set(places) - {layer.name for layer in table.layers})
  if unknown:
    raise ValueError(f"no layer {', '.join(unknown)} in the table; its layers are "
                     f"{', '.join(layer.name for layer in table.layers)}")
  layers = []
  for layer in table.layers:
    follows = not layer.weighted and layers
    place = places.get(layer.name, layers[-1].place if follows else layer.place)
    layers.append(dataclasses.replace(layer, place=place))
  return Table(tuple(layers), table.towers)


def with_strategy(table: Table, strategy: str) -> Table:
  """The table with every layer placed by a named strategy: 'tower' (the paper: towers over 'model'), 'data' (every
  weight on every device, the batch over all of them) or 'hybrid' (Krizhevsky 2014: the layers before the first fc
  layer 'data', the fc layers and their dropout 'model')."""
  if strategy not in STRATEGIES:
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
  first_fc = next((i for i, layer in enumerate(table.layers) if kind_of(layer).flat), len(table.layers))
  place = {"tower": lambda i: "tower", "data": lambda i: "data",
           "hybrid": lambda i: "data" if i < first_fc else "model"}[strategy]
  return with_places(table, {layer.name: place(i) for i, layer in enumerate(table.layers)})


_BUILDERS: dict[str, Callable[..., Table]] = {}


def register(name: str):
  """Decorator: `builder(*, num_classes, width, towers, lrn_alpha_over_n) -> Table` becomes `config.network=name`.

  Registering a name again replaces its builder only from the same definition (a config file loaded twice).
  """

  def add(builder):
    old = _BUILDERS.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (builder.__module__, builder.__qualname__):
      raise ValueError(f"network {name!r} is already registered by {old.__module__}.{old.__qualname__}")
    _BUILDERS[name] = builder
    return builder

  return add


def names() -> tuple[str, ...]:
  return tuple(sorted(_BUILDERS))


def get_network(name: str, **kwargs) -> Table:
  if name not in _BUILDERS:
    raise ValueError(f"unknown network {name!r}; choose one of {', '.join(names())}, or register it in the config "
                     "file (alexnet_jax.network.register)")
  table = _BUILDERS[name](**kwargs)
  if not isinstance(table, Table):
    raise ValueError(f"network {name!r}: its builder returned {type(table).__name__}, not an alexnet_jax.network.Table")
  return table


def _scaled(n: int, width: float, towers: int) -> int:
  """n·width rounded to a positive multiple of `towers`, so every tower gets the same share."""
  return max(towers, int(round(n * width / towers)) * towers)


@register("alexnet")
def alexnet(num_classes: int = 1000, width: float = 1.0, towers: int = 2, lrn_alpha_over_n: bool = False) -> Table:
  """The paper's network (Krizhevsky, Sutskever & Hinton 2012, Figure 2), for 224×224×3 input.

  conv1's padding 2 makes 224 give 55×55 maps as in the figure (Caffe reaches 55 with a 227 crop and no padding).
  `width` scales every hidden layer; width=1 has exactly 60,965,224 parameters for 1000 classes. LRN is the paper's
  formula (k=2, n=5, α=1e-4, β=0.75); `lrn_alpha_over_n` divides α by n as Caffe's and cuda-convnet's code do.
  """
  w = lambda n: _scaled(n, width, towers)  # noqa: E731
  lrn = dict(size=5, k=2.0, alpha=1e-4, beta=0.75, alpha_over_n=lrn_alpha_over_n)
  return Table((
      Layer("conv1", "conv", filters=w(96), size=11, stride=4, padding=2),
      Layer("lrn1", "lrn", **lrn),
      Layer("pool1", "pool", size=3, stride=2),
      Layer("conv2", "conv", filters=w(256), size=5, padding=2, bias_init=1.0),
      Layer("lrn2", "lrn", **lrn),
      Layer("pool2", "pool", size=3, stride=2),
      Layer("conv3", "conv", filters=w(384), size=3, padding=1, inputs="all"),
      Layer("conv4", "conv", filters=w(384), size=3, padding=1, bias_init=1.0),
      Layer("conv5", "conv", filters=w(256), size=3, padding=1, bias_init=1.0),
      Layer("pool5", "pool", size=3, stride=2),
      Layer("fc6", "fc", filters=w(4096), inputs="all", bias_init=1.0),
      Layer("drop6", "dropout", rate=0.5),
      Layer("fc7", "fc", filters=w(4096), inputs="all", bias_init=1.0),
      Layer("drop7", "dropout", rate=0.5),
      Layer("fc8", "fc", filters=num_classes, split="sum", relu=False),
  ), towers)


def _one_tower(name: str, towers: int) -> None:
  if towers != 1:
    raise ValueError(f"{name} is a one-tower network (its authors trained it whole on each GPU); set config.towers=1 "
                     "and config.mesh.model=1")


@register("zfnet")
def zfnet(num_classes: int = 1000, width: float = 1.0, towers: int = 1, lrn_alpha_over_n: bool = False) -> Table:
  """Zeiler & Fergus 2013 (Figure 3): AlexNet made denser, with conv1 7×7/2 (96 filters) and conv2 5×5/2 in place of
  11×11/4 and 5×5/1, one tower, each of layers 1 and 2 rectified, max-pooled 3×3/2 and then contrast-normalised
  across maps (AlexNet's LRN constants), dropout 0.5 in fc6 and fc7.

  The figure's maps (110, 55, 26, 13, 13, 13, 6 on a 224 input) come from Caffe's pools, which round up; ours round
  down as cuda-convnet's kernels here do (110 → 54), so conv2 pads by 2 (54 → 27 → 13): from pool2 on every map, and
  so every parameter, is the figure's; width=1 has 62,357,608 parameters for 1000 classes.
  """
  _one_tower("zfnet", towers)
  w = lambda n: _scaled(n, width, 1)  # noqa: E731
  lrn = dict(size=5, k=2.0, alpha=1e-4, beta=0.75, alpha_over_n=lrn_alpha_over_n)
  return Table((
      Layer("conv1", "conv", filters=w(96), size=7, stride=2, padding=1),
      Layer("pool1", "pool", size=3, stride=2),
      Layer("lrn1", "lrn", **lrn),
      Layer("conv2", "conv", filters=w(256), size=5, stride=2, padding=2),
      Layer("pool2", "pool", size=3, stride=2),
      Layer("lrn2", "lrn", **lrn),
      Layer("conv3", "conv", filters=w(384), size=3, padding=1),
      Layer("conv4", "conv", filters=w(384), size=3, padding=1),
      Layer("conv5", "conv", filters=w(256), size=3, padding=1),
      Layer("pool5", "pool", size=3, stride=2),
      Layer("fc6", "fc", filters=w(4096)),
      Layer("drop6", "dropout", rate=0.5),
      Layer("fc7", "fc", filters=w(4096)),
      Layer("drop7", "dropout", rate=0.5),
      Layer("fc8", "fc", filters=num_classes, relu=False),
  ), 1)


# Simonyan & Zisserman 2014, Table 1: each stage's 3×3 convolutions (stride 1, padding 1), then a 2×2/2 max-pool.
VGG_STAGES = {"vgg11": ((64,), (128,), (256, 256), (512, 512), (512, 512)),  # configuration A
              "vgg16": ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))}  # D


def _vgg(name: str, num_classes: int, width: float, towers: int) -> Table:
  """3×3 stacks, no LRN (the paper found it did not help), five 2×2 pools (224 → 7), then fc6 and fc7 of 4096 with
  dropout 0.5 and the classifier; layers named as in the authors' Caffe models (conv1_1 … conv5_3)."""
  _one_tower(name, towers)
  layers = []
  for stage, filters in enumerate(VGG_STAGES[name], 1):
    layers += [Layer(f"conv{stage}_{i}", "conv", filters=_scaled(f, width, 1), size=3, padding=1)
               for i, f in enumerate(filters, 1)]
    layers.append(Layer(f"pool{stage}", "pool", size=2, stride=2))
  layers += [Layer("fc6", "fc", filters=_scaled(4096, width, 1)), Layer("drop6", "dropout", rate=0.5),
             Layer("fc7", "fc", filters=_scaled(4096, width, 1)), Layer("drop7", "dropout", rate=0.5),
             Layer("fc8", "fc", filters=num_classes, relu=False)]
  return Table(tuple(layers), 1)


@register("vgg11")
def vgg11(num_classes: int = 1000, width: float = 1.0, towers: int = 1, lrn_alpha_over_n: bool = False) -> Table:
  """VGG-11 (configuration A): 8 conv layers; width=1 has 132,863,336 parameters for 1000 classes."""
  del lrn_alpha_over_n  # no LRN
  return _vgg("vgg11", num_classes, width, towers)


@register("vgg16")
def vgg16(num_classes: int = 1000, width: float = 1.0, towers: int = 1, lrn_alpha_over_n: bool = False) -> Table:
  """VGG-16 (configuration D): 13 conv layers; width=1 has 138,357,544 parameters for 1000 classes."""
  del lrn_alpha_over_n  # no LRN
  return _vgg("vgg16", num_classes, width, towers)


@register("nin")
def nin(num_classes: int = 1000, width: float = 1.0, towers: int = 1, lrn_alpha_over_n: bool = False) -> Table:
  """Network in Network (Lin, Chen & Yan 2013), the authors' ImageNet model: four stages of a convolution and two
  1×1 convolutions (the "mlpconv" layers, cccp1 … cccp8 as they named them), 3×3/2 max-pools between them, dropout
  0.5 after the third, and in place of fc layers a last 1×1 convolution of one map per class averaged over the map
  (global average pooling) into the logits; no LRN. Width=1 has 7,595,176 parameters for 1000 classes.

  Their conv1 is 11×11/4 without padding (224 → 54) and Caffe's pools round up (54 → 27); ours round down, so
  conv1 pads by 2 (224 → 55 → 27): from pool1 on every map is theirs (27, 13, 6), and no parameter depends on it.
  """
  del lrn_alpha_over_n  # no LRN
  _one_tower("nin", towers)
  w = lambda n: _scaled(n, width, 1)  # noqa: E731
  stages = ((w(96), 11, 4, 2), (w(256), 5, 1, 2), (w(384), 3, 1, 1), (w(1024), 3, 1, 1))
  layers, cccp = [], 0
  for stage, (filters, size, stride, padding) in enumerate(stages, 1):
    conv = f"conv{stage}" if stage < 4 else "conv4-1024"
    layers.append(Layer(conv, "conv", filters=filters, size=size, stride=stride, padding=padding))
    last = stage == 4
    for i in (1, 2):
      cccp += 1
      out = num_classes if last and i == 2 else filters
      layers.append(Layer(f"cccp{cccp}" + ("-1024" if last else ""), "conv", filters=out, size=1))
    if not last:
      layers.append(Layer(f"pool{stage}", "pool", size=3, stride=2))
  layers.insert(len(layers) - 3, Layer("drop3", "dropout", rate=0.5))
  layers.append(Layer("pool4", "global_avg_pool"))
  return Table(tuple(layers), 1)
