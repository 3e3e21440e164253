"""The conv kernels' tiles per layer and batch for 16-bit inputs, tuned on one H200 (some again on one H100, below):
what `conv.tiles_for` reads.

Key: (kernel, N, C/G, H, W, F/G, KH, KW, STRIDE, PAD, G), the layer as one device runs it: a tower of the paper's
split (G = 1), or the towers side by side on one device as G groups, whose grid is G times the split's and may want
other tiles. Value: Tiles fields (rows, cols, depth, num_warps, num_stages, wgrad columns per program). A batch not in
the table takes the nearest one tuned, and a group count not tuned the same layer's other entries (conv.tiles_for).
Each entry is the fastest of ~20–60 candidates (scripts/dev/tune_kernels.py's `candidates`) in bfloat16, from
  python3 scripts/dev/tune_kernels.py --kernels fwd,dgrad,wgrad --config configs/alexnet_2gpu.py --batch 512
      --workers 14
(and --batch 128, 1024; the one-device conv1 and conv3 at 1024 take the 512 entries); the two-group conv2 wgrad and
conv4 and conv5 entries at 512 (conv4's and conv5's where they beat the fallback tiles by more than 3 %) from
  python3 scripts/dev/tune_kernels.py --config configs/alexnet_1gpu.py --batch 512 --placements one
      --kernels fwd,dgrad,wgrad --layers conv4 --wgrad_columns 8192,16384 --workers 6   (and conv5; conv2's wgrad)
VGG-16's layers at 128 (where the best beat the rule of thumb by more than 3 %, the timings' spread; VGG-11's layers
are VGG-16's) from
  python3 scripts/dev/tune_kernels.py --config configs/vgg16.py --batch 128 --placements one
      --kernels fwd,dgrad,wgrad --min_tile 16384 --workers 8 --calls 10 --rounds 3
After the forward's reduction took the filter taps' order (conv.py), its entries for the one-device conv3, conv4 and
conv5 at 128 and 512 and for VGG-16's layers at 128 were tuned again on one H100, each kept where the best beat the
tiles the table gave by more than 3 %, from
  python3 scripts/dev/tune_kernels.py --config configs/alexnet_1gpu.py --batch 512 --placements one --kernels fwd
      --layers conv3,conv4,conv5 --workers 14   (and --batch 128)
  python3 scripts/dev/tune_kernels.py --config configs/vgg16.py --batch 128 --placements one --kernels fwd
      --min_tile 16384 --workers 6 --calls 10 --rounds 3
and VGG-16's two largest layers' data and filter gradients at 128 on one H100 (conv2_2's data gradient kept) from
  python3 scripts/dev/tune_kernels.py --config configs/vgg16.py --batch 128 --placements one --kernels dgrad,wgrad
      --layers conv1_2,conv2_2 --min_tile 16384 --workers 8 --calls 10 --rounds 3
The runs, with each candidate's time and the rule of thumb's: docs/results/tune_kernels_*_b{128,512,1024}.json,
docs/results/tune_kernels_*_conv{2_wgrad_columns,4_one,5_one}_b512.json, tune_kernels_vgg16_*_b128.json and
tune_kernels_fwd_conv3_5_one_h100_*.json; docs/BENCHMARKS.md has the figures.
"""


