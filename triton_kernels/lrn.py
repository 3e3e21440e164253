"""Local response normalisation across channels, cuda-convnet's CHWN layout (all arrays contiguous, N fastest).

  forward:  x (C, H, W, N) → y (C, H, W, N) in x's dtype
  backward: x, dy → dx (C, H, W, N) in dy's dtype
  RELU: normalise ReLU(x) and pass dx back through the ReLU: the conv before the LRN leaves its ReLU here, so that
  its backward needs no pass of its own to mask the gradient

  s[c] = K + ALPHA · Σ x[c']² over c' ∈ [c − SIZE//2, c + (SIZE−1)//2] ∩ c's group,   y[c] = x[c] · s[c]^−BETA

as alexnet_jax/ops/lrn.py (pass ALPHA already divided by SIZE for Caffe's α/n). A program owns BLOCK consecutive
positions of one group and walks down its channels, holding the last SIZE in registers: each element is read from
DRAM once and each window sum is added afresh, so no rounding error or non-finite value outlives its window. A
group's channels are split among CHUNKS programs (each reading the channels before its own) so that the grid fills
the GPU. The backward recomputes s from x rather than keeping float32 denominators, which would move more bytes than
bf16 x and dy; its walk (`lrn_bwd_walk`) also serves an LRN and the max-pool after it as one (lrn_pool.py).
"""

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from triton_kernels import pool
from triton_kernels.launch import Launch, check_dtype, vector

NUM_WARPS = 4
MAX_CHUNKS = 6
# The grid a launch splits channels to reach, tuned on one H200 at AlexNet's LRNs, batch 128 and 512
# (docs/BENCHMARKS.md; scripts/dev/tune_kernels.py times a network's LRNs against other launches): the backward, which
# reads twice the halo, wants fewer programs.
FWD_PROGRAMS, BWD_PROGRAMS = 8000, 2000


@triton.jit
def _channel(ptr, c, live, CG: tl.constexpr, P: tl.constexpr):
  """Channel c of this program's positions in float32; 0 outside the group, which clips the windows."""
  return tl.load(ptr + c * P, mask=live & (c >= 0) & (c < CG), other=0.0).to(tl.float32)


@triton.jit
def channel_input(ptr, c, live, CG: tl.constexpr, P: tl.constexpr, RELU: tl.constexpr):
  """Channel c of the LRN's input: x, or with RELU the ReLU of x (NaN stays NaN, as the conv kernel's and XLA's)."""
  v = _channel(ptr, c, live, CG, P)
  if RELU:
    v = tl.maximum(v, 0.0, propagate_nan=tl.PropagateNan.ALL)
  return v


@triton.jit
def denominator(xs, K: tl.constexpr, ALPHA: tl.constexpr, SIZE: tl.constexpr):
  """K + ALPHA · Σ xs², xs being the SIZE channels of one window."""
  total = xs[0] * xs[0]
  for i in tl.static_range(1, SIZE):
    total += xs[i] * xs[i]
  return K + ALPHA * total


@triton.jit
def log2_of(s, FAST_LOG2: tl.constexpr):
  if FAST_LOG2:
    return libdevice.fast_log2f(s)
  return tl.log2(s)


@triton.jit
def power(s, EXPONENT: tl.constexpr, FAST_LOG2: tl.constexpr):
  """s^EXPONENT for s > 0, as exp2(EXPONENT · log2 s). FAST_LOG2: the GPU's own log2 (one lg2.approx instruction,
  2^-22 relative error, far below what bf16 or the float32 checks can see), where tl.log2 compiles to libdevice's
  correctly rounded log2f, a polynomial and a branch for every element of these otherwise light kernels. The
  interpreter has no libdevice."""
  if FAST_LOG2:
    return tl.exp2(EXPONENT * libdevice.fast_log2f(s))
  return tl.exp2(EXPONENT * tl.log2(s))


@triton.jit
def _sum(ring, SIZE: tl.constexpr):
  total = ring[0]
  for i in tl.static_range(1, SIZE):
    total += ring[i]
  return total


