"""Convolution in cuda-convnet's layouts: forward, data gradient and filter gradient as implicit GEMMs.

Layouts (cuda-convnet2's filter_acts / img_acts / weight_acts trio), all C-contiguous:
  images x, data gradient dx      (C, H, W, N)             batch last: N is the fastest axis
  mask source m                   (C, H, W, N)             as x: where it is not positive, x (dx) reads as 0
  filters w                       (C/G, KH, KW, F)         filters last
  bias b                          (F,) float32
  output y, output gradient dy    (F, OH, OW, N)           OH = (H + 2·PAD - KH) // STRIDE + 1, likewise OW
  filter-gradient partials dw     (SPLIT, C/G, KH, KW, F)  float32; the caller sums axis 0
  bias-gradient partials db       (SPLIT, F)               float32, if asked for; likewise
Groups G split C and F into equal consecutive blocks (the paper's two towers on one device); the last grid axis is
the group. Each kernel is one GEMM per group whose pixel axis runs over (pixel, image) with the image fastest, so a
tile's columns are consecutive images at one pixel and load coalesced (cuda-convnet's point); the strided operand is
gathered from CHWN with masks, with no im2col buffer. Where the reduction's step divides a group's channels (the
data gradient's: its filters), the forward and data-gradient kernels reduce in (kh, kw, channel) order, so that a step
lies within one filter tap and the gather takes one offset and mask per column instead of one per element (the
filter gradient ran slower so: docs/kernels.md). 16-bit inputs run on tensor cores; float32 ones use INPUT_PRECISION
"ieee" or "tf32"; all accumulate in float32, and y and dx take the input dtype. The data gradient is right at any
stride but efficient only at stride 1. Offsets are int32: every tensor holds fewer than 2³¹ elements.
Tiles: `tiles_for` (conv_tiles.py's tuned table for 16-bit inputs, else `rule_of_thumb`). Design: docs/kernels.md.
"""

import dataclasses
import math

import triton
import triton.language as tl

from triton_kernels.conv_tiles import TUNED, tile_key
from triton_kernels.launch import Launch, out_size

DTYPES = ("float32", "float16", "bfloat16")
INPUT_PRECISIONS = ("ieee", "tf32")
# How the forward and filter-gradient kernels read the images: as stored, or where a mask source is positive (a
# ReLU's tangent). A ReLU itself is never applied as images are read: between tiles loaded asynchronously into shared
# memory and the tensor cores that read them there, it would take a pass through registers.
INPUTS = ("plain", "masked")
WGRAD_COLUMNS_PER_PROGRAM = 4096


@triton.jit
def _origins(p, N: tl.constexpr, OW: tl.constexpr, STRIDE: tl.constexpr, PAD: tl.constexpr):
  """(n, ih0, iw0) of output columns p (oh, ow, n): each column's image and its receptive field's first row and
  column in x."""
  return p % N, p // (N * OW) * STRIDE - PAD, p // N % OW * STRIDE - PAD


@triton.jit
def _read(tile, m_ptr, offsets, inside, INPUT: tl.constexpr):
  """An image tile as the kernel reads it (INPUT): as stored ('plain'), or where the mask source m, laid out as x, is
  positive ('masked': the tangent of a ReLU's output)."""
  if INPUT == "masked":
    tile = tl.where(tl.load(m_ptr + offsets, mask=inside, other=0.0) > 0, tile, 0.0).to(tile.dtype)
  return tile


