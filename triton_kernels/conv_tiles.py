"""The conv kernels' tiles per layer and batch for 16-bit inputs, as measured: what `conv.tiles_for` reads.

Key: (kernel, N, C/G, H, W, F/G, KH, KW, STRIDE, PAD, G), the layer as one device runs it: a tower of the paper's
split (G = 1), or the towers side by side on one device as G groups, whose grid is G times the split's and may want
other tiles. Value: Tiles fields (rows, cols, depth, num_warps, num_stages, wgrad columns per program). A batch not in
the table takes the nearest one tuned, and a group count not tuned the same layer's other entries (conv.tiles_for).
Each entry is the fastest of ~20–60 candidates (scripts/tune_kernels.py's `candidates`), with its time and the rule
of thumb's in the comment.

Measured 2026-12-01 on one NVIDIA H200, bfloat16, commit ec5e197
(docs/results/tune_kernels_2026-12-01_b{128,512,1024}.json):
  python3 scripts/tune_kernels.py --kernels fwd,dgrad,wgrad --config configs/alexnet_2gpu.py --batch 512 --workers 14
(and --batch 128, 1024; at 1024 the run ended before the one-device conv1 and conv3, which take the 512 entries).
conv2's two-group filter gradient at 512: 2026-12-02, commit 7663d41, the candidates timed chained
(docs/results/tune_kernels_2026-12-02_conv2_wgrad_columns_b512.json):
  python3 scripts/tune_kernels.py --config configs/alexnet_1gpu.py --batch 512 --placements one --kernels wgrad
      --layers conv2 --wgrad_columns 8192,16384 --workers 6
conv4's and conv5's two-group kernels at 512 where the best beat the tiles they fell back to by more than 3 %:
2026-12-02, commit be5a065, timed chained (docs/results/tune_kernels_2026-12-02_conv{4,5}_one_b512.json):
  python3 scripts/tune_kernels.py --config configs/alexnet_1gpu.py --batch 512 --placements one
      --kernels fwd,dgrad,wgrad --layers conv4 --wgrad_columns 8192,16384 --workers 6   (and conv5)
"""

