"""Which of a convolution's three directions run our Triton kernel and which XLA's own convolution (cuDNN), per
layer, under kernel_backend 'auto' on CUDA: a table measured on one H200, as the kernels' tiles are
(triton_kernels/conv_tiles.py).

Key: triton_kernels.conv_tiles.tile_key (kernel, N, C/G, H, W, F/G, KH, KW, STRIDE, PAD, G), the layer as one device
runs it. Value: (our kernel's ms, XLA's ms) in bfloat16, each the median of scripts/dev/measure_conv_choice.py's
rounds (XLA's convolution on the same CHWN arrays, its layout changes included). A layer not measured runs our kernel;
a batch not measured takes the nearest one measured (in ratio). XLA is chosen only where it wins by more than MARGIN:
closer than that, the two are within the timings' spread and our kernel, the project's subject, runs.
"""

import math

from triton_kernels.conv_tiles import tile_key

MARGIN = 0.05

# NVIDIA H200, bfloat16, from
#   python3 scripts/dev/measure_conv_choice.py --run configs/alexnet_1gpu.py:128,512 --run configs/zfnet.py:128,512
#       --run configs/nin.py:128,512 --run configs/vgg11.py:128,256 --run configs/vgg16.py:128,256 --json OUT.json
# then --print_table OUT.json: docs/results/conv_choice_one_h200_2026-12-03.json; VGG's entries measured again at
# VGG-16's tuned tiles (conv_tiles.TUNED) with --run configs/vgg11.py:128,256 --run configs/vgg16.py:128,256:
# docs/results/conv_choice_vgg_one_h200_2026-12-05.json; AlexNet's entries measured again after the forward's tap
# order and tiles changed, with --run configs/alexnet_1gpu.py:512,128:
# docs/results/conv_choice_alexnet_one_h200_2026-12-07.json
MEASURED: dict[tuple, tuple[float, float]] = {
    ('dgrad', 128, 48, 27, 27, 128, 5, 5, 1, 2, 2): (0.1839, 0.4218),  # alexnet conv2
    ('dgrad', 128, 64, 112, 112, 128, 3, 3, 1, 1, 1): (0.5645, 0.9286),  # vgg11 conv2_1, vgg16 conv2_1
    ('dgrad', 128, 64, 224, 224, 64, 3, 3, 1, 1, 1): (1.2297, 1.9749),  # vgg16 conv1_2
    ('dgrad', 128, 96, 27, 27, 256, 5, 5, 1, 2, 1): (0.3248, 0.2781),  # nin conv2
    ('dgrad', 128, 96, 54, 54, 256, 5, 5, 2, 2, 1): (1.1721, 0.3254),  # zfnet conv2
    ('dgrad', 128, 96, 55, 55, 96, 1, 1, 1, 0, 1): (0.0757, 0.1742),  # nin cccp1, nin cccp2
    ('dgrad', 128, 128, 56, 56, 256, 3, 3, 1, 1, 1): (0.3741, 0.5316),  # vgg11 conv3_1, vgg16 conv3_1
    ('dgrad', 128, 128, 112, 112, 128, 3, 3, 1, 1, 1): (0.8363, 1.3339),  # vgg16 conv2_2
    ('dgrad', 128, 192, 13, 13, 128, 3, 3, 1, 1, 2): (0.0678, 0.1370),  # alexnet conv5
    ('dgrad', 128, 192, 13, 13, 192, 3, 3, 1, 1, 2): (0.0878, 0.1886),  # alexnet conv4
    ('dgrad', 128, 256, 13, 13, 384, 3, 3, 1, 1, 1): (0.0970, 0.1046),  # alexnet conv3, zfnet conv3, nin conv3
    ('dgrad', 128, 256, 27, 27, 256, 1, 1, 1, 0, 1): (0.0604, 0.1109),  # nin cccp3, nin cccp4
    ('dgrad', 128, 256, 28, 28, 512, 3, 3, 1, 1, 1): (0.3370, 0.4415),  # vgg11 conv4_1, vgg16 conv4_1
    ('dgrad', 128, 256, 56, 56, 256, 3, 3, 1, 1, 1): (0.7067, 0.9451),  # vgg11 conv3_2, vgg16 conv3_2, vgg16 conv3_3
    ('dgrad', 128, 384, 6, 6, 1024, 3, 3, 1, 1, 1): (0.1066, 0.0805),  # nin conv4-1024
    ('dgrad', 128, 384, 13, 13, 256, 3, 3, 1, 1, 1): (0.0892, 0.0975),  # zfnet conv5
    ('dgrad', 128, 384, 13, 13, 384, 1, 1, 1, 0, 1): (0.0484, 0.0898),  # nin cccp5, nin cccp6
    ('dgrad', 128, 384, 13, 13, 384, 3, 3, 1, 1, 1): (0.1408, 0.1213),  # zfnet conv4
    ('dgrad', 128, 512, 14, 14, 512, 3, 3, 1, 1, 1): (0.1734, 0.2034),  # vgg11 conv5_1, vgg11 conv5_2, vgg16 conv5_1…
    ('dgrad', 128, 512, 28, 28, 512, 3, 3, 1, 1, 1): (0.6584, 0.8027),  # vgg11 conv4_2, vgg16 conv4_2, vgg16 conv4_3
    ('dgrad', 128, 1024, 6, 6, 1000, 1, 1, 1, 0, 1): (0.0399, 0.0518),  # nin cccp8-1024
    ('dgrad', 128, 1024, 6, 6, 1024, 1, 1, 1, 0, 1): (0.0353, 0.0499),  # nin cccp7-1024
    ('dgrad', 256, 64, 112, 112, 128, 3, 3, 1, 1, 1): (1.1625, 1.6887),  # vgg11 conv2_1, vgg16 conv2_1
    ('dgrad', 256, 64, 224, 224, 64, 3, 3, 1, 1, 1): (2.5917, 3.9011),  # vgg16 conv1_2
    ('dgrad', 256, 128, 56, 56, 256, 3, 3, 1, 1, 1): (0.7439, 1.1290),  # vgg11 conv3_1, vgg16 conv3_1
    ('dgrad', 256, 128, 112, 112, 128, 3, 3, 1, 1, 1): (1.8424, 2.4001),  # vgg16 conv2_2
    ('dgrad', 256, 256, 28, 28, 512, 3, 3, 1, 1, 1): (0.6689, 0.8738),  # vgg11 conv4_1, vgg16 conv4_1
    ('dgrad', 256, 256, 56, 56, 256, 3, 3, 1, 1, 1): (1.4928, 1.9629),  # vgg11 conv3_2, vgg16 conv3_2, vgg16 conv3_3
    ('dgrad', 256, 512, 14, 14, 512, 3, 3, 1, 1, 1): (0.3341, 0.3978),  # vgg11 conv5_1, vgg11 conv5_2, vgg16 conv5_1…
    ('dgrad', 256, 512, 28, 28, 512, 3, 3, 1, 1, 1): (1.4457, 1.6080),  # vgg11 conv4_2, vgg16 conv4_2, vgg16 conv4_3
    ('dgrad', 512, 48, 27, 27, 128, 5, 5, 1, 2, 2): (0.6480, 1.2523),  # alexnet conv2
    ('dgrad', 512, 96, 27, 27, 256, 5, 5, 1, 2, 1): (1.2068, 1.0313),  # nin conv2
    ('dgrad', 512, 96, 54, 54, 256, 5, 5, 2, 2, 1): (4.5024, 1.1813),  # zfnet conv2
    ('dgrad', 512, 96, 55, 55, 96, 1, 1, 1, 0, 1): (0.2385, 0.6255),  # nin cccp1, nin cccp2
    ('dgrad', 512, 192, 13, 13, 128, 3, 3, 1, 1, 2): (0.1801, 0.4393),  # alexnet conv5
    ('dgrad', 512, 192, 13, 13, 192, 3, 3, 1, 1, 2): (0.2756, 0.5816),  # alexnet conv4
    ('dgrad', 512, 256, 13, 13, 384, 3, 3, 1, 1, 1): (0.3340, 0.3010),  # alexnet conv3, zfnet conv3, nin conv3
    ('dgrad', 512, 256, 27, 27, 256, 1, 1, 1, 0, 1): (0.1748, 0.3840),  # nin cccp3, nin cccp4
    ('dgrad', 512, 384, 6, 6, 1024, 3, 3, 1, 1, 1): (0.2918, 0.2434),  # nin conv4-1024
    ('dgrad', 512, 384, 13, 13, 256, 3, 3, 1, 1, 1): (0.3090, 0.3040),  # zfnet conv5
    ('dgrad', 512, 384, 13, 13, 384, 1, 1, 1, 0, 1): (0.0804, 0.1356),  # nin cccp5, nin cccp6
    ('dgrad', 512, 384, 13, 13, 384, 3, 3, 1, 1, 1): (0.5331, 0.4117),  # zfnet conv4
    ('dgrad', 512, 1024, 6, 6, 1000, 1, 1, 1, 0, 1): (0.1122, 0.1261),  # nin cccp8-1024
    ('dgrad', 512, 1024, 6, 6, 1024, 1, 1, 1, 0, 1): (0.0996, 0.1195),  # nin cccp7-1024
    ('fwd', 128, 3, 224, 224, 64, 3, 3, 1, 1, 1): (0.2647, 1.5711),  # vgg11 conv1_1, vgg16 conv1_1
    ('fwd', 128, 3, 224, 224, 96, 7, 7, 2, 1, 1): (0.2736, 1.7813),  # zfnet conv1
    ('fwd', 128, 3, 224, 224, 96, 11, 11, 4, 2, 1): (0.1212, 1.0360),  # alexnet conv1, nin conv1
    ('fwd', 128, 48, 27, 27, 128, 5, 5, 1, 2, 2): (0.1481, 0.3201),  # alexnet conv2
    ('fwd', 128, 64, 112, 112, 128, 3, 3, 1, 1, 1): (0.5129, 0.7782),  # vgg11 conv2_1, vgg16 conv2_1
    ('fwd', 128, 64, 224, 224, 64, 3, 3, 1, 1, 1): (1.4705, 2.0842),  # vgg16 conv1_2
    ('fwd', 128, 96, 27, 27, 256, 5, 5, 1, 2, 1): (0.2989, 0.2373),  # nin conv2
    ('fwd', 128, 96, 54, 54, 256, 5, 5, 2, 2, 1): (0.2818, 0.2767),  # zfnet conv2
    ('fwd', 128, 96, 55, 55, 96, 1, 1, 1, 0, 1): (0.0728, 0.1719),  # nin cccp1, nin cccp2
    ('fwd', 128, 128, 56, 56, 256, 3, 3, 1, 1, 1): (0.4638, 0.5422),  # vgg11 conv3_1, vgg16 conv3_1
    ('fwd', 128, 128, 112, 112, 128, 3, 3, 1, 1, 1): (1.0248, 1.3445),  # vgg16 conv2_2
    ('fwd', 128, 192, 13, 13, 128, 3, 3, 1, 1, 2): (0.0695, 0.1300),  # alexnet conv5
    ('fwd', 128, 192, 13, 13, 192, 3, 3, 1, 1, 2): (0.0887, 0.1605),  # alexnet conv4
    ('fwd', 128, 256, 13, 13, 384, 3, 3, 1, 1, 1): (0.0848, 0.0982),  # alexnet conv3, zfnet conv3, nin conv3
    ('fwd', 128, 256, 27, 27, 256, 1, 1, 1, 0, 1): (0.0649, 0.1172),  # nin cccp3, nin cccp4
    ('fwd', 128, 256, 28, 28, 512, 3, 3, 1, 1, 1): (0.4446, 0.4565),  # vgg11 conv4_1, vgg16 conv4_1
    ('fwd', 128, 256, 56, 56, 256, 3, 3, 1, 1, 1): (0.7995, 0.9221),  # vgg11 conv3_2, vgg16 conv3_2, vgg16 conv3_3
    ('fwd', 128, 384, 6, 6, 1024, 3, 3, 1, 1, 1): (0.1133, 0.0841),  # nin conv4-1024
    ('fwd', 128, 384, 13, 13, 256, 3, 3, 1, 1, 1): (0.1079, 0.0947),  # zfnet conv5
    ('fwd', 128, 384, 13, 13, 384, 1, 1, 1, 0, 1): (0.0486, 0.0616),  # nin cccp5, nin cccp6
    ('fwd', 128, 384, 13, 13, 384, 3, 3, 1, 1, 1): (0.1430, 0.1199),  # zfnet conv4
    ('fwd', 128, 512, 14, 14, 512, 3, 3, 1, 1, 1): (0.1976, 0.2086),  # vgg11 conv5_1, vgg11 conv5_2, vgg16 conv5_1, …
    ('fwd', 128, 512, 28, 28, 512, 3, 3, 1, 1, 1): (0.7899, 0.7768),  # vgg11 conv4_2, vgg16 conv4_2, vgg16 conv4_3
    ('fwd', 128, 1024, 6, 6, 1000, 1, 1, 1, 0, 1): (0.0494, 0.0687),  # nin cccp8-1024
    ('fwd', 128, 1024, 6, 6, 1024, 1, 1, 1, 0, 1): (0.0403, 0.0554),  # nin cccp7-1024
    ('fwd', 256, 3, 224, 224, 64, 3, 3, 1, 1, 1): (0.5023, 3.0782),  # vgg11 conv1_1, vgg16 conv1_1
    ('fwd', 256, 64, 112, 112, 128, 3, 3, 1, 1, 1): (1.0127, 1.5610),  # vgg11 conv2_1, vgg16 conv2_1
    ('fwd', 256, 64, 224, 224, 64, 3, 3, 1, 1, 1): (3.0290, 3.9669),  # vgg16 conv1_2
    ('fwd', 256, 128, 56, 56, 256, 3, 3, 1, 1, 1): (0.9111, 1.1994),  # vgg11 conv3_1, vgg16 conv3_1
    ('fwd', 256, 128, 112, 112, 128, 3, 3, 1, 1, 1): (2.1584, 2.4570),  # vgg16 conv2_2
    ('fwd', 256, 256, 28, 28, 512, 3, 3, 1, 1, 1): (0.9030, 0.8813),  # vgg11 conv4_1, vgg16 conv4_1
    ('fwd', 256, 256, 56, 56, 256, 3, 3, 1, 1, 1): (1.7708, 1.9556),  # vgg11 conv3_2, vgg16 conv3_2, vgg16 conv3_3
    ('fwd', 256, 512, 14, 14, 512, 3, 3, 1, 1, 1): (0.3806, 0.4099),  # vgg11 conv5_1, vgg11 conv5_2, vgg16 conv5_1, …
    ('fwd', 256, 512, 28, 28, 512, 3, 3, 1, 1, 1): (1.6384, 1.6012),  # vgg11 conv4_2, vgg16 conv4_2, vgg16 conv4_3
    ('fwd', 512, 3, 224, 224, 96, 7, 7, 2, 1, 1): (1.0075, 6.8686),  # zfnet conv1
    ('fwd', 512, 3, 224, 224, 96, 11, 11, 4, 2, 1): (0.4097, 3.9403),  # alexnet conv1, nin conv1
    ('fwd', 512, 48, 27, 27, 128, 5, 5, 1, 2, 2): (0.5072, 1.1680),  # alexnet conv2
    ('fwd', 512, 96, 27, 27, 256, 5, 5, 1, 2, 1): (1.0285, 0.8860),  # nin conv2
    ('fwd', 512, 96, 54, 54, 256, 5, 5, 2, 2, 1): (0.9857, 1.0482),  # zfnet conv2
    ('fwd', 512, 96, 55, 55, 96, 1, 1, 1, 0, 1): (0.2415, 0.6165),  # nin cccp1, nin cccp2
    ('fwd', 512, 192, 13, 13, 128, 3, 3, 1, 1, 2): (0.1565, 0.4093),  # alexnet conv5
    ('fwd', 512, 192, 13, 13, 192, 3, 3, 1, 1, 2): (0.2964, 0.5738),  # alexnet conv4
    ('fwd', 512, 256, 13, 13, 384, 3, 3, 1, 1, 1): (0.2893, 0.3153),  # alexnet conv3, zfnet conv3, nin conv3
    ('fwd', 512, 256, 27, 27, 256, 1, 1, 1, 0, 1): (0.1748, 0.3807),  # nin cccp3, nin cccp4
    ('fwd', 512, 384, 6, 6, 1024, 3, 3, 1, 1, 1): (0.2798, 0.2175),  # nin conv4-1024
    ('fwd', 512, 384, 13, 13, 256, 3, 3, 1, 1, 1): (0.3577, 0.2914),  # zfnet conv5
    ('fwd', 512, 384, 13, 13, 384, 1, 1, 1, 0, 1): (0.0861, 0.1396),  # nin cccp5, nin cccp6
    ('fwd', 512, 384, 13, 13, 384, 3, 3, 1, 1, 1): (0.5202, 0.4137),  # zfnet conv4
    ('fwd', 512, 1024, 6, 6, 1000, 1, 1, 1, 0, 1): (0.1114, 0.1258),  # nin cccp8-1024
    ('fwd', 512, 1024, 6, 6, 1024, 1, 1, 1, 0, 1): (0.1003, 0.1233),  # nin cccp7-1024
    ('wgrad', 128, 3, 224, 224, 64, 3, 3, 1, 1, 1): (0.2748, 1.1485),  # vgg11 conv1_1, vgg16 conv1_1
    ('wgrad', 128, 3, 224, 224, 96, 7, 7, 2, 1, 1): (0.2041, 1.0359),  # zfnet conv1
    ('wgrad', 128, 3, 224, 224, 96, 11, 11, 4, 2, 1): (0.1135, 0.5472),  # alexnet conv1, nin conv1
    ('wgrad', 128, 48, 27, 27, 128, 5, 5, 1, 2, 2): (0.1455, 0.3799),  # alexnet conv2
    ('wgrad', 128, 64, 112, 112, 128, 3, 3, 1, 1, 1): (0.5452, 0.8485),  # vgg11 conv2_1, vgg16 conv2_1
    ('wgrad', 128, 64, 224, 224, 64, 3, 3, 1, 1, 1): (1.4452, 2.0338),  # vgg16 conv1_2
    ('wgrad', 128, 96, 27, 27, 256, 5, 5, 1, 2, 1): (0.2413, 0.2763),  # nin conv2
    ('wgrad', 128, 96, 54, 54, 256, 5, 5, 2, 2, 1): (0.2390, 0.3093),  # zfnet conv2
    ('wgrad', 128, 96, 55, 55, 96, 1, 1, 1, 0, 1): (0.0651, 0.1818),  # nin cccp1, nin cccp2
    ('wgrad', 128, 128, 56, 56, 256, 3, 3, 1, 1, 1): (0.4169, 0.5470),  # vgg11 conv3_1, vgg16 conv3_1
    ('wgrad', 128, 128, 112, 112, 128, 3, 3, 1, 1, 1): (1.0810, 1.3492),  # vgg16 conv2_2
    ('wgrad', 128, 192, 13, 13, 128, 3, 3, 1, 1, 2): (0.0744, 0.1930),  # alexnet conv5
    ('wgrad', 128, 192, 13, 13, 192, 3, 3, 1, 1, 2): (0.0988, 0.2240),  # alexnet conv4
    ('wgrad', 128, 256, 13, 13, 384, 3, 3, 1, 1, 1): (0.1089, 0.0995),  # alexnet conv3, zfnet conv3, nin conv3
    ('wgrad', 128, 256, 27, 27, 256, 1, 1, 1, 0, 1): (0.0642, 0.1137),  # nin cccp3, nin cccp4
    ('wgrad', 128, 256, 28, 28, 512, 3, 3, 1, 1, 1): (0.4067, 0.4667),  # vgg11 conv4_1, vgg16 conv4_1
    ('wgrad', 128, 256, 56, 56, 256, 3, 3, 1, 1, 1): (0.8271, 0.9583),  # vgg11 conv3_2, vgg16 conv3_2, vgg16 conv3_3
    ('wgrad', 128, 384, 6, 6, 1024, 3, 3, 1, 1, 1): (0.0865, 0.0763),  # nin conv4-1024
    ('wgrad', 128, 384, 13, 13, 256, 3, 3, 1, 1, 1): (0.0979, 0.0939),  # zfnet conv5
    ('wgrad', 128, 384, 13, 13, 384, 1, 1, 1, 0, 1): (0.0419, 0.0684),  # nin cccp5, nin cccp6
    ('wgrad', 128, 384, 13, 13, 384, 3, 3, 1, 1, 1): (0.1244, 0.1330),  # zfnet conv4
    ('wgrad', 128, 512, 14, 14, 512, 3, 3, 1, 1, 1): (0.2289, 0.2256),  # vgg11 conv5_1, vgg11 conv5_2, vgg16 conv5_1…
    ('wgrad', 128, 512, 28, 28, 512, 3, 3, 1, 1, 1): (0.8087, 0.8325),  # vgg11 conv4_2, vgg16 conv4_2, vgg16 conv4_3
    ('wgrad', 128, 1024, 6, 6, 1000, 1, 1, 1, 0, 1): (0.0669, 0.0901),  # nin cccp8-1024
    ('wgrad', 128, 1024, 6, 6, 1024, 1, 1, 1, 0, 1): (0.0556, 0.0746),  # nin cccp7-1024
    ('wgrad', 256, 3, 224, 224, 64, 3, 3, 1, 1, 1): (0.4902, 4.8725),  # vgg11 conv1_1, vgg16 conv1_1
    ('wgrad', 256, 64, 112, 112, 128, 3, 3, 1, 1, 1): (1.1946, 1.5308),  # vgg11 conv2_1, vgg16 conv2_1
    ('wgrad', 256, 64, 224, 224, 64, 3, 3, 1, 1, 1): (3.1506, 4.0540),  # vgg16 conv1_2
    ('wgrad', 256, 128, 56, 56, 256, 3, 3, 1, 1, 1): (0.8697, 1.1623),  # vgg11 conv3_1, vgg16 conv3_1
    ('wgrad', 256, 128, 112, 112, 128, 3, 3, 1, 1, 1): (2.2435, 2.4473),  # vgg16 conv2_2
    ('wgrad', 256, 256, 28, 28, 512, 3, 3, 1, 1, 1): (0.8323, 0.9375),  # vgg11 conv4_1, vgg16 conv4_1
    ('wgrad', 256, 256, 56, 56, 256, 3, 3, 1, 1, 1): (1.7570, 1.9391),  # vgg11 conv3_2, vgg16 conv3_2, vgg16 conv3_3
    ('wgrad', 256, 512, 14, 14, 512, 3, 3, 1, 1, 1): (0.4360, 0.4003),  # vgg11 conv5_1, vgg11 conv5_2, vgg16 conv5_1…
    ('wgrad', 256, 512, 28, 28, 512, 3, 3, 1, 1, 1): (1.6794, 1.6971),  # vgg11 conv4_2, vgg16 conv4_2, vgg16 conv4_3
    ('wgrad', 512, 3, 224, 224, 96, 7, 7, 2, 1, 1): (0.7340, 3.7932),  # zfnet conv1
    ('wgrad', 512, 3, 224, 224, 96, 11, 11, 4, 2, 1): (0.3172, 1.9256),  # alexnet conv1, nin conv1
    ('wgrad', 512, 48, 27, 27, 128, 5, 5, 1, 2, 2): (0.4488, 1.3072),  # alexnet conv2
    ('wgrad', 512, 96, 27, 27, 256, 5, 5, 1, 2, 1): (0.9151, 1.0013),  # nin conv2
    ('wgrad', 512, 96, 54, 54, 256, 5, 5, 2, 2, 1): (0.9177, 1.1975),  # zfnet conv2
    ('wgrad', 512, 96, 55, 55, 96, 1, 1, 1, 0, 1): (0.1969, 0.6171),  # nin cccp1, nin cccp2
    ('wgrad', 512, 192, 13, 13, 128, 3, 3, 1, 1, 2): (0.1908, 0.5189),  # alexnet conv5
    ('wgrad', 512, 192, 13, 13, 192, 3, 3, 1, 1, 2): (0.2928, 0.6992),  # alexnet conv4
    ('wgrad', 512, 256, 13, 13, 384, 3, 3, 1, 1, 1): (0.3049, 0.3380),  # alexnet conv3, zfnet conv3, nin conv3
    ('wgrad', 512, 256, 27, 27, 256, 1, 1, 1, 0, 1): (0.1528, 0.3541),  # nin cccp3, nin cccp4
    ('wgrad', 512, 384, 6, 6, 1024, 3, 3, 1, 1, 1): (0.2678, 0.2454),  # nin conv4-1024
    ('wgrad', 512, 384, 13, 13, 256, 3, 3, 1, 1, 1): (0.3008, 0.3038),  # zfnet conv5
    ('wgrad', 512, 384, 13, 13, 384, 1, 1, 1, 0, 1): (0.0709, 0.1398),  # nin cccp5, nin cccp6
    ('wgrad', 512, 384, 13, 13, 384, 3, 3, 1, 1, 1): (0.4663, 0.4787),  # zfnet conv4
    ('wgrad', 512, 1024, 6, 6, 1000, 1, 1, 1, 0, 1): (0.1041, 0.1283),  # nin cccp8-1024
    ('wgrad', 512, 1024, 6, 6, 1024, 1, 1, 1, 0, 1): (0.1054, 0.1180),  # nin cccp7-1024
}


def xla_faster(kernel: str, x_shape, w_shape, stride: int, padding: int, groups: int, dtype_name: str,
               measured: dict | None = None) -> bool:
  """Whether XLA's convolution runs `kernel` ('fwd', 'dgrad', 'wgrad') of this layer faster than ours, by the table
  (`measured`, MEASURED by default) at the nearest batch measured; 16-bit inputs only (the table's)."""
  if dtype_name not in ("bfloat16", "float16"):
    return False
  _, n, *layer = tile_key(kernel, x_shape, w_shape, stride, padding, groups)
  rows = [(abs(math.log2(k[1] / n)), -k[1], times) for k, times in (measured or MEASURED).items()
          if k[0] == kernel and list(k[2:]) == layer]
  if not rows:
    return False
  ours, xla = min(rows)[2]
  return xla < ours * (1 - MARGIN)
