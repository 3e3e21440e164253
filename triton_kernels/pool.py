"""Overlapping max-pooling without padding, cuda-convnet's CHWN layout (all arrays contiguous, N fastest).

  forward:  x (C, H, W, N) → y (C, OH, OW, N) in x's dtype, idx (C, OH, OW, N) int8
  backward: dy (C, OH, OW, N), idx → dx (C, H, W, N) in dy's dtype
  RELU: pool ReLU(x) instead of x, the ReLU's gradient included: the conv before the pool leaves its ReLU here, so
  that its backward needs no pass of its own to mask the gradient. The max of ReLU(x) is the ReLU of x's max, so
  this costs nothing: a window whose max is not positive sends no gradient back (idx −1), any other sends it to the
  same element as without RELU

with OH = (H − SIZE)//STRIDE + 1 (OW likewise). idx is the row-major position kh·SIZE + kw of the window's maximum:
the first one on ties (XLA's select_and_scatter gives the whole gradient to the first maximum in scan order, and ties
are common among ReLU zeros), the first NaN if the window holds one (y is then NaN). The backward gathers: each dx
element sums dy over the windows that cover it and chose it, so there are no atomics and every element is written.
"""

import triton
import triton.language as tl

from triton_kernels.launch import Launch, check_dtype, flat_block, pooled_shape, vector



@triton.jit
def chwn(i, H: tl.constexpr, W: tl.constexpr, N: tl.constexpr):
  """(c, h, w, n) of flat index i into a contiguous (C, H, W, N) array."""
  return i // (N * W * H), i // (N * W) % H, i // N % W, i % N


@triton.jit
def max_pool_fwd_kernel(x_ptr, y_ptr, idx_ptr, C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, N: tl.constexpr,
                        OH: tl.constexpr, OW: tl.constexpr, SIZE: tl.constexpr, STRIDE: tl.constexpr,
                        RELU: tl.constexpr, BLOCK: tl.constexpr):
  # A block is consecutive flat outputs, so neighbouring lanes are neighbouring images at one pixel: loads coalesce,
  # and with N a compile-time constant Triton can prove the runs contiguous and vectorise them.
  o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  live = o < C * OH * OW * N
  c, oh, ow, n = chwn(o, OH, OW, N)
  corner = ((c * H + oh * STRIDE) * W + ow * STRIDE) * N + n
  best = tl.load(x_ptr + corner, mask=live, other=0.0).to(tl.float32)
  arg = tl.zeros([BLOCK], tl.int32)
  for kh in tl.static_range(SIZE):
    for kw in tl.static_range(SIZE):
      if kh + kw > 0:
        v = tl.load(x_ptr + corner + (kh * W + kw) * N, mask=live, other=0.0).to(tl.float32)
        # Strictly greater keeps the first maximum; a NaN replaces a number once and is never replaced.
        take = (v > best) | ((v != v) & (best == best))
        best = tl.where(take, v, best)
        arg = tl.where(take, kh * SIZE + kw, arg)
  if RELU:  # a NaN stays NaN, as XLA's ReLU keeps it, and sends back no gradient, as XLA's ReLU (NaN > 0 is false)
    arg = tl.where(best > 0, arg, -1)
    best = tl.where((best > 0) | (best != best), best, 0.0)
  tl.store(y_ptr + o, best.to(y_ptr.dtype.element_ty), mask=live)
  tl.store(idx_ptr + o, arg.to(tl.int8), mask=live)


