"""The benchmark's PyTorch row (`torch:one`): the config's layer table as a PyTorch user would write it, timed as
scripts/benchmark.py times ours.

The network is built from the same table (grouped convolutions for a layer that reads its own tower, so both of
the paper's towers run on one GPU; LRN within each tower; an fc layer of split='sum' one full matrix, which is the
sum of the towers' products), NCHW tensors in channels_last memory, autocast to the compute dtype over float32
weights, `torch.compile`d. The step is the same as ours: random stored-size uint8 images whose crops and flips are
cut on the GPU and normalised there, cross-entropy in float32, SGD with momentum and weight decay (fused where torch
has it). torch is imported here only: the package does not need it, the GPU image has it.
"""

import math
import statistics
import time

from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.network.table import Table


def build(table: Table, image_size: int):
  """The table as a torch.nn.Sequential (on the CPU, float32); its parameters number what our network's do."""
  import torch  # noqa: PLC0415
  from torch import nn  # noqa: PLC0415

  class TowerLRN(nn.Module):
    """LRN over each tower's channels apart, as the paper's GPUs normalised their own maps."""

    def __init__(self, towers: int, lrn: nn.Module):
      super().__init__()
      self.towers, self.lrn = towers, lrn

    def forward(self, x):
      return torch.cat([self.lrn(t) for t in x.chunk(self.towers, dim=1)], dim=1)

  shapes = layer_shapes(table, image_size)
  modules, channels = [], 3
  for layer, blocks in zip(table.layers, table.tower_blocks()):
    towers = table.towers if blocks else 1  # the maps' tower blocks
    if layer.kind == "conv":
      groups = towers if layer.inputs == "tower" else 1
      modules.append(nn.Conv2d(channels, layer.filters, layer.size, layer.stride, layer.padding, groups=groups))
      channels = layer.filters
    elif layer.kind == "fc":
      if not any(isinstance(m, nn.Flatten) for m in modules):
        modules.append(nn.Flatten())
      modules.append(nn.Linear(math.prod(shapes.params[layer.name]["kernel"]) // layer.filters, layer.filters))
    elif layer.kind == "lrn":  # torch divides α by the window: undo it where the table's α is not
      alpha = layer.alpha if layer.alpha_over_n else layer.alpha * layer.size
      lrn = nn.LocalResponseNorm(layer.size, alpha, layer.beta, layer.k)
      modules.append(TowerLRN(towers, lrn) if towers > 1 else lrn)
    elif layer.kind == "pool":
      modules.append(nn.MaxPool2d(layer.size, layer.stride, layer.padding))
    elif layer.kind == "dropout":
      modules.append(nn.Dropout(layer.rate))
    if layer.kind in ("conv", "fc") and layer.relu:
      modules.append(nn.ReLU(inplace=True))
  return nn.Sequential(*modules)


def measure(config, table: Table, steps: int, windows: int) -> dict:
  """Times the config's step in PyTorch on the first GPU: the row fields benchmark.py's measure gives ours."""
  import torch  # noqa: PLC0415
  import torch.nn.functional as F  # noqa: PLC0415

  t_build = time.perf_counter()
  device, dtype = torch.device("cuda"), getattr(torch, config.dtype)
  model = build(table, config.image_size).to(device, memory_format=torch.channels_last)
  try:
    opt = torch.optim.SGD(model.parameters(), lr=config.learning_rate, momentum=config.momentum,
                          weight_decay=config.weight_decay, fused=True)
  except (RuntimeError, TypeError):  # a torch without the fused SGD
    opt = torch.optim.SGD(model.parameters(), lr=config.learning_rate, momentum=config.momentum,
                          weight_decay=config.weight_decay, foreach=True)
  forward = torch.compile(model)
  n, crop, size = config.batch_size, config.image_size, config.dataset.resize or config.image_size
  classes = table.weighted()[-1].filters
  g = torch.Generator(device=device).manual_seed(0)
  images = torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8, device=device, generator=g)
  offsets = torch.randint(0, size - crop + 1, (n, 2), device=device, generator=g)
  flips = torch.rand(n, device=device, generator=g) < 0.5
  labels = torch.randint(0, classes, (n,), device=device, generator=g)
  mean = torch.tensor([0.485, 0.456, 0.406], device=device) * 255
  std = torch.tensor([0.229, 0.224, 0.225], device=device) * 255
  span = torch.arange(crop, device=device)

  def step():
    rows = (offsets[:, 0, None] + span)[:, :, None]
    cols = offsets[:, 1, None] + torch.where(flips[:, None], crop - 1 - span, span)
    crops = images[torch.arange(n, device=device)[:, None, None], rows, cols[:, None, :]]  # (N, crop, crop, 3)
    x = ((crops.float() - mean) / std).permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
      logits = forward(x)
    loss = F.cross_entropy(logits.float(), labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()

  for _ in range(3):  # compiles
    loss = step()
  torch.cuda.synchronize()
  build_s = time.perf_counter() - t_build
  pipelined = []
  for _ in range(windows):
    t0 = time.perf_counter()
    for _ in range(steps):
      loss = step()
    torch.cuda.synchronize()
    pipelined.append((time.perf_counter() - t0) / steps)
  blocked = []
  for _ in range(steps):
    t0 = time.perf_counter()
    loss = step()
    torch.cuda.synchronize()
    blocked.append(time.perf_counter() - t0)
  ms = statistics.median(pipelined) * 1e3
  return dict(devices=1, mesh={}, dtype=config.dtype, batch=n, per_device_batch=n, image_size=crop,
              width=config.width, step_ms=ms, window_spread=(max(pipelined) - min(pipelined)) * 1e3 / ms,
              images_per_s=n / ms * 1e3, blocked_step_ms=statistics.median(blocked) * 1e3, step_gib=None,
              peak_gib=torch.cuda.max_memory_allocated() / 2**30, loss=float(loss), collective_bytes={},
              device=torch.cuda.get_device_name(), build_s=build_s, torch=torch.__version__)
