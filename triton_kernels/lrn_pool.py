"""Local response normalisation then max-pooling, one kernel each way; CHWN (all arrays contiguous, N fastest).

  forward:  x (C, H, W, N) → y (C, OH, OW, N) in x's dtype, idx (C, OH, OW, N) int8
  backward: x, dy (C, OH, OW, N), idx → dx (C, H, W, N) in dy's dtype

y = max_pool(lrn(x)) and idx as triton_kernels/pool.py's, bit for bit: each normalised value is rounded to x's dtype
before the windows compare it, as the pool after a separate LRN would see it. RELU: of ReLU(x), as lrn.py's.

Where the two layers sit back to back (AlexNet's first two), the normalised map is the largest array of the step and
neither pass needs it: the forward normalises each window's elements where the pool reads them, so the map is never
written nor read back; the backward walks down the channels as lrn.py's does, gathering each element's gradient from
the windows that chose it (pool.routed_gradient). The forward normalises an element once for each window that holds
it (9 windows on 4 elements for 3×3/2): arithmetic, traded for a map never written nor read back.
"""

import triton
import triton.language as tl

from triton_kernels import lrn
from triton_kernels.launch import Launch
from triton_kernels.pool import pooled_shape

# The forward's launch, tuned on one H200 at AlexNet's lrn1 at batch 128 and 512 (docs/BENCHMARKS.md;
# scripts/dev/tune_kernels.py --kernels lrn_pool_fwd): each group's channels in three chunks, four channels a pass of
# the walk, at both batches the fastest of 60 launches.
FWD_CHUNKS, FWD_UNROLL = 3, 4

# The backward's launch (block, chunks, unroll) where the best of scripts/dev/tune_kernels.py's grid beat the rule by
# more than 3 % on one H200, keyed by x's shape and the groups, (C, H, W, N, G): AlexNet's two layers on one GPU, both
# towers (--kernels lrn_pool_bwd --placements one; docs/results/tune_kernels_lrn_pool_*one_h200_*). lrn2's 128
# channels a group walk fastest in four chunks, two channels a pass; lrn1's 48 unchunked. The tuner's first
# candidate is the launch without overrides, this table's where it holds the layer.
BWD_TUNED = {
    (96, 55, 55, 128, 2): (512, 1, 1),  # lrn1 at 128: the rule's two chunks 0.157–0.163 ms, this 0.142
    (256, 27, 27, 128, 2): (512, 4, 2),  # lrn2 at 128: the rule's six chunks 0.121–0.133 ms, this 0.105
    (256, 27, 27, 512, 2): (512, 4, 2),  # lrn2 at 512: the rule's two chunks 0.414 ms, this 0.338
}


