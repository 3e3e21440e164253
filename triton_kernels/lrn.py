"""Local response normalisation across channels, cuda-convnet's CHWN layout (all arrays contiguous, N fastest).

  forward:  x (C, H, W, N) → y (C, H, W, N) in x's dtype, scale (C, H, W, N) float32
  backward: x, dy, scale → dx (C, H, W, N) in dy's dtype

  scale[c] = K + ALPHA · Σ x[c']² over c' ∈ [c − SIZE//2, c + (SIZE−1)//2] ∩ c's group,   y[c] = x[c] · scale[c]^−BETA

as alexnet_jax/ops/lrn.py (pass ALPHA already divided by SIZE for Caffe's α/n). scale is kept for the backward, as
cuda-convnet kept its denominators. Channels are P = H·W·N elements apart, so a program owns BLOCK consecutive
positions of one group and walks down its channels with a sliding window sum: the entering channel is added and the
leaving one subtracted, so each element comes from DRAM about once (the leaving channel's re-read hits the cache).
The sum carries its rounding error (TwoSum), and NaN and ±inf are counted beside it rather than added, so that neither a large
value's rounding nor a non-finite one outlives its stay in the window.
"""

import triton
import triton.language as tl

from triton_kernels.launch import Launch, cdiv

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
NUM_WARPS = 4
PROGRAMS = 4 * 132  # a few per H200 SM; below that a smaller block buys parallelism


@triton.jit
def _slide(win, v, sign):
  """Adds (sign 1) or removes (sign −1) v from `win` = (sum, its rounding error, #NaN, #+inf, #−inf)."""
  nan = v != v
  pinf = v == float("inf")
  ninf = v == float("-inf")
  # TwoSum keeps each addition's exact rounding error: once a large square has left the window, a plain float32
  # sum would keep its rounding, large beside the small squares that remain (Kahan's update loses it as well).
  v = sign * tl.where(nan | pinf | ninf, 0.0, v)
  total = win[0] + v
  part = total - win[0]
  error = (win[0] - (total - part)) + (v - part)
  return (total, win[1] + error, win[2] + sign * nan.to(tl.int32), win[3] + sign * pinf.to(tl.int32),
          win[4] + sign * ninf.to(tl.int32))


@triton.jit
def _total(win):
  total = tl.where(win[3] > 0, float("inf"), tl.where(win[4] > 0, float("-inf"), win[0] + win[1]))
  return tl.where((win[2] > 0) | ((win[3] > 0) & (win[4] > 0)), float("nan"), total)


@triton.jit
def _square(x_ptr, c, live, CG: tl.constexpr, P: tl.constexpr):
  v = tl.load(x_ptr + c * P, mask=live & (c >= 0) & (c < CG), other=0.0).to(tl.float32)
  return v * v


@triton.jit
def _term(x_ptr, dy_ptr, scale_ptr, c, live, CG: tl.constexpr, P: tl.constexpr, BETA: tl.constexpr):
  """dy[c] · x[c] · scale[c]^(−BETA−1): channel c's share of the backward window sums; 0 outside the group."""
  ok = live & (c >= 0) & (c < CG)
  x = tl.load(x_ptr + c * P, mask=ok, other=0.0).to(tl.float32)
  dy = tl.load(dy_ptr + c * P, mask=ok, other=0.0).to(tl.float32)
  scale = tl.load(scale_ptr + c * P, mask=ok, other=1.0)
  return dy * x * tl.exp2(-BETA * tl.log2(scale)) / scale