@triton.jit
def _image_tile(x_ptr, m_ptr, c0, rows, p, N: tl.constexpr, H: tl.constexpr, W: tl.constexpr, KH: tl.constexpr,
                KW: tl.constexpr, OW: tl.constexpr, STRIDE: tl.constexpr, PAD: tl.constexpr, ROWS: tl.constexpr,
                COLS: tl.constexpr, INPUT: tl.constexpr):
  """x[rows, p] of the implicit im2col matrix, read as INPUT says (_read): rows (c, kh, kw) from channel c0 on,
  columns (oh, ow, n)."""
  c = rows // (KH * KW)
  kh = rows // KW % KH
  kw = rows % KW
  n, ih0, iw0 = _origins(p, N, OW, STRIDE, PAD)
  ih = ih0[None, :] + kh[:, None]
  iw = iw0[None, :] + kw[:, None]
  inside = (rows < ROWS)[:, None] & (p < COLS)[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
  # The offset separates into a row part and a column part: one add per element, not a full index decode.
  row_off = (c0 + c) * (H * W * N) + kh * (W * N) + kw * N
  col_off = ih0 * (W * N) + iw0 * N + n
  offsets = row_off[:, None] + col_off[None, :]
  return _read(tl.load(x_ptr + offsets, mask=inside, other=0.0), m_ptr, offsets, inside, INPUT)


@triton.jit
def conv_fwd_kernel(x_ptr, w_ptr, b_ptr, m_ptr, y_ptr, N: tl.constexpr, C: tl.constexpr, H: tl.constexpr,
                    W: tl.constexpr, F: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, STRIDE: tl.constexpr,
                    PAD: tl.constexpr, GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr, RELU: tl.constexpr,
                    INPUT: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_F: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):
  """filter_acts: y = relu(w ⋆ x + b), x read as INPUT says (_read), one [BLOCK_F, BLOCK_P] tile of y per program;
  b_ptr unread without bias, m_ptr unless INPUT is 'masked'."""
  CG: tl.constexpr = C // GROUPS
  FG: tl.constexpr = F // GROUPS
  OH: tl.constexpr = (H + 2 * PAD - KH) // STRIDE + 1
  OW: tl.constexpr = (W + 2 * PAD - KW) // STRIDE + 1
  P: tl.constexpr = OH * OW * N
  K: tl.constexpr = CG * KH * KW
  F_TILES: tl.constexpr = (FG + BLOCK_F - 1) // BLOCK_F
  pid = tl.program_id(0)
  g = tl.program_id(1)
  # Filter tiles vary fastest, so programs running together share one gathered image tile through L2.
  f = pid % F_TILES * BLOCK_F + tl.arange(0, BLOCK_F)
  p = pid // F_TILES * BLOCK_P + tl.arange(0, BLOCK_P)
  n, ih0, iw0 = _origins(p, N, OW, STRIDE, PAD)
  acc = tl.zeros((BLOCK_F, BLOCK_P), tl.float32)
  for k0 in range(0, K, BLOCK_K):
    if CG % BLOCK_K == 0:
      # The reduction in (kh, kw, c) order, c fastest: a step lies within one (kh, kw), so the gather's pixel
      # offsets and mask are one per column, not per element.
      khw = k0 // CG
      c = k0 % CG + tl.arange(0, BLOCK_K)
      ih = ih0 + khw // KW
      iw = iw0 + khw % KW
      inside = (p < P) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
      offsets = (g * CG + c)[:, None] * (H * W * N) + (ih * (W * N) + iw * N + n)[None, :]
      x_tile = _read(tl.load(x_ptr + offsets, mask=inside[None, :], other=0.0), m_ptr, offsets, inside[None, :],
                     INPUT)
      w_tile = tl.load(w_ptr + (c[None, :] * (KH * KW) + khw) * F + (g * FG + f)[:, None], mask=(f < FG)[:, None],
                       other=0.0)
    else:
      k = k0 + tl.arange(0, BLOCK_K)
      w_tile = tl.load(w_ptr + k[None, :] * F + (g * FG + f)[:, None], mask=(f < FG)[:, None] & (k < K)[None, :],
                       other=0.0)
      x_tile = _image_tile(x_ptr, m_ptr, g * CG, k, p, N, H, W, KH, KW, OW, STRIDE, PAD, K, P, INPUT)
    acc = tl.dot(w_tile, x_tile, acc, input_precision=INPUT_PRECISION)
  if HAS_BIAS:
    acc += tl.load(b_ptr + g * FG + f, mask=f < FG, other=0.0).to(tl.float32)[:, None]
  if RELU:
    acc = tl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN, as in XLA
  tl.store(y_ptr + (g * FG + f)[:, None] * P + p[None, :], acc.to(y_ptr.dtype.element_ty),
           mask=(f < FG)[:, None] & (p < P)[None, :])


@triton.jit
def _read_pixels(th, tw, STRIDE: tl.constexpr, OH: tl.constexpr, OW: tl.constexpr):
  """(oh, ow, live) for th = ih + PAD - kh and tw alike: the output pixel whose gradient reaches input pixel (ih, iw)
  through tap (kh, kw), where one does (live): th = oh·STRIDE and tw = ow·STRIDE inside the output."""
  live = (th >= 0) & (tw >= 0)
  if STRIDE > 1:
    live &= (th % STRIDE == 0) & (tw % STRIDE == 0)
  oh = th // STRIDE
  ow = tw // STRIDE
  return oh, ow, live & (oh < OH) & (ow < OW)


@triton.jit
def conv_dgrad_kernel(dy_ptr, w_ptr, m_ptr, dx_ptr, N: tl.constexpr, C: tl.constexpr, H: tl.constexpr,
                      W: tl.constexpr, F: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, STRIDE: tl.constexpr,
                      PAD: tl.constexpr, GROUPS: tl.constexpr, MASKED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                      BLOCK_C: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
  """img_acts: dx[c, ih, iw, n] = Σ dy[f, oh, ow, n] · w[c, kh, kw, f], ih = oh·STRIDE - PAD + kh, iw alike; with
  MASKED, 0 where m (laid out as dx) is not positive: the gradient through the ReLU that the layer before left to
  this one, with no pass of its own (m_ptr unread without)."""
  CG: tl.constexpr = C // GROUPS
  FG: tl.constexpr = F // GROUPS
  OH: tl.constexpr = (H + 2 * PAD - KH) // STRIDE + 1
  OW: tl.constexpr = (W + 2 * PAD - KW) // STRIDE + 1
  Q: tl.constexpr = H * W * N
  K: tl.constexpr = KH * KW * FG
  C_TILES: tl.constexpr = (CG + BLOCK_C - 1) // BLOCK_C
  pid = tl.program_id(0)
  g = tl.program_id(1)
  c = pid % C_TILES * BLOCK_C + tl.arange(0, BLOCK_C)
  q = pid // C_TILES * BLOCK_Q + tl.arange(0, BLOCK_Q)
  n = q % N
  iw = q // N % W
  ih = q // (N * W)
  acc = tl.zeros((BLOCK_C, BLOCK_Q), tl.float32)
  for k0 in range(0, K, BLOCK_K):
    if FG % BLOCK_K == 0:
      # A step lies within one filter tap (kh, kw), as in the forward: the gather's pixel offsets and mask are one
      # per column, not per element.
      khw = k0 // FG
      f = tl.multiple_of(k0 % FG, BLOCK_K) + tl.arange(0, BLOCK_K)  # as k0's: the filter tile loads asynchronously
      oh, ow, live = _read_pixels(ih + (PAD - khw // KW), iw + (PAD - khw % KW), STRIDE, OH, OW)
      live &= q < Q
      dy_tile = tl.load(dy_ptr + (g * FG + f)[:, None] * (OH * OW * N) + (oh * (OW * N) + ow * N + n)[None, :],
                        mask=live[None, :], other=0.0)
      w_tile = tl.load(w_ptr + c[:, None] * (KH * KW * F) + (khw * F + g * FG + f)[None, :],
                       mask=(c < CG)[:, None], other=0.0)
    else:
      k = k0 + tl.arange(0, BLOCK_K)
      f = k % FG  # f fastest in k: the filter tile reads w[c, kh, kw, :] contiguously
      kw = k // FG % KW
      kh = k // (FG * KW)
      w_tile = tl.load(w_ptr + c[:, None] * (KH * KW * F) + ((kh * KW + kw) * F + g * FG + f)[None, :],
                       mask=(c < CG)[:, None] & (k < K)[None, :], other=0.0)
      oh, ow, live = _read_pixels(ih[None, :] + (PAD - kh)[:, None], iw[None, :] + (PAD - kw)[:, None], STRIDE, OH,
                                  OW)
      live &= (k < K)[:, None] & (q < Q)[None, :]
      dy_off = (g * FG + f)[:, None] * (OH * OW * N) + oh * (OW * N) + ow * N + n[None, :]
      dy_tile = tl.load(dy_ptr + dy_off, mask=live, other=0.0)
    acc = tl.dot(w_tile, dy_tile, acc, input_precision=INPUT_PRECISION)
  offsets = (g * CG + c)[:, None] * Q + q[None, :]
  inside = (c < CG)[:, None] & (q < Q)[None, :]
  if MASKED:
    acc = tl.where(tl.load(m_ptr + offsets, mask=inside, other=0.0) > 0, acc, 0.0)
  tl.store(dx_ptr + offsets, acc.to(dx_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _wgrad_tile(x_ptr, dy_ptr, m_ptr, r, f, g, s, N: tl.constexpr, C: tl.constexpr, H: tl.constexpr,
                W: tl.constexpr, F: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, STRIDE: tl.constexpr,
                PAD: tl.constexpr, GROUPS: tl.constexpr, INPUT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_P: tl.constexpr, SPLIT_STEPS: tl.constexpr,
                SUM: tl.constexpr):
  """One program's [BLOCK_R, BLOCK_F] tile of dw over split s's columns; with SUM ('ones' or 'tiles', not 'none'),
  also dy summed over them."""
  CG: tl.constexpr = C // GROUPS
  FG: tl.constexpr = F // GROUPS
  OH: tl.constexpr = (H + 2 * PAD - KH) // STRIDE + 1
  OW: tl.constexpr = (W + 2 * PAD - KW) // STRIDE + 1
  P: tl.constexpr = OH * OW * N
  R: tl.constexpr = CG * KH * KW
  acc = tl.zeros((BLOCK_R, BLOCK_F), tl.float32)
  sums = tl.zeros((BLOCK_F,), tl.float32)
  for i in range(SPLIT_STEPS):
    p = (s * SPLIT_STEPS + i) * BLOCK_P + tl.arange(0, BLOCK_P)
    x_tile = _image_tile(x_ptr, m_ptr, g * CG, r, p, N, H, W, KH, KW, OW, STRIDE, PAD, R, P, INPUT)
    if SUM == "ones":  # row R, past the filter's rows, all ones: the tensor cores sum dy there
      x_tile = tl.where((r == R)[:, None] & (p < P)[None, :], 1.0, x_tile).to(x_tile.dtype)
    dy_tile = tl.load(dy_ptr + (g * FG + f)[None, :] * P + p[:, None], mask=(p < P)[:, None] & (f < FG)[None, :],
                      other=0.0)
    acc = tl.dot(x_tile, dy_tile, acc, input_precision=INPUT_PRECISION)
    if SUM == "tiles":
      sums += tl.sum(dy_tile.to(tl.float32), axis=0)
  if SUM == "ones":
    sums = tl.sum(tl.where((r == R)[:, None], acc, 0.0), axis=0)
  return acc, sums


@triton.jit
def conv_wgrad_kernel(x_ptr, dy_ptr, m_ptr, dw_ptr, db_ptr, N: tl.constexpr, C: tl.constexpr, H: tl.constexpr,
                      W: tl.constexpr, F: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, STRIDE: tl.constexpr,
                      PAD: tl.constexpr, GROUPS: tl.constexpr, BIAS: tl.constexpr, INPUT: tl.constexpr,
                      INPUT_PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
                      BLOCK_P: tl.constexpr, SPLIT: tl.constexpr, SPLIT_STEPS: tl.constexpr):
  """weight_acts: dw[s, c, kh, kw, f] = Σ over split s's columns (oh, ow, n) of x[c, ih, iw, n] · dy[f, oh, ow, n],
  x read as INPUT says (_read; m_ptr unread unless 'masked'); with BIAS, also the bias gradient's partials
  db[s, f] = Σ over them of dy[f, oh, ow, n] (db_ptr unwritten without).

  Program (·, s, g) reduces columns [s·SPLIT_STEPS·BLOCK_P, (s+1)·SPLIT_STEPS·BLOCK_P) and writes its whole float32
  tile, zeros included: partial sums instead of atomics keep the result deterministic. The caller sums axis 0.
  The bias sums come from dy as one row tile's programs read it anyway, which saves a pass over dy.
  """
  CG: tl.constexpr = C // GROUPS
  FG: tl.constexpr = F // GROUPS
  R: tl.constexpr = CG * KH * KW
  F_TILES: tl.constexpr = (FG + BLOCK_F - 1) // BLOCK_F
  pid = tl.program_id(0)
  s = tl.program_id(1)
  g = tl.program_id(2)
  f = pid % F_TILES * BLOCK_F + tl.arange(0, BLOCK_F)
  r = pid // F_TILES * BLOCK_R + tl.arange(0, BLOCK_R)
  # The bias sums: where the last row tile has a row past the filter's, as that row of ones' products on the tensor
  # cores; else summed from the dy tiles that the first row tile's programs load anyway. Either in a loop of its own:
  # the other programs' pipelined loop stays free of them.
  SUMS: tl.constexpr = "ones" if R % BLOCK_R else "tiles"
  SUMMING: tl.constexpr = R // BLOCK_R if R % BLOCK_R else 0  # the row tile that sums
  if BIAS and pid // F_TILES == SUMMING:
    acc, sums = _wgrad_tile(x_ptr, dy_ptr, m_ptr, r, f, g, s, N, C, H, W, F, KH, KW, STRIDE, PAD, GROUPS, INPUT,
                            INPUT_PRECISION, BLOCK_R, BLOCK_F, BLOCK_P, SPLIT_STEPS, SUMS)
    tl.store(db_ptr + s * F + g * FG + f, sums, mask=f < FG)
  else:
    acc, sums = _wgrad_tile(x_ptr, dy_ptr, m_ptr, r, f, g, s, N, C, H, W, F, KH, KW, STRIDE, PAD, GROUPS, INPUT,
                            INPUT_PRECISION, BLOCK_R, BLOCK_F, BLOCK_P, SPLIT_STEPS, "none")
  tl.store(dw_ptr + s * (R * F) + r[:, None] * F + (g * FG + f)[None, :], acc,
           mask=(r < R)[:, None] & (f < FG)[None, :])


@dataclasses.dataclass(frozen=True)
class Tiles:
  """One kernel's blocking. rows × cols is the output tile of a program, depth the reduction step:
  fwd (BLOCK_F, BLOCK_P, BLOCK_K), dgrad (BLOCK_C, BLOCK_Q, BLOCK_K), wgrad (BLOCK_R, BLOCK_F, BLOCK_P)."""

  rows: int
  cols: int
  depth: int
  num_warps: int
  num_stages: int
  columns: int = WGRAD_COLUMNS_PER_PROGRAM  # wgrad: reduction columns per program (its split of the sum)

  def __post_init__(self):
    blocks = (self.rows, self.cols, self.depth)
    if any(b < 16 or b & (b - 1) for b in blocks) or self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
      raise ValueError(f"tiles {self}: blocks must be powers of two ≥ 16 (tl.dot), warps a power of two ≤ 16")


BLOCK_NAMES = {"fwd": ("BLOCK_F", "BLOCK_P", "BLOCK_K"), "dgrad": ("BLOCK_C", "BLOCK_Q", "BLOCK_K"),
               "wgrad": ("BLOCK_R", "BLOCK_F", "BLOCK_P")}


def _block(n: int, lo: int, hi: int) -> int:
  return min(hi, max(lo, triton.next_power_of_2(n)))


def tiles_for(kernel, x_shape, w_shape, stride, padding, groups, dtype_name) -> Tiles:
  """The tiles a launch uses when none are given: for 16-bit inputs (float32 tiles take twice the shared memory per
  stage) the tuned table's entry for this layer at the nearest batch tuned (in ratio), of this group count where it
  has one (the larger batch on a tie), else the rule of thumb."""
  _, n, *layer, g = tile_key(kernel, x_shape, w_shape, stride, padding, groups)
  tuned = [(abs(math.log2(k[1] / n)), k[-1] != g, -k[1], t) for k, t in TUNED.items()
           if k[0] == kernel and list(k[2:-1]) == layer]
  if tuned and dtype_name in ("float16", "bfloat16"):
    return Tiles(*min(tuned, key=lambda e: e[:3])[3])
  return rule_of_thumb(kernel, x_shape, w_shape, stride, padding, groups)


def rule_of_thumb(kernel, x_shape, w_shape, stride, padding, groups) -> Tiles:
  """Blocks of the next power of two of their count, clamped to [16, 128] (the reduction step to [16, 32], wgrad's
  to [16, 64]; tl.dot needs ≥ 16); 8 warps for a 128×128 output tile, else 4; 3 pipeline stages."""
  _, h, w, n = x_shape
  cg, kh, kw, f = w_shape
  oh, ow = out_size(h, kh, stride, padding), out_size(w, kw, stride, padding)
  if kernel == "fwd":
    rows, cols, depth = _block(f // groups, 16, 128), _block(oh * ow * n, 16, 128), _block(cg * kh * kw, 16, 32)
  elif kernel == "dgrad":
    rows, cols, depth = _block(cg, 16, 128), _block(h * w * n, 16, 128), _block(kh * kw * f // groups, 16, 32)
  else:
    rows, cols, depth = _block(cg * kh * kw, 16, 128), _block(f // groups, 16, 128), _block(oh * ow * n, 16, 64)
  return Tiles(rows, cols, depth, num_warps=8 if rows * cols >= 128 * 128 else 4, num_stages=3)


def _geometry(x_shape, w_shape, stride, padding, groups, dtype_name, input_precision):
  """Checks one layer's shapes; returns its constexpr shape parameters and (OH, OW)."""
  c, h, w, n = x_shape
  cg, kh, kw, f = w_shape
  if c != cg * groups or f % groups:
    raise ValueError(f"conv: images {x_shape} and filters {w_shape} need channels == {cg}·groups and filters "
                     f"divisible by groups={groups}")
  if stride < 1 or padding < 0:
    raise ValueError(f"conv: stride {stride} must be ≥ 1 and padding {padding} ≥ 0")
  oh, ow = out_size(h, kh, stride, padding), out_size(w, kw, stride, padding)
  if min(oh, ow, n) < 1:
    raise ValueError(f"conv: {kh}×{kw} filters do not fit images {x_shape} with padding {padding}")
  if dtype_name not in DTYPES or input_precision not in INPUT_PRECISIONS:
    raise ValueError(f"conv: dtype {dtype_name!r} must be one of {DTYPES} and input_precision "
                     f"{input_precision!r} one of {INPUT_PRECISIONS}")
  shape = dict(N=n, C=c, H=h, W=w, F=f, KH=kh, KW=kw, STRIDE=stride, PAD=padding, GROUPS=groups)
  return shape, oh, ow


def _launch(kernel, grid, shape, tiles: Tiles, **constexprs) -> Launch:
  blocks = dict(zip(BLOCK_NAMES[kernel], (tiles.rows, tiles.cols, tiles.depth)))
  jit = {"fwd": conv_fwd_kernel, "dgrad": conv_dgrad_kernel, "wgrad": conv_wgrad_kernel}[kernel]
  return Launch(jit, grid=grid, constexprs=dict(shape, **constexprs, **blocks), num_warps=tiles.num_warps,
                num_stages=tiles.num_stages)


def conv_fwd_launch(x_shape, w_shape, stride, padding, groups, relu, has_bias, dtype_name,
                    input_precision="ieee", tiles: Tiles | None = None, images="plain") -> Launch:
  """conv_fwd_kernel(x, w, b, m, y) for x (C, H, W, N) and w (C/G, KH, KW, F): y is (F, OH, OW, N) in x's dtype; x
  read as `images` says (one of INPUTS), m read only where it is 'masked' (any array otherwise)."""
  _check_images(images)
  shape, oh, ow = _geometry(x_shape, w_shape, stride, padding, groups, dtype_name, input_precision)
  t = tiles or tiles_for("fwd", x_shape, w_shape, stride, padding, groups, dtype_name)
  grid = (triton.cdiv(w_shape[3] // groups, t.rows) * triton.cdiv(oh * ow * shape["N"], t.cols), groups)
  return _launch("fwd", grid, shape, t, HAS_BIAS=bool(has_bias), RELU=bool(relu), INPUT=images,
                 INPUT_PRECISION=input_precision)


def conv_dgrad_launch(x_shape, w_shape, stride, padding, groups, dtype_name, input_precision="ieee",
                      tiles: Tiles | None = None, masked=False) -> Launch:
  """conv_dgrad_kernel(dy, w, m, dx): dy (F, OH, OW, N) and w as in the forward pass; dx has x_shape and dy's dtype;
  with `masked`, 0 where m (of x_shape) is not positive (m unread without: any array)."""
  shape, _, _ = _geometry(x_shape, w_shape, stride, padding, groups, dtype_name, input_precision)
  t = tiles or tiles_for("dgrad", x_shape, w_shape, stride, padding, groups, dtype_name)
  grid = (triton.cdiv(w_shape[0], t.rows) * triton.cdiv(shape["H"] * shape["W"] * shape["N"], t.cols), groups)
  return _launch("dgrad", grid, shape, t, MASKED=bool(masked), INPUT_PRECISION=input_precision)


def conv_wgrad_launch(x_shape, w_shape, stride, padding, groups, dtype_name, input_precision="ieee",
                      split=None, tiles: Tiles | None = None, bias=False, images="plain") -> Launch:
  """conv_wgrad_kernel(x, dy, m, dw, db): dw is float32 (SPLIT, C/G, KH, KW, F), SPLIT = constexprs["SPLIT"]; with
  `bias`, db is float32 (SPLIT, F), else any float32 array, unwritten; x read as `images` says (conv_fwd_launch).

  split, if given, asks for that many partial sums (fewer come back when the columns run out).
  """
  _check_images(images)
  shape, oh, ow = _geometry(x_shape, w_shape, stride, padding, groups, dtype_name, input_precision)
  cg, kh, kw, f = w_shape
  t = tiles or tiles_for("wgrad", x_shape, w_shape, stride, padding, groups, dtype_name)
  steps = triton.cdiv(oh * ow * shape["N"], t.depth)
  want = split if split is not None else triton.cdiv(steps * t.depth, t.columns)
  split_steps = triton.cdiv(steps, max(1, min(want, steps)))
  n_split = triton.cdiv(steps, split_steps)  # recount so that no program is left without columns
  grid = (triton.cdiv(cg * kh * kw, t.rows) * triton.cdiv(f // groups, t.cols), n_split, groups)
  return _launch("wgrad", grid, shape, t, BIAS=bool(bias), INPUT=images, INPUT_PRECISION=input_precision,
                 SPLIT=n_split, SPLIT_STEPS=split_steps)


def _check_images(images):
  if images not in INPUTS:
    raise ValueError(f"conv: images {images!r} must be read as one of {INPUTS}")