@triton.jit
def _shift(xs, x_ptr, c, live, CG: tl.constexpr, P: tl.constexpr, W: tl.constexpr, N: tl.constexpr,
           SIZE: tl.constexpr, POOL: tl.constexpr, RELU: tl.constexpr):
  """xs, the last SIZE channels at each of the window's POOL² elements (SIZE values per element, in row-major window
  order), moved on by channel c."""
  moved = ()
  for k in tl.static_range(POOL * POOL):
    v = lrn.channel_input(x_ptr + (k // POOL * W + k % POOL) * N, c, live, CG, P, RELU)
    moved = moved + xs[k * SIZE + 1:(k + 1) * SIZE] + (v,)
  return moved


@triton.jit
def lrn_pool_fwd_kernel(x_ptr, y_ptr, idx_ptr, C: tl.constexpr, P: tl.constexpr, H: tl.constexpr, W: tl.constexpr,
                        N: tl.constexpr, OH: tl.constexpr, OW: tl.constexpr, GROUPS: tl.constexpr, SIZE: tl.constexpr,
                        K: tl.constexpr, ALPHA: tl.constexpr, BETA: tl.constexpr, RELU: tl.constexpr,
                        POOL: tl.constexpr, STRIDE: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
                        FAST_LOG2: tl.constexpr, UNROLL: tl.constexpr):
  # A program owns BLOCK outputs of one pooled plane (consecutive images at a few windows: loads coalesce) and walks
  # down a chunk of its group's channels, holding the last SIZE channels of its windows' elements in registers.
  CG: tl.constexpr = C // GROUPS
  Q: tl.constexpr = OH * OW * N
  BEFORE: tl.constexpr = SIZE // 2
  AFTER: tl.constexpr = (SIZE - 1) // 2
  c0, ch, q = lrn.chunk(BLOCK, CHUNKS, CG)
  live = q < Q
  n = q % N
  ow = q // N % OW
  oh = q // (N * OW)
  x_ptr += tl.program_id(1) * CG * P + (oh * STRIDE * W + ow * STRIDE) * N + n  # each output's window corner
  y_ptr += tl.program_id(1) * CG * Q + q
  idx_ptr += tl.program_id(1) * CG * Q + q
  xs = (tl.zeros([BLOCK], tl.float32),) * (SIZE * POOL * POOL)
  for i in tl.static_range(SIZE - 1):
    xs = _shift(xs, x_ptr, c0 - BEFORE + i, live, CG, P, W, N, SIZE, POOL, RELU)
  for c in tl.range(c0, tl.minimum(c0 + ch, CG), loop_unroll_factor=UNROLL):
    xs = _shift(xs, x_ptr, c + AFTER, live, CG, P, W, N, SIZE, POOL, RELU)
    best = tl.zeros([BLOCK], tl.float32)
    arg = tl.zeros([BLOCK], tl.int32)
    for k in tl.static_range(POOL * POOL):
      window = xs[k * SIZE:(k + 1) * SIZE]
      s = lrn.denominator(window, K, ALPHA, SIZE)
      v = (window[BEFORE] * lrn.power(s, -BETA, FAST_LOG2)).to(y_ptr.dtype.element_ty).to(tl.float32)
      if k == 0:
        best = v
      else:  # pool.py's rule: the first maximum; a NaN replaces a number once and is never replaced
        take = (v > best) | ((v != v) & (best == best))
        best = tl.where(take, v, best)
        arg = tl.where(take, k, arg)
    tl.store(y_ptr + c * Q, best.to(y_ptr.dtype.element_ty), mask=live)
    tl.store(idx_ptr + c * Q, arg.to(tl.int8), mask=live)


@triton.jit
def lrn_pool_bwd_kernel(x_ptr, dy_ptr, idx_ptr, dx_ptr, C: tl.constexpr, P: tl.constexpr, GROUPS: tl.constexpr,
                        SIZE: tl.constexpr, K: tl.constexpr, ALPHA: tl.constexpr, BETA: tl.constexpr,
                        RELU: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr, FAST_LOG2: tl.constexpr,
                        UNROLL: tl.constexpr, POOL: tl.constexpr, STRIDE: tl.constexpr, W: tl.constexpr,
                        N: tl.constexpr, OH: tl.constexpr, OW: tl.constexpr):
  lrn.lrn_bwd_walk(x_ptr, dy_ptr, idx_ptr, dx_ptr, C, P, GROUPS, SIZE, K, ALPHA, BETA, RELU, BLOCK, CHUNKS,
                   FAST_LOG2, UNROLL, POOL, STRIDE, W, N, OH, OW)


def _check(shape, pool: int, stride: int):
  _, h, w, _ = shape
  if not (1 <= pool <= 11 and stride >= 1 and pool <= min(h, w)):  # idx is int8: POOL² ≤ 127
    raise ValueError(f"lrn_pool: pool size {pool}, stride {stride} do not fit a {h}×{w} map")
  return pooled_shape(shape, pool, stride)


def lrn_pool_fwd_launch(shape, groups: int, size: int, k: float, alpha: float, beta: float, pool: int, stride: int,
                        dtype_name: str, relu: bool = False, block: int | None = None,
                        chunks: int | None = None, unroll: int | None = None) -> Launch:
  """shape is x's (C, H, W, N); size, k, alpha, beta the LRN's (lrn.py), pool and stride the max-pool's. Grid
  (output blocks × channel chunks, groups). The rule: one output per thread (each holds SIZE·POOL² values), each
  group's channels in FWD_CHUNKS chunks walked FWD_UNROLL channels a pass. block, chunks and unroll (lrn.launch's)
  override it."""
  _, h, w, n = shape
  _, oh, ow, _ = _check(shape, pool, stride)
  return lrn.launch(lrn_pool_fwd_kernel, shape, groups, size, k, alpha, beta, relu, dtype_name,
                    block or 32 * lrn.NUM_WARPS, None, FWD_CHUNKS if chunks is None else chunks,
                    positions=oh * ow * n, unroll=FWD_UNROLL if unroll is None else unroll, H=h, W=w, N=n, OH=oh,
                    OW=ow, POOL=pool, STRIDE=stride)


def lrn_pool_bwd_launch(shape, groups: int, size: int, k: float, alpha: float, beta: float, pool: int, stride: int,
                        dtype_name: str, relu: bool = False, block: int | None = None,
                        chunks: int | None = None, unroll: int | None = None) -> Launch:
  """shape is x's (C, H, W, N); the LRN's backward grid and rule (lrn.lrn_bwd_launch): four positions a thread ran
  fastest here too, for all their registers (docs/BENCHMARKS.md). A layer in BWD_TUNED launches as it says; block,
  chunks and unroll override either."""
  _, _, w, n = shape
  _, oh, ow, _ = _check(shape, pool, stride)
  if (tuned := BWD_TUNED.get((*shape, groups))) and (block, chunks, unroll) == (None, None, None):
    block, chunks, unroll = tuned
  return lrn.launch(lrn_pool_bwd_kernel, shape, groups, size, k, alpha, beta, relu, dtype_name,
                    block or 4 * 32 * lrn.NUM_WARPS, lrn.BWD_PROGRAMS, chunks, unroll=unroll, W=w, N=n, OH=oh,
                    OW=ow, POOL=pool, STRIDE=stride)
