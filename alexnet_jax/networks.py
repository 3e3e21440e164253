"""Networks as data: layer tables in the spirit of cuda-convnet's layer definition files.

A table is a tuple of `Layer`s applied in order. Every layer with weights is split over `towers` (the paper's two
GPUs): each tower owns `filters / towers` outputs and reads either its own tower's maps (`inputs='tower'`, no
communication) or every tower's maps (`inputs='all'`, the cross-device layers). A layer with `split='sum'` is
cuda-convnet's fc layer with one input per tower: each tower multiplies its own inputs by its own rows of the
weight matrix, and the partial outputs are summed across towers (one bias for the whole layer).

A new network (ZFNet, VGG, …) is a new table here, not a new model class.
"""

import dataclasses

KINDS = ("conv", "lrn", "pool", "fc", "dropout")


@dataclasses.dataclass(frozen=True)
class Layer:
  name: str
  kind: str  # one of KINDS
  filters: int = 0  # conv/fc outputs, all towers together
  size: int = 0  # conv kernel, pool window or LRN channel window
  stride: int = 1
  padding: int = 0
  inputs: str = "tower"  # 'tower' or 'all' (conv/fc): what each tower reads
  split: str = "out"  # 'out' or 'sum' (fc): how the layer's work is divided between towers
  relu: bool = True
  bias_init: float = 0.0  # the paper: 1 in conv2, conv4, conv5, fc6, fc7 "to give ReLUs positive inputs"
  rate: float = 0.0  # dropout rate

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"layer {self.name}: unknown kind {self.kind!r}; choose one of {', '.join(KINDS)}")
    if self.inputs not in ("tower", "all") or self.split not in ("out", "sum"):
      raise ValueError(f"layer {self.name}: inputs must be 'tower' or 'all' and split 'out' or 'sum'")
    if self.split == "sum" and (self.kind != "fc" or self.inputs != "tower"):
      raise ValueError(f"layer {self.name}: split='sum' is for fc layers that read their own tower")


def _scaled(n: int, width: float, towers: int) -> int:
  """n·width rounded to a positive multiple of `towers`, so every tower gets the same share."""
  return max(towers, int(round(n * width / towers)) * towers)


def alexnet(num_classes: int = 1000, width: float = 1.0, towers: int = 2) -> tuple[Layer, ...]:
  """The paper's network (Krizhevsky, Sutskever & Hinton 2012, Figure 2), for 224×224×3 input.

  conv1's padding 2 makes 224 give 55×55 maps as in the figure (Caffe reaches 55 with a 227 crop and no padding).
  `width` scales every hidden layer; width=1 has exactly 60,965,224 parameters for 1000 classes.
  """
  w = lambda n: _scaled(n, width, towers)  # noqa: E731
  return (
      Layer("conv1", "conv", filters=w(96), size=11, stride=4, padding=2),
      Layer("lrn1", "lrn", size=5),
      Layer("pool1", "pool", size=3, stride=2),
      Layer("conv2", "conv", filters=w(256), size=5, padding=2, bias_init=1.0),
      Layer("lrn2", "lrn", size=5),
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
  )


NETWORKS = {"alexnet": alexnet}


def get_network(name: str, **kwargs) -> tuple[Layer, ...]:
  if name not in NETWORKS:
    raise ValueError(f"unknown network {name!r}; choose one of {', '.join(sorted(NETWORKS))}")
  return NETWORKS[name](**kwargs)
