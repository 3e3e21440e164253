"""Average pooling and global average pooling, cuda-convnet's CHWN layout (all arrays contiguous, N fastest).

  avg_pool_fwd:         x (C, H, W, N) → y (C, OH, OW, N) in x's dtype
  avg_pool_bwd:         dy (C, OH, OW, N) → dx (C, H, W, N) in dy's dtype
  global_avg_pool_fwd:  x (C, H, W, N) → y (C, N) in x's dtype
  global_avg_pool_bwd:  dy (C, N) → dx (C, H, W, N) in dy's dtype

with OH = (H + 2·PAD − SIZE)//STRIDE + 1 (OW likewise). Every window is divided by SIZE², the zeros of the padding
counted (PyTorch's default count_include_pad, and Caffe's AVE pooling wherever its windows stay inside the padded
map, which with this rounding down they always do); PAD < SIZE, so that every window holds at least one input. All
sums are float32. Both backwards gather: each dx element sums dy over the windows that cover it, so there are no
atomics and every element is written. The global pool is the one NiN ends with (the mean of each channel's whole
map), its output the fully-connected layout (features, images).
"""

import triton
import triton.language as tl

from triton_kernels.launch import Launch, check_dtype, flat_block, pooled_shape, vector
from triton_kernels.pool import chwn

MAX_SIZE = 16  # a window is unrolled into SIZE² loads; a larger one is a global pool's job


