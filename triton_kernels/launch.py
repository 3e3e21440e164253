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


def pooled_shape(shape, size: int, stride: int, padding: int = 0) -> tuple[int, int, int, int]:
  """(C, OH, OW, N) of a pool's output for its input (C, H, W, N)."""
  c, h, w, n = shape
  return c, out_size(h, size, stride, padding), out_size(w, size, stride, padding), n


# The dtypes the element-wise kernels (pools, LRN) take, by name, and their sizes in bytes.
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def check_dtype(op: str, dtype_name: str) -> None:
  if dtype_name not in ITEMSIZE:
    raise ValueError(f"{op}: dtype {dtype_name} is not one of {', '.join(ITEMSIZE)}")


def vector(dtype_name: str) -> int:
  """Elements of one 16-byte vector, a thread's share in the element-wise rules (an unknown dtype counts as float32:
  the launch refuses it)."""
  return 16 // ITEMSIZE.get(dtype_name, 4)


def flat_block(elements: int, per_thread: int, num_warps: int) -> int:
  """per_thread elements for each of num_warps·32 threads; a small layer gets a smaller block, a power of two (no
  Triton import here, which would read TRITON_INTERPRET before a test sets it)."""
  return min(per_thread * 32 * num_warps, max(32 * num_warps, 1 << max(elements - 1, 0).bit_length()))