@triton.jit
def lrn_fwd_kernel(x_ptr, y_ptr, scale_ptr, C: tl.constexpr, P: tl.constexpr, GROUPS: tl.constexpr,
                   SIZE: tl.constexpr, K: tl.constexpr, ALPHA: tl.constexpr, BETA: tl.constexpr, BLOCK: tl.constexpr):
  CG: tl.constexpr = C // GROUPS
  BEFORE: tl.constexpr = SIZE // 2  # window of c: [c − BEFORE, c + AFTER]
  AFTER: tl.constexpr = (SIZE - 1) // 2
  p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  live = p < P
  group = tl.program_id(1) * CG * P + p  # pointer offsets to channel 0 of this group
  x_ptr += group
  y_ptr += group
  scale_ptr += group
  zero = tl.zeros([BLOCK], tl.int32)
  win = (tl.zeros([BLOCK], tl.float32), tl.zeros([BLOCK], tl.float32), zero, zero, zero)
  for c in tl.static_range(AFTER):
    win = _slide(win, _square(x_ptr, c, live, CG, P), 1)
  for c in range(CG):
    win = _slide(win, _square(x_ptr, c + AFTER, live, CG, P), 1)
    x = tl.load(x_ptr + c * P, mask=live, other=0.0).to(tl.float32)
    scale = K + ALPHA * _total(win)
    tl.store(y_ptr + c * P, (x * tl.exp2(-BETA * tl.log2(scale))).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(scale_ptr + c * P, scale, mask=live)
    win = _slide(win, _square(x_ptr, c - BEFORE, live, CG, P), -1)


@triton.jit
def lrn_bwd_kernel(x_ptr, dy_ptr, scale_ptr, dx_ptr, C: tl.constexpr, P: tl.constexpr, GROUPS: tl.constexpr,
                   SIZE: tl.constexpr, K: tl.constexpr, ALPHA: tl.constexpr, BETA: tl.constexpr, BLOCK: tl.constexpr):
  # dx[c] = dy[c]·scale[c]^−BETA − 2·ALPHA·BETA·x[c]·Σ_j term[j] over the j whose window holds c. Those j are
  # the mirror image of the forward window, [c − AFTER, c + BEFORE]: lopsided the other way when SIZE is even.
  CG: tl.constexpr = C // GROUPS
  BEFORE: tl.constexpr = SIZE // 2
  AFTER: tl.constexpr = (SIZE - 1) // 2
  p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  live = p < P
  group = tl.program_id(1) * CG * P + p
  x_ptr += group
  dy_ptr += group
  scale_ptr += group
  dx_ptr += group
  zero = tl.zeros([BLOCK], tl.int32)
  win = (tl.zeros([BLOCK], tl.float32), tl.zeros([BLOCK], tl.float32), zero, zero, zero)
  for c in tl.static_range(BEFORE):
    win = _slide(win, _term(x_ptr, dy_ptr, scale_ptr, c, live, CG, P, BETA), 1)
  for c in range(CG):
    win = _slide(win, _term(x_ptr, dy_ptr, scale_ptr, c + BEFORE, live, CG, P, BETA), 1)
    x = tl.load(x_ptr + c * P, mask=live, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + c * P, mask=live, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + c * P, mask=live, other=1.0)
    dx = dy * tl.exp2(-BETA * tl.log2(scale)) - 2.0 * ALPHA * BETA * x * _total(win)
    tl.store(dx_ptr + c * P, dx.to(dx_ptr.dtype.element_ty), mask=live)
    win = _slide(win, _term(x_ptr, dy_ptr, scale_ptr, c - AFTER, live, CG, P, BETA), -1)


def _launch(kernel, shape, groups, size, k, alpha, beta, dtype_name):
  c, h, w, n = shape
  if dtype_name not in ITEMSIZE:
    raise ValueError(f"lrn: dtype {dtype_name} is not one of {', '.join(ITEMSIZE)}")
  if groups < 1 or c % groups or size < 1:
    raise ValueError(f"lrn: {c} channels, {groups} groups, window {size}")
  if c * h * w * n >= 2**31:
    raise ValueError("lrn: offsets are int32; split the batch")
  p = h * w * n
  # One 16-byte vector per thread, halved down to one element per thread while the grid is too small to fill the GPU.
  block = 32 * NUM_WARPS * 16 // ITEMSIZE[dtype_name]
  while block > 32 * NUM_WARPS and cdiv(p, block) * groups < PROGRAMS:
    block //= 2
  constexprs = dict(C=c, P=p, GROUPS=groups, SIZE=size, K=float(k), ALPHA=float(alpha), BETA=float(beta), BLOCK=block)
  return Launch(kernel, grid=(cdiv(p, block), groups), constexprs=constexprs, num_warps=NUM_WARPS)


def lrn_fwd_launch(shape, groups: int, size: int, k: float, alpha: float, beta: float, dtype_name: str) -> Launch:
  """shape is x's (C, H, W, N); grid (position blocks, groups)."""
  return _launch(lrn_fwd_kernel, shape, groups, size, k, alpha, beta, dtype_name)


def lrn_bwd_launch(shape, groups: int, size: int, k: float, alpha: float, beta: float, dtype_name: str) -> Launch:
  """shape is x's (C, H, W, N); the same grid as the forward."""
  return _launch(lrn_bwd_kernel, shape, groups, size, k, alpha, beta, dtype_name)
