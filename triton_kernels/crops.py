"""The training input: each stored image's crop, mirrored, shifted in colour and normalised, written CHWN.

  images (N, S, S, 3) uint8, offsets (N, 2) int32 (top, left), flips (N,) int8, shifts (N, 3) float32
  → out (3, SIZE, SIZE, N) in out's dtype:  out[c, i, j, n] = (images[n, top + i, col, c] / 255 + shift[n, c]
                                                               − MEAN[c]) / STD[c],  col = left + j, or
                                                               left + SIZE − 1 − j where flips[n]

as the data's device augmentation computes it in XLA (crop, flip, colour shift, normalise), in one pass: a program
reads NB images' pixels along one crop row (WB columns each: runs of 3·WB bytes of one image) and writes them with
the image axis fastest, so the transpose to CHWN happens in its registers. XLA cuts the crops out of 3-byte pixels
one byte per thread and transposes them in a second pass; beyond the 50 MB of an H200's L2 (a batch of 512 stored
images is 100 MB) its gather reads a sector per byte.
"""

import triton
import triton.language as tl

from triton_kernels.launch import Launch

OUT_DTYPES = ("float32", "float16", "bfloat16")


@triton.jit
def crops_kernel(images_ptr, offsets_ptr, flips_ptr, shifts_ptr, out_ptr, N: tl.constexpr, S: tl.constexpr,
                 SIZE: tl.constexpr, MEAN0: tl.constexpr, MEAN1: tl.constexpr, MEAN2: tl.constexpr,
                 STD0: tl.constexpr, STD1: tl.constexpr, STD2: tl.constexpr, NB: tl.constexpr, WB: tl.constexpr):
  n = tl.program_id(0) * NB + tl.arange(0, NB)
  i = tl.program_id(1)
  j = tl.program_id(2) * WB + tl.arange(0, WB)
  image = n < N
  live = image[:, None] & (j < SIZE)[None, :]
  top = tl.load(offsets_ptr + 2 * n, mask=image, other=0)
  left = tl.load(offsets_ptr + 2 * n + 1, mask=image, other=0)
  flip = tl.load(flips_ptr + n, mask=image, other=0) != 0
  col = left[:, None] + tl.where(flip[:, None], SIZE - 1 - j[None, :], j[None, :])
  pixel = ((n[:, None].to(tl.int64) * S + top[:, None] + i) * S + col) * 3  # a batch's pixels pass 2^31 bytes soon
  out = (i * SIZE + j[None, :]) * N + n[:, None]
  for c in tl.static_range(3):
    mean = MEAN0 if c == 0 else (MEAN1 if c == 1 else MEAN2)
    std = STD0 if c == 0 else (STD1 if c == 1 else STD2)
    v = tl.load(images_ptr + pixel + c, mask=live, other=0).to(tl.float32)
    shift = tl.load(shifts_ptr + 3 * n + c, mask=image, other=0.0)
    y = (v / 255.0 + shift[:, None] - mean) / std
    tl.store(out_ptr + c * SIZE * SIZE * N + out, y.to(out_ptr.dtype.element_ty), mask=live)


def crops_launch(images_shape, size: int, mean, std, out_dtype_name: str) -> Launch:
  """images_shape is (N, S, S, 3); grid (image blocks, crop rows, column blocks)."""
  n, h, w, c = images_shape
  if c != 3 or h != w:
    raise ValueError(f"crops: images of shape {tuple(images_shape)} are not (N, S, S, 3)")
  if not 1 <= size <= h:
    raise ValueError(f"crops: a {size}×{size} crop does not fit {h}×{w} images")
  if out_dtype_name not in OUT_DTYPES:
    raise ValueError(f"crops: output dtype {out_dtype_name} is not one of {', '.join(OUT_DTYPES)}")
  if 3 * size * size * n >= 2**31:
    raise ValueError("crops: output offsets are int32; split the batch")
  # Tuned on one H200 (docs/BENCHMARKS.md): 64 images × 64 columns with 8 warps while the batch is small, 32 × 64
  # with 4 warps from 512 on, where the larger tile was the slower.
  nb, num_warps = (64, 8) if n <= 256 else (32, 4)
  nb = min(nb, max(16, triton.next_power_of_2(n)))
  wb = min(64, max(16, triton.next_power_of_2(size)))
  constexprs = dict(N=n, S=h, SIZE=size, MEAN0=float(mean[0]), MEAN1=float(mean[1]), MEAN2=float(mean[2]),
                    STD0=float(std[0]), STD1=float(std[1]), STD2=float(std[2]), NB=nb, WB=wb)
  return Launch(crops_kernel, grid=(triton.cdiv(n, nb), size, triton.cdiv(size, wb)), constexprs=constexprs,
                num_warps=num_warps, num_stages=1)
