"""How a kernel is launched for one shape."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Launch:
  kernel: object  # the @triton.jit function this launch runs
  grid: tuple[int, ...]
  constexprs: dict  # every tl.constexpr argument of the kernel, by name
  num_warps: int = 4
  num_stages: int = 2


def cdiv(a: int, b: int) -> int:
  return -(-a // b)