TUNED = {
    ("fwd", 128, 3, 224, 224, 48, 11, 11, 4, 2, 1): (64, 256, 32, 4, 3, 4096),  # conv1 split 0.077 ms (rule 0.086)
    ("wgrad", 128, 3, 224, 224, 48, 11, 11, 4, 2, 1): (64, 64, 64, 4, 4, 4096),  # conv1 split 0.076 ms (rule 0.076)
    ("fwd", 128, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 32, 4, 3, 4096),  # conv2 split 0.084 ms (rule 0.095)
    ("dgrad", 128, 48, 27, 27, 128, 5, 5, 1, 2, 1): (64, 128, 64, 4, 3, 4096),  # conv2 split 0.094 ms (rule 0.134)
    ("wgrad", 128, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 64, 8, 3, 4096),  # conv2 split 0.073 ms (rule 0.073)
    ("fwd", 128, 256, 13, 13, 192, 3, 3, 1, 1, 1): (256, 64, 32, 4, 3, 4096),  # conv3 split 0.065 ms (rule 0.088)
    ("dgrad", 128, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 128, 32, 4, 4, 4096),  # conv3 split 0.049 ms (rule 0.065)
    ("wgrad", 128, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # conv3 split 0.058 ms (rule 0.066)
    ("fwd", 128, 192, 13, 13, 192, 3, 3, 1, 1, 1): (64, 128, 32, 4, 3, 4096),  # conv4 split 0.053 ms (rule 0.069)
    ("dgrad", 128, 192, 13, 13, 192, 3, 3, 1, 1, 1): (64, 128, 64, 4, 4, 4096),  # conv4 split 0.041 ms (rule 0.067)
    ("wgrad", 128, 192, 13, 13, 192, 3, 3, 1, 1, 1): (128, 64, 64, 4, 3, 4096),  # conv4 split 0.048 ms (rule 0.066)
    ("fwd", 128, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 128, 64, 4, 3, 4096),  # conv5 split 0.043 ms (rule 0.049)
    ("dgrad", 128, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 128, 64, 4, 3, 4096),  # conv5 split 0.037 ms (rule 0.043)
    ("wgrad", 128, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 64, 64, 4, 4, 4096),  # conv5 split 0.042 ms (rule 0.065)
    ("fwd", 128, 3, 224, 224, 96, 11, 11, 4, 2, 1): (128, 128, 32, 4, 3, 4096),  # conv1 one 0.110 ms (rule 0.124)
    ("wgrad", 128, 3, 224, 224, 96, 11, 11, 4, 2, 1): (64, 128, 64, 4, 3, 4096),  # conv1 one 0.100 ms (rule 0.109)
    ("fwd", 128, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # conv3 one 0.086 ms (rule 0.113)
    ("dgrad", 128, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 128, 64, 8, 3, 4096),  # conv3 one 0.087 ms (rule 0.115)
    ("wgrad", 128, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 64, 64, 4, 3, 4096),  # conv3 one 0.102 ms (rule 0.103)
    ("fwd", 512, 3, 224, 224, 48, 11, 11, 4, 2, 1): (64, 256, 32, 4, 4, 4096),  # conv1 split 0.270 ms (rule 0.275)
    ("wgrad", 512, 3, 224, 224, 48, 11, 11, 4, 2, 1): (128, 64, 64, 4, 3, 4096),  # conv1 split 0.203 ms (rule 0.203)
    ("fwd", 512, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 32, 4, 3, 4096),  # conv2 split 0.259 ms (rule 0.315)
    ("dgrad", 512, 48, 27, 27, 128, 5, 5, 1, 2, 1): (64, 256, 64, 8, 4, 4096),  # conv2 split 0.330 ms (rule 0.382)
    ("wgrad", 512, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 64, 8, 3, 4096),  # conv2 split 0.234 ms (rule 0.234)
    ("wgrad", 512, 48, 27, 27, 128, 5, 5, 1, 2, 2): (128, 128, 64, 8, 3, 8192),  # conv2 one 0.456 ms (4096: 0.489)
    ("fwd", 512, 256, 13, 13, 192, 3, 3, 1, 1, 1): (256, 128, 64, 8, 4, 4096),  # conv3 split 0.206 ms (rule 0.264)
    ("dgrad", 512, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 128, 64, 4, 3, 4096),  # conv3 split 0.157 ms (rule 0.189)
    ("wgrad", 512, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # conv3 split 0.165 ms (rule 0.185)
    ("fwd", 512, 192, 13, 13, 192, 3, 3, 1, 1, 1): (256, 128, 32, 8, 4, 4096),  # conv4 split 0.163 ms (rule 0.195)
    ("dgrad", 512, 192, 13, 13, 192, 3, 3, 1, 1, 1): (64, 256, 64, 4, 3, 4096),  # conv4 split 0.141 ms (rule 0.190)
    ("wgrad", 512, 192, 13, 13, 192, 3, 3, 1, 1, 1): (128, 256, 64, 8, 4, 4096),  # conv4 split 0.156 ms (rule 0.160)
    ("fwd", 512, 192, 13, 13, 128, 3, 3, 1, 1, 1): (128, 64, 64, 4, 3, 4096),  # conv5 split 0.096 ms (rule 0.106)
    ("dgrad", 512, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 256, 32, 4, 4, 4096),  # conv5 split 0.092 ms (rule 0.124)
    ("wgrad", 512, 192, 13, 13, 128, 3, 3, 1, 1, 1): (128, 128, 32, 4, 4, 4096),  # conv5 split 0.102 ms (rule 0.107)
    ("dgrad", 512, 192, 13, 13, 192, 3, 3, 1, 1, 2): (64, 256, 32, 4, 3, 4096),  # conv4 one 0.260 ms (was 0.278)
    ("fwd", 512, 192, 13, 13, 128, 3, 3, 1, 1, 2): (128, 128, 64, 4, 3, 4096),  # conv5 one 0.170 ms (was 0.187)
    ("wgrad", 512, 192, 13, 13, 128, 3, 3, 1, 1, 2): (64, 128, 64, 4, 3, 4096),  # conv5 one 0.174 ms (was 0.211)
    ("fwd", 512, 3, 224, 224, 96, 11, 11, 4, 2, 1): (128, 128, 32, 4, 3, 4096),  # conv1 one 0.397 ms (rule 0.451)
    ("wgrad", 512, 3, 224, 224, 96, 11, 11, 4, 2, 1): (128, 128, 64, 8, 3, 4096),  # conv1 one 0.295 ms (rule 0.295)
    ("fwd", 512, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # conv3 one 0.317 ms (rule 0.359)
    ("dgrad", 512, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 128, 64, 4, 3, 4096),  # conv3 one 0.286 ms (rule 0.361)
    ("wgrad", 512, 256, 13, 13, 384, 3, 3, 1, 1, 1): (128, 128, 64, 4, 3, 4096),  # conv3 one 0.285 ms (rule 0.292)
    ("fwd", 1024, 3, 224, 224, 48, 11, 11, 4, 2, 1): (64, 256, 32, 4, 3, 4096),  # conv1 split 0.517 ms (rule 0.533)
    ("wgrad", 1024, 3, 224, 224, 48, 11, 11, 4, 2, 1): (128, 64, 64, 4, 4, 4096),  # conv1 split 0.431 ms (rule 0.496)
    ("fwd", 1024, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 32, 4, 3, 4096),  # conv2 split 0.495 ms (rule 0.592)
    ("dgrad", 1024, 48, 27, 27, 128, 5, 5, 1, 2, 1): (64, 256, 32, 4, 4, 4096),  # conv2 split 0.632 ms (rule 0.735)
    ("wgrad", 1024, 48, 27, 27, 128, 5, 5, 1, 2, 1): (128, 128, 64, 8, 3, 4096),  # conv2 split 0.452 ms (rule 0.452)
    ("fwd", 1024, 256, 13, 13, 192, 3, 3, 1, 1, 1): (256, 128, 32, 8, 4, 4096),  # conv3 split 0.358 ms (rule 0.424)
    ("dgrad", 1024, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 128, 64, 4, 3, 4096),  # conv3 split 0.281 ms (rule 0.347)
    ("wgrad", 1024, 256, 13, 13, 192, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # conv3 split 0.320 ms (rule 0.362)
    ("fwd", 1024, 192, 13, 13, 192, 3, 3, 1, 1, 1): (256, 128, 32, 8, 4, 4096),  # conv4 split 0.288 ms (rule 0.322)
    ("dgrad", 1024, 192, 13, 13, 192, 3, 3, 1, 1, 1): (64, 256, 32, 4, 3, 4096),  # conv4 split 0.261 ms (rule 0.356)
    ("wgrad", 1024, 192, 13, 13, 192, 3, 3, 1, 1, 1): (128, 256, 64, 8, 3, 4096),  # conv4 split 0.259 ms (rule 0.302)
    ("fwd", 1024, 192, 13, 13, 128, 3, 3, 1, 1, 1): (128, 128, 64, 8, 3, 4096),  # conv5 split 0.162 ms (rule 0.177)
    ("dgrad", 1024, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 256, 32, 4, 4, 4096),  # conv5 split 0.171 ms (rule 0.230)
    ("wgrad", 1024, 192, 13, 13, 128, 3, 3, 1, 1, 1): (64, 128, 64, 4, 3, 4096),  # conv5 split 0.169 ms (rule 0.180)
}
