"""How a kernel is launched for one shape."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Launch:
  kernel: object  # the @triton.jit function this launch runs
  grid: tuple[int, ...]
  constexprs: dict  # every tl.constexpr argument of the kernel, by name
  num_warps: int = 4
  num_stages: int = 2


def out_size(size: int, window: int, stride: int = 1, padding: int = 0) -> int:
  """The side of a convolution's or pool's output: every window that fits in the padded input (cuda-convnet's
  rounding down; the one formula of the project's shapes)."""
  return (size + 2 * padding - window) // stride + 1
