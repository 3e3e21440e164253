"""The network's ops, each in cuda-convnet's batch-last layout.

Conv-stack activations are CHWN (channels, height, width, images) and fully-connected activations are (features,
images): the image index is always the last, contiguous axis, as in cuda-convnet. conv2d, max_pool, lrn,
lrn_max_pool (an LRN and the pool after it as one op), avg_pool and global_avg_pool take a `backend` (backend.py):
the XLA reference (lax with CHWN dimension numbers), the Triton kernel wrapped as a primitive (kernel.py), or
— 'auto' — the kernel on CUDA and the reference elsewhere, chosen when the program is lowered. dense runs XLA's GEMM
on every backend (it checks the name only); dropout is the network's (network/model.py), one mask per tower over the
global batch.
"""

from alexnet_jax.ops.avg_pool import avg_pool, avg_pool_reference, global_avg_pool, global_avg_pool_reference
from alexnet_jax.ops.backend import BACKENDS, check_backend
from alexnet_jax.ops.conv import conv2d, conv2d_reference
from alexnet_jax.ops.dense import dense, dense_reference
from alexnet_jax.ops.lrn import lrn, lrn_reference
from alexnet_jax.ops.lrn_pool import lrn_max_pool, lrn_max_pool_reference
from alexnet_jax.ops.pool import max_pool, max_pool_reference

__all__ = [
    "BACKENDS", "avg_pool", "avg_pool_reference", "check_backend", "conv2d", "conv2d_reference", "dense",
    "dense_reference", "global_avg_pool", "global_avg_pool_reference", "lrn", "lrn_max_pool",
    "lrn_max_pool_reference", "lrn_reference", "max_pool", "max_pool_reference",
]