def tile_key(kernel, x_shape, w_shape, stride, padding, groups) -> tuple:
  """(kernel, N, C/G, H, W, F/G, KH, KW, STRIDE, PAD, G): what TUNED is keyed by."""
  _, h, w, n = x_shape
  cg, kh, kw, f = w_shape
  return (kernel, n, cg, h, w, f // groups, kh, kw, stride, padding, groups)


TUNED = {
    ("fwd", 128, 3, 224, 224, 48, 11, 11, 4, 2, 1): (64, 256, 32, 4, 3, 4096),  # conv1 split
    ("wgrad", 128, 3, 224, 224, 48, 11, 11, 4, 2, 1): (64, 64, 64, 4, 4, 4096),  # conv1 split
    ("fwd", 128, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 32, 4, 3, 4096),  # conv2 split
    ("dgrad", 128, 48, 27, 27, 128, 5, 5, 1, 2, 1): (64, 128, 64, 4, 3, 4096),  # conv2 split
    ("wgrad", 128, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 64, 8, 3, 4096),  # conv2 split
    ("fwd", 128, 256, 13, 13, 192, 3, 3, 1, 1, 1): (256, 64, 32, 4, 3, 4096),  # conv3 split
    ("dgrad", 128, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 128, 32, 4, 4, 4096),  # conv3 split
    ("wgrad", 128, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # conv3 split
    ("fwd", 128, 192, 13, 13, 192, 3, 3, 1, 1, 1): (64, 128, 32, 4, 3, 4096),  # conv4 split
    ("dgrad", 128, 192, 13, 13, 192, 3, 3, 1, 1, 1): (64, 128, 64, 4, 4, 4096),  # conv4 split
    ("wgrad", 128, 192, 13, 13, 192, 3, 3, 1, 1, 1): (128, 64, 64, 4, 3, 4096),  # conv4 split
    ("fwd", 128, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 128, 64, 4, 3, 4096),  # conv5 split
    ("dgrad", 128, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 128, 64, 4, 3, 4096),  # conv5 split
    ("wgrad", 128, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 64, 64, 4, 4, 4096),  # conv5 split
    ("fwd", 128, 3, 224, 224, 96, 11, 11, 4, 2, 1): (128, 128, 32, 4, 3, 4096),  # conv1 one
    ("wgrad", 128, 3, 224, 224, 96, 11, 11, 4, 2, 1): (64, 128, 64, 4, 3, 4096),  # conv1 one
    ("fwd", 128, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # conv3 one
    ("dgrad", 128, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 128, 64, 8, 3, 4096),  # conv3 one
    ("wgrad", 128, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 64, 64, 4, 3, 4096),  # conv3 one
    ("fwd", 128, 192, 13, 13, 128, 3, 3, 1, 1, 2): (128, 128, 64, 8, 3, 4096),  # conv5 one
    ("fwd", 512, 3, 224, 224, 48, 11, 11, 4, 2, 1): (64, 256, 32, 4, 4, 4096),  # conv1 split
    ("wgrad", 512, 3, 224, 224, 48, 11, 11, 4, 2, 1): (128, 64, 64, 4, 3, 4096),  # conv1 split
    ("fwd", 512, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 32, 4, 3, 4096),  # conv2 split
    ("dgrad", 512, 48, 27, 27, 128, 5, 5, 1, 2, 1): (64, 256, 64, 8, 4, 4096),  # conv2 split
    ("wgrad", 512, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 64, 8, 3, 4096),  # conv2 split
    ("wgrad", 512, 48, 27, 27, 128, 5, 5, 1, 2, 2): (128, 128, 64, 8, 3, 8192),  # conv2 one
    ("fwd", 512, 256, 13, 13, 192, 3, 3, 1, 1, 1): (256, 128, 64, 8, 4, 4096),  # conv3 split
    ("dgrad", 512, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 128, 64, 4, 3, 4096),  # conv3 split
    ("wgrad", 512, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # conv3 split
    ("fwd", 512, 192, 13, 13, 192, 3, 3, 1, 1, 1): (256, 128, 32, 8, 4, 4096),  # conv4 split
    ("dgrad", 512, 192, 13, 13, 192, 3, 3, 1, 1, 1): (64, 256, 64, 4, 3, 4096),  # conv4 split
    ("wgrad", 512, 192, 13, 13, 192, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # conv4 split
    ("fwd", 512, 192, 13, 13, 128, 3, 3, 1, 1, 1): (128, 64, 64, 4, 3, 4096),  # conv5 split
    ("dgrad", 512, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 256, 32, 4, 4, 4096),  # conv5 split
    ("wgrad", 512, 192, 13, 13, 128, 3, 3, 1, 1, 1): (128, 128, 32, 4, 4, 4096),  # conv5 split
    ("fwd", 512, 192, 13, 13, 192, 3, 3, 1, 1, 2): (128, 256, 64, 8, 3, 4096),  # conv4 one
    ("dgrad", 512, 192, 13, 13, 192, 3, 3, 1, 1, 2): (64, 256, 32, 4, 3, 4096),  # conv4 one
    ("fwd", 512, 192, 13, 13, 128, 3, 3, 1, 1, 2): (128, 128, 64, 4, 3, 4096),  # conv5 one
    ("wgrad", 512, 192, 13, 13, 128, 3, 3, 1, 1, 2): (64, 128, 64, 4, 3, 4096),  # conv5 one
    ("fwd", 512, 3, 224, 224, 96, 11, 11, 4, 2, 1): (128, 128, 32, 4, 3, 4096),  # conv1 one
    ("wgrad", 512, 3, 224, 224, 96, 11, 11, 4, 2, 1): (128, 128, 64, 8, 3, 4096),  # conv1 one
    ("fwd", 512, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # conv3 one
    ("dgrad", 512, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 128, 64, 4, 3, 4096),  # conv3 one
    ("wgrad", 512, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 128, 64, 4, 3, 4096),  # conv3 one
    ("fwd", 1024, 3, 224, 224, 48, 11, 11, 4, 2, 1): (64, 256, 32, 4, 3, 4096),  # conv1 split
    ("wgrad", 1024, 3, 224, 224, 48, 11, 11, 4, 2, 1): (128, 64, 64, 4, 4, 4096),  # conv1 split
    ("fwd", 1024, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 32, 4, 3, 4096),  # conv2 split
    ("dgrad", 1024, 48, 27, 27, 128, 5, 5, 1, 2, 1): (64, 256, 32, 4, 4, 4096),  # conv2 split
    ("wgrad", 1024, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 64, 8, 3, 4096),  # conv2 split
    ("fwd", 1024, 256, 13, 13, 192, 3, 3, 1, 1, 1): (256, 128, 32, 8, 4, 4096),  # conv3 split
    ("dgrad", 1024, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 128, 64, 4, 3, 4096),  # conv3 split
    ("wgrad", 1024, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # conv3 split
    ("fwd", 1024, 192, 13, 13, 192, 3, 3, 1, 1, 1): (256, 128, 32, 8, 4, 4096),  # conv4 split
    ("dgrad", 1024, 192, 13, 13, 192, 3, 3, 1, 1, 1): (64, 256, 32, 4, 3, 4096),  # conv4 split
    ("wgrad", 1024, 192, 13, 13, 192, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # conv4 split
    ("fwd", 1024, 192, 13, 13, 128, 3, 3, 1, 1, 1): (128, 128, 64, 8, 3, 4096),  # conv5 split
    ("dgrad", 1024, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 256, 32, 4, 4, 4096),  # conv5 split
    ("wgrad", 1024, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 128, 64, 4, 3, 4096),  # conv5 split
    ("fwd", 128, 64, 224, 224, 64, 3, 3, 1, 1, 1): (64, 256, 32, 4, 4, 4096),  # vgg conv1_2
    ("dgrad", 128, 64, 224, 224, 64, 3, 3, 1, 1, 1): (64, 256, 32, 4, 3, 4096),  # vgg conv1_2
    ("fwd", 128, 64, 112, 112, 128, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv2_1
    ("dgrad", 128, 64, 112, 112, 128, 3, 3, 1, 1, 1): (64, 256, 64, 4, 4, 4096),  # vgg conv2_1
    ("fwd", 128, 128, 112, 112, 128, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv2_2
    ("dgrad", 128, 128, 112, 112, 128, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv2_2
    ("fwd", 128, 128, 56, 56, 256, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # vgg conv3_1
    ("dgrad", 128, 128, 56, 56, 256, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # vgg conv3_1
    ("wgrad", 128, 128, 56, 56, 256, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv3_1
    ("fwd", 128, 256, 56, 56, 256, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # vgg conv3_2, conv3_3
    ("dgrad", 128, 256, 56, 56, 256, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv3_2, conv3_3
    ("wgrad", 128, 256, 56, 56, 256, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv3_2, conv3_3
    ("fwd", 128, 256, 28, 28, 512, 3, 3, 1, 1, 1): (256, 128, 32, 8, 4, 4096),  # vgg conv4_1
    ("dgrad", 128, 256, 28, 28, 512, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv4_1
    ("wgrad", 128, 256, 28, 28, 512, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv4_1
    ("fwd", 128, 512, 28, 28, 512, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # vgg conv4_2, conv4_3
    ("dgrad", 128, 512, 28, 28, 512, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv4_2, conv4_3
    ("wgrad", 128, 512, 28, 28, 512, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv4_2, conv4_3
    ("fwd", 128, 512, 14, 14, 512, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # vgg conv5_1, conv5_2, conv5_3
    ("dgrad", 128, 512, 14, 14, 512, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # vgg conv5_1, conv5_2, conv5_3
    ("wgrad", 128, 512, 14, 14, 512, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # vgg conv5_1, conv5_2, conv5_3
}