@triton.jit
def chunk(BLOCK: tl.constexpr, CHUNKS: tl.constexpr, CG: tl.constexpr):
  """(first channel, channels) of this program's chunk, and its positions: neighbouring programs hold the chunks of
  the same positions, so that one's halo is read from L2 where the other has just read it."""
  CH: tl.constexpr = (CG + CHUNKS - 1) // CHUNKS
  pid = tl.program_id(0)
  return (pid % CHUNKS) * CH, CH, (pid // CHUNKS) * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def lrn_fwd_kernel(x_ptr, y_ptr, C: tl.constexpr, P: tl.constexpr, GROUPS: tl.constexpr, SIZE: tl.constexpr,
                   K: tl.constexpr, ALPHA: tl.constexpr, BETA: tl.constexpr, RELU: tl.constexpr, BLOCK: tl.constexpr,
                   CHUNKS: tl.constexpr, FAST_LOG2: tl.constexpr, UNROLL: tl.constexpr):
  CG: tl.constexpr = C // GROUPS
  BEFORE: tl.constexpr = SIZE // 2  # window of c: [c − BEFORE, c + AFTER]
  AFTER: tl.constexpr = (SIZE - 1) // 2
  c0, ch, p = chunk(BLOCK, CHUNKS, CG)
  live = p < P
  group = tl.program_id(1) * CG * P + p  # pointer offsets to channel 0 of this group
  x_ptr += group
  y_ptr += group
  zero = tl.zeros([BLOCK], tl.float32)
  xs = (zero,) * SIZE  # channels [c − BEFORE, c + AFTER] of the output channel c
  for i in tl.static_range(SIZE - 1):
    xs = xs[1:] + (channel_input(x_ptr, c0 - BEFORE + i, live, CG, P, RELU),)
  for c in tl.range(c0, tl.minimum(c0 + ch, CG), loop_unroll_factor=UNROLL):
    xs = xs[1:] + (channel_input(x_ptr, c + AFTER, live, CG, P, RELU),)
    s = denominator(xs, K, ALPHA, SIZE)
    tl.store(y_ptr + c * P, (xs[BEFORE] * power(s, -BETA, FAST_LOG2)).to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def _gradient(dy_ptr, idx_ptr, j, live, hwn, CG: tl.constexpr, P: tl.constexpr, OH: tl.constexpr, OW: tl.constexpr,
              N: tl.constexpr, POOL: tl.constexpr, POOL_STRIDE: tl.constexpr):
  """dy of channel j at this program's positions in float32, 0 outside the group: read, or with POOL > 0 gathered
  from the gradient of the max-pool after the LRN (dy_ptr, (C, OH, OW, N), and idx_ptr, its choices) at positions
  hwn = (h, w, n), as the pool's backward kernel does (pool.routed_gradient)."""
  if POOL == 0:
    g = _channel(dy_ptr, j, live, CG, P)
  else:
    h, w, n = hwn
    g = pool.routed_gradient(dy_ptr, idx_ptr, h, w, n, j * OH, live & (j >= 0) & (j < CG), OH, OW, N, POOL,
                             POOL_STRIDE)
  return g


@triton.jit
def _shares(xs, g, j, CG: tl.constexpr, SIZE: tl.constexpr, K: tl.constexpr, ALPHA: tl.constexpr,
            BETA: tl.constexpr, FAST_LOG2: tl.constexpr):
  """dy[j]·s[j]^−BETA and that times x[j]/s[j] for channel j, g being dy[j] and xs j's window; both 0 outside the
  group, whatever s is there (with K = 0 an empty window's 0^−BETA would make them NaN)."""
  # 1/s as a second exp2 of the same log2: a division's range checks and reciprocal issue more instructions. The
  # term is rounded by an fma of its own: a plain product would be fused into the window's sum of terms, by a choice
  # the compiler makes from how often each product is used, which the loop's unrolling changes (other bits).
  log_s = log2_of(denominator(xs, K, ALPHA, SIZE), FAST_LOG2)
  g = g * tl.exp2(-BETA * log_s)
  inside = (j >= 0) & (j < CG)
  return tl.where(inside, g, 0.0), tl.where(inside, tl.fma(g * xs[SIZE // 2], tl.exp2(-log_s), 0.0), 0.0)


@triton.jit
def lrn_bwd_walk(x_ptr, dy_ptr, idx_ptr, dx_ptr, C: tl.constexpr, P: tl.constexpr, GROUPS: tl.constexpr,
                 SIZE: tl.constexpr, K: tl.constexpr, ALPHA: tl.constexpr, BETA: tl.constexpr, RELU: tl.constexpr,
                 BLOCK: tl.constexpr, CHUNKS: tl.constexpr, FAST_LOG2: tl.constexpr, UNROLL: tl.constexpr,
                 POOL: tl.constexpr, POOL_STRIDE: tl.constexpr, W: tl.constexpr, N: tl.constexpr, OH: tl.constexpr,
                 OW: tl.constexpr):
  """The backward of the LRN, or with POOL > 0 (the pool's window side and stride) of the LRN and the max-pool after
  it: dy is then the pool's gradient, (C, OH, OW, N), and idx_ptr its choices (_gradient)."""
  # dx[c] = g[c] − 2·ALPHA·BETA·x[c]·Σ_j g[j]·x[j]/s[j] over the j whose window holds c, g = dy·s^−BETA. Those j are
  # the mirror image of the forward window, [c − AFTER, c + BEFORE]: lopsided the other way when SIZE is even.
  # Reading channel e gives s and g of j = e − AFTER, and with them the last term dx[c = j − BEFORE] needs.
  CG: tl.constexpr = C // GROUPS
  BEFORE: tl.constexpr = SIZE // 2
  AFTER: tl.constexpr = (SIZE - 1) // 2
  c0, ch, p = chunk(BLOCK, CHUNKS, CG)
  live = p < P
  group = tl.program_id(1) * CG * P + p
  x_ptr += group
  dx_ptr += group
  if POOL == 0:
    dy_ptr += group
    hwn = ()
  else:
    dy_ptr += tl.program_id(1) * CG * OH * OW * N
    idx_ptr += tl.program_id(1) * CG * OH * OW * N
    hwn = (p // (W * N), p // N % W, p % N)
  zero = tl.zeros([BLOCK], tl.float32)
  xs = (zero,) * SIZE  # x of channels [j − BEFORE, j + AFTER] = [c, e]
  gs = (zero,) * (BEFORE + 1)  # g of channels [c, j]
  terms = (zero,) * SIZE  # g·x/s of channels [c − AFTER, j]
  # The first SIZE − 1 reads only fill xs; the next SIZE − 1 fill gs and terms (at c0 = 0 the first read nothing).
  for i in tl.static_range(2 * (SIZE - 1)):
    e = c0 - SIZE + 1 + i
    xs = xs[1:] + (channel_input(x_ptr, e, live, CG, P, RELU),)
    dy = _gradient(dy_ptr, idx_ptr, e - AFTER, live, hwn, CG, P, OH, OW, N, POOL, POOL_STRIDE)
    g, term = _shares(xs, dy, e - AFTER, CG, SIZE, K, ALPHA, BETA, FAST_LOG2)
    gs = gs[1:] + (g,)
    terms = terms[1:] + (term,)
  for c in tl.range(c0, tl.minimum(c0 + ch, CG), loop_unroll_factor=UNROLL):
    xs = xs[1:] + (channel_input(x_ptr, c + SIZE - 1, live, CG, P, RELU),)
    dy = _gradient(dy_ptr, idx_ptr, c + BEFORE, live, hwn, CG, P, OH, OW, N, POOL, POOL_STRIDE)
    g, term = _shares(xs, dy, c + BEFORE, CG, SIZE, K, ALPHA, BETA, FAST_LOG2)
    gs = gs[1:] + (g,)
    terms = terms[1:] + (term,)
    dx = gs[0] - 2.0 * ALPHA * BETA * xs[0] * _sum(terms, SIZE)
    if RELU:  # through the ReLU: gradient where its output is positive
      dx = tl.where(xs[0] > 0, dx, 0.0)
    tl.store(dx_ptr + c * P, dx.to(dx_ptr.dtype.element_ty), mask=live)


@triton.jit
def lrn_bwd_kernel(x_ptr, dy_ptr, dx_ptr, C: tl.constexpr, P: tl.constexpr, GROUPS: tl.constexpr,
                   SIZE: tl.constexpr, K: tl.constexpr, ALPHA: tl.constexpr, BETA: tl.constexpr, RELU: tl.constexpr,
                   BLOCK: tl.constexpr, CHUNKS: tl.constexpr, FAST_LOG2: tl.constexpr, UNROLL: tl.constexpr):
  lrn_bwd_walk(x_ptr, dy_ptr, dy_ptr, dx_ptr, C, P, GROUPS, SIZE, K, ALPHA, BETA, RELU, BLOCK, CHUNKS, FAST_LOG2,
               UNROLL, 0, 1, 1, 1, 1, 1)


def launch(kernel, shape, groups, size, k, alpha, beta, relu, dtype_name, block, programs, chunks, positions=None,
           unroll=None, **constexprs) -> Launch:
  """The grid of an LRN's walk down the channels: blocks of `positions` (default H·W·N) times channel chunks (a
  rule's, up to `programs` programs, or `chunks`), times groups. unroll: channels a pass of the walk's loop (default
  1): each shift of the window's registers is then a renaming, not a copy (tune_kernels.py times it)."""
  c, h, w, n = shape
  check_dtype("lrn", dtype_name)
  if groups < 1 or c % groups or size < 1:
    raise ValueError(f"lrn: {c} channels, {groups} groups, window {size}")
  if c * h * w * n >= 2**31:
    raise ValueError("lrn: offsets are int32; split the batch")
  if unroll is not None and unroll < 1:
    raise ValueError(f"lrn: unroll {unroll} must be at least 1")
  p = h * w * n
  blocks = triton.cdiv(positions or p, block)
  if chunks is None:
    chunks = min(MAX_CHUNKS, triton.cdiv(programs, blocks * groups))
  chunks = max(1, min(chunks, c // groups))
  constexprs = dict(C=c, P=p, GROUPS=groups, SIZE=size, K=float(k), ALPHA=float(alpha), BETA=float(beta),
                    RELU=bool(relu), BLOCK=block, CHUNKS=chunks, UNROLL=unroll or 1,
                    FAST_LOG2=os.environ.get("TRITON_INTERPRET") != "1", **constexprs)
  return Launch(kernel, grid=(blocks * chunks, groups), constexprs=constexprs, num_warps=NUM_WARPS)


def lrn_fwd_launch(shape, groups: int, size: int, k: float, alpha: float, beta: float, dtype_name: str,
                   relu: bool = False, block: int | None = None, chunks: int | None = None,
                   unroll: int | None = None) -> Launch:
  """shape is x's (C, H, W, N); grid (position blocks × channel chunks, groups). relu: normalise ReLU(x) (the conv
  before it leaves its ReLU to this kernel). block (positions per program, a power of two) and chunks (programs per
  group's channels) and unroll (launch's) override the rule: one 16-byte vector per thread, chunks until the grid
  has FWD_PROGRAMS."""
  block = block or 32 * NUM_WARPS * vector(dtype_name)
  return launch(lrn_fwd_kernel, shape, groups, size, k, alpha, beta, relu, dtype_name, block, FWD_PROGRAMS, chunks,
                unroll=unroll)


def lrn_bwd_launch(shape, groups: int, size: int, k: float, alpha: float, beta: float, dtype_name: str,
                   relu: bool = False, block: int | None = None, chunks: int | None = None,
                   unroll: int | None = None) -> Launch:
  """shape is x's (C, H, W, N); the forward's grid; relu as the forward's, its gradient included. The rule: four
  elements per thread (x, dy and the window's state of each in registers), chunks until the grid has BWD_PROGRAMS."""
  block = block or 4 * 32 * NUM_WARPS
  return launch(lrn_bwd_kernel, shape, groups, size, k, alpha, beta, relu, dtype_name, block, BWD_PROGRAMS, chunks,
                unroll=unroll)