@triton.jit
def routed_gradient(dy_ptr, idx_ptr, h, w, n, first, live, OH: tl.constexpr, OW: tl.constexpr, N: tl.constexpr,
                    SIZE: tl.constexpr, STRIDE: tl.constexpr):
  """Σ dy over the windows that cover input (h, w, n) and chose it, in float32: dy and idx of the pooled plane that
  starts at row `first` of dy_ptr's and idx_ptr's (C·OH rows of OW·N)."""
  acc = tl.zeros(live.shape, tl.float32)
  # Row h lies in the windows starting at rows h//STRIDE − a, a < ceil(SIZE/STRIDE), where it sits at kh < SIZE.
  REACH: tl.constexpr = (SIZE + STRIDE - 1) // STRIDE
  for a in tl.static_range(REACH):
    oh = h // STRIDE - a
    kh = h - oh * STRIDE
    row = live & (oh >= 0) & (oh < OH) & (kh < SIZE)
    for b in tl.static_range(REACH):
      ow = w // STRIDE - b
      kw = w - ow * STRIDE
      ok = row & (ow >= 0) & (ow < OW) & (kw < SIZE)
      j = ((first + oh) * OW + ow) * N + n
      chose = tl.load(idx_ptr + j, mask=ok, other=-1).to(tl.int32) == kh * SIZE + kw
      # Masking the load by `ok` alone keeps the mask uniform along N, so the load still vectorises.
      acc += tl.where(chose, tl.load(dy_ptr + j, mask=ok, other=0.0).to(tl.float32), 0.0)
  return acc


@triton.jit
def max_pool_bwd_kernel(dy_ptr, idx_ptr, dx_ptr, C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, N: tl.constexpr,
                        OH: tl.constexpr, OW: tl.constexpr, SIZE: tl.constexpr, STRIDE: tl.constexpr,
                        BLOCK: tl.constexpr):
  i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  live = i < C * H * W * N
  c, h, w, n = chwn(i, H, W, N)
  acc = routed_gradient(dy_ptr, idx_ptr, h, w, n, c * OH, live, OH, OW, N, SIZE, STRIDE)
  tl.store(dx_ptr + i, acc.to(dx_ptr.dtype.element_ty), mask=live)


def _launch(kernel, shape, size, stride, dtype_name, elements, per_thread, num_warps, **constexprs):
  c, h, w, n = shape
  check_dtype("max_pool", dtype_name)
  if not (1 <= size <= 11 and stride >= 1 and size <= min(h, w)):  # idx is int8: SIZE² ≤ 127
    raise ValueError(f"max_pool: size {size}, stride {stride} do not fit a {h}×{w} map")
  if elements >= 2**31:
    raise ValueError("max_pool: flat indices are int32; split the batch")
  _, oh, ow, _ = pooled_shape(shape, size, stride)
  block = flat_block(elements, per_thread, num_warps)
  constexprs = dict(C=c, H=h, W=w, N=n, OH=oh, OW=ow, SIZE=size, STRIDE=stride, BLOCK=block, **constexprs)
  return Launch(kernel, grid=(triton.cdiv(elements, block),), constexprs=constexprs, num_warps=num_warps, num_stages=1)


def max_pool_fwd_launch(shape, size: int, stride: int, dtype_name: str, relu: bool = False,
                        per_thread: int | None = None, num_warps: int | None = None) -> Launch:
  """shape is x's (C, H, W, N); one lane per element of y; relu: pool ReLU(x). The rule: two outputs per thread and
  8 warps (each output reads SIZE² inputs, so small blocks of many warps keep the most loads in flight); per_thread
  and num_warps override it."""
  c, oh, ow, n = pooled_shape(shape, size, stride)
  return _launch(max_pool_fwd_kernel, shape, size, stride, dtype_name, c * oh * ow * n, per_thread or 2, num_warps or 8,
                 RELU=bool(relu))


def max_pool_bwd_launch(shape, size: int, stride: int, dtype_name: str, per_thread: int | None = None,
                        num_warps: int | None = None) -> Launch:
  """shape is x's (C, H, W, N), which dx has; one lane per element of dx. The rule: one 16-byte vector of dx per
  thread, 4 warps."""
  c, h, w, n = shape
  return _launch(max_pool_bwd_kernel, shape, size, stride, dtype_name, c * h * w * n,
                 per_thread or vector(dtype_name), num_warps or 4)
