"""Triton kernels for cuda-convnet's batch-last layouts (CHWN activations). No JAX here: alexnet_jax wraps them.

Every kernel module states its layouts at the top and offers, per kernel, the `@triton.jit` function and a
`*_launch(...)` function that picks the grid and the compile-time parameters for a shape (a `Launch`). A kernel
takes its input pointers, then its output pointers, then only `tl.constexpr` parameters: shapes are compile-time
constants, so each layer shape gets its own specialised kernel, and the same call works through jax-triton on a
GPU and through the Triton interpreter on the CPU (`interpret.run`).
"""

from triton_kernels.launch import Launch

__all__ = ["Launch"]