@triton.jit
def avg_pool_fwd_kernel(x_ptr, y_ptr, C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, N: tl.constexpr,
                        OH: tl.constexpr, OW: tl.constexpr, SIZE: tl.constexpr, STRIDE: tl.constexpr,
                        PAD: tl.constexpr, BLOCK: tl.constexpr):
  # As the max-pool's: a block is consecutive flat outputs, neighbouring lanes neighbouring images, so loads coalesce.
  o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  live = o < C * OH * OW * N
  c, oh, ow, n = chwn(o, OH, OW, N)
  h0 = oh * STRIDE - PAD
  w0 = ow * STRIDE - PAD
  acc = tl.zeros([BLOCK], tl.float32)
  for kh in tl.static_range(SIZE):
    h = h0 + kh
    row = live & (h >= 0) & (h < H)
    for kw in tl.static_range(SIZE):
      w = w0 + kw
      ok = row & (w >= 0) & (w < W)  # the padding reads as 0 and still counts in the divisor
      acc += tl.load(x_ptr + ((c * H + h) * W + w) * N + n, mask=ok, other=0.0).to(tl.float32)
  tl.store(y_ptr + o, (acc / (SIZE * SIZE)).to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def avg_pool_bwd_kernel(dy_ptr, dx_ptr, C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, N: tl.constexpr,
                        OH: tl.constexpr, OW: tl.constexpr, SIZE: tl.constexpr, STRIDE: tl.constexpr,
                        PAD: tl.constexpr, BLOCK: tl.constexpr):
  i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  live = i < C * H * W * N
  c, h, w, n = chwn(i, H, W, N)
  h, w = h + PAD, w + PAD  # coordinates in the padded map, where the windows start at multiples of STRIDE
  acc = tl.zeros([BLOCK], tl.float32)
  # Row h lies in the windows starting at rows h//STRIDE − a, a < ceil(SIZE/STRIDE), where it sits at kh < SIZE.
  REACH: tl.constexpr = (SIZE + STRIDE - 1) // STRIDE
  for a in tl.static_range(REACH):
    oh = h // STRIDE - a
    row = live & (oh >= 0) & (oh < OH) & (h - oh * STRIDE < SIZE)
    for b in tl.static_range(REACH):
      ow = w // STRIDE - b
      ok = row & (ow >= 0) & (ow < OW) & (w - ow * STRIDE < SIZE)
      acc += tl.load(dy_ptr + ((c * OH + oh) * OW + ow) * N + n, mask=ok, other=0.0).to(tl.float32)
  tl.store(dx_ptr + i, (acc / (SIZE * SIZE)).to(dx_ptr.dtype.element_ty), mask=live)


@triton.jit
def global_avg_pool_fwd_kernel(x_ptr, y_ptr, C: tl.constexpr, P: tl.constexpr, N: tl.constexpr,
                               CHUNK: tl.constexpr, BLOCK: tl.constexpr):
  # Lanes are flat outputs (c, n), as in the windowed pool; each steps down its channel's P = H·W positions CHUNK at
  # a time, a (CHUNK, BLOCK) tile of loads in flight, whose rows are summed once at the end.
  o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  live = o < C * N
  n = o % N
  c = o // N
  base = c * (P * N) + n
  acc = tl.zeros([CHUNK, BLOCK], tl.float32)
  for p0 in range(0, P, CHUNK):
    p = p0 + tl.arange(0, CHUNK)
    ok = (p < P)[:, None] & live[None, :]
    acc += tl.load(x_ptr + p[:, None] * N + base[None, :], mask=ok, other=0.0).to(tl.float32)
  tl.store(y_ptr + o, (tl.sum(acc, axis=0) / P).to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def global_avg_pool_bwd_kernel(dy_ptr, dx_ptr, C: tl.constexpr, P: tl.constexpr, N: tl.constexpr,
                               BLOCK: tl.constexpr):
  i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  live = i < C * P * N
  j = i // (P * N) * N + i % N  # (c, n) of dx's element
  g = tl.load(dy_ptr + j, mask=live, other=0.0).to(tl.float32)
  tl.store(dx_ptr + i, (g / P).to(dx_ptr.dtype.element_ty), mask=live)


def _check(name, shape, dtype_name, elements):
  check_dtype(name, dtype_name)
  if len(shape) != 4 or min(shape) < 1:
    raise ValueError(f"{name}: expected a non-empty (C, H, W, N) map, got shape {tuple(shape)}")
  if elements >= 2**31:
    raise ValueError(f"{name}: flat indices are int32; split the batch")


def check_window(shape, size: int, stride: int, padding: int) -> None:
  """The windows the kernels can pool: SIZE ≤ MAX_SIZE, PAD < SIZE, at least one window in the padded map."""
  _, h, w, _ = shape
  if not (1 <= size <= MAX_SIZE and stride >= 1 and 0 <= padding < size):
    raise ValueError(f"avg_pool: size {size}, stride {stride}, padding {padding}: need 1 ≤ size ≤ {MAX_SIZE}, "
                     "stride ≥ 1 and 0 ≤ padding < size (a larger window is a global pool)")
  if min(h, w) + 2 * padding < size:
    raise ValueError(f"avg_pool: a {h}×{w} map padded by {padding} is smaller than the {size}×{size} window")


def _window_launch(kernel, shape, size, stride, padding, dtype_name, elements, per_thread, num_warps):
  c, h, w, n = shape
  _check("avg_pool", shape, dtype_name, max(elements, c * h * w * n))
  check_window(shape, size, stride, padding)
  _, oh, ow, _ = pooled_shape(shape, size, stride, padding)
  block = flat_block(elements, per_thread, num_warps)
  constexprs = dict(C=c, H=h, W=w, N=n, OH=oh, OW=ow, SIZE=size, STRIDE=stride, PAD=padding, BLOCK=block)
  return Launch(kernel, grid=(triton.cdiv(elements, block),), constexprs=constexprs, num_warps=num_warps, num_stages=1)


def avg_pool_fwd_launch(shape, size: int, stride: int, padding: int, dtype_name: str, per_thread: int | None = None,
                        num_warps: int | None = None) -> Launch:
  """shape is x's (C, H, W, N); one lane per element of y. The rule, the max-pool forward's (each output reads SIZE²
  inputs): two outputs per thread, 8 warps; per_thread and num_warps override it."""
  c, oh, ow, n = pooled_shape(shape, size, stride, padding)
  return _window_launch(avg_pool_fwd_kernel, shape, size, stride, padding, dtype_name, max(c * oh * ow * n, 1),
                        per_thread or 2, num_warps or 8)


def avg_pool_bwd_launch(shape, size: int, stride: int, padding: int, dtype_name: str, per_thread: int | None = None,
                        num_warps: int | None = None) -> Launch:
  """shape is x's (C, H, W, N), which dx has; one lane per element of dx. The rule, the max-pool backward's: one
  16-byte vector of dx per thread, 4 warps."""
  c, h, w, n = shape
  return _window_launch(avg_pool_bwd_kernel, shape, size, stride, padding, dtype_name, c * h * w * n,
                        per_thread or vector(dtype_name), num_warps or 4)


def global_avg_pool_fwd_launch(shape, dtype_name: str, per_thread: int | None = None, num_warps: int | None = None,
                               chunk: int | None = None) -> Launch:
  """shape is x's (C, H, W, N); one lane per element of y (C, N), CHUNK positions loaded per step. The rule (not yet
  measured on a GPU): two outputs per thread, 4 warps, 4 positions a step (fewer for a smaller map)."""
  c, h, w, n = shape
  _check("global_avg_pool", shape, dtype_name, c * h * w * n)
  num_warps = num_warps or 4
  block = flat_block(c * n, per_thread or 2, num_warps)
  chunk = chunk or min(4, triton.next_power_of_2(h * w))
  constexprs = dict(C=c, P=h * w, N=n, CHUNK=chunk, BLOCK=block)
  return Launch(global_avg_pool_fwd_kernel, grid=(triton.cdiv(c * n, block),), constexprs=constexprs,
                num_warps=num_warps, num_stages=1)


def global_avg_pool_bwd_launch(shape, dtype_name: str, per_thread: int | None = None,
                               num_warps: int | None = None) -> Launch:
  """shape is x's (C, H, W, N), which dx has; one lane per element of dx, each a scaled copy of one dy. The rule:
  one 16-byte vector of dx per thread, 4 warps."""
  c, h, w, n = shape
  _check("global_avg_pool", shape, dtype_name, c * h * w * n)
  num_warps = num_warps or 4
  block = flat_block(c * h * w * n, per_thread or vector(dtype_name), num_warps)
  return Launch(global_avg_pool_bwd_kernel, grid=(triton.cdiv(c * h * w * n, block),),
                constexprs=dict(C=c, P=h * w, N=n, BLOCK=block), num_warps=num_warps, num_stages=1)
