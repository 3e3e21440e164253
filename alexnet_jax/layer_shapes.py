"""The per-tower shapes of AlexNet's layers at a batch size: what the kernel checks and benchmarks run on."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class ConvShape:
  name: str
  x: tuple[int, int, int, int]  # (C, H, W, N)
  w: tuple[int, int, int, int]  # (C/G, KH, KW, F)
  stride: int
  padding: int

  @property
  def flops(self) -> int:
    """Multiply-adds × 2 of the forward pass (the data and filter gradients cost the same)."""
    c, h, w, n = self.x
    cg, kh, kw, f = self.w
    oh, ow = (h + 2 * self.padding - kh) // self.stride + 1, (w + 2 * self.padding - kw) // self.stride + 1
    return 2 * f * oh * ow * n * cg * kh * kw


def alexnet_convs(batch: int = 128) -> list[ConvShape]:
  """One tower's share of each conv layer (conv3 reads both towers' 256 maps)."""
  n = batch
  return [ConvShape("conv1", (3, 224, 224, n), (3, 11, 11, 48), 4, 2),
          ConvShape("conv2", (48, 27, 27, n), (48, 5, 5, 128), 1, 2),
          ConvShape("conv3", (256, 13, 13, n), (256, 3, 3, 192), 1, 1),
          ConvShape("conv4", (192, 13, 13, n), (192, 3, 3, 192), 1, 1),
          ConvShape("conv5", (192, 13, 13, n), (192, 3, 3, 128), 1, 1)]


def alexnet_maps(batch: int = 128) -> dict[str, tuple[int, int, int, int]]:
  """One tower's inputs of the pools and LRNs."""
  n = batch
  return {"lrn1": (48, 55, 55, n), "pool1": (48, 55, 55, n), "lrn2": (128, 27, 27, n), "pool2": (128, 27, 27, n),
          "pool5": (128, 13, 13, n)}
