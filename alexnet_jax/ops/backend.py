"""The `backend` switch shared by every op.

'xla' runs the XLA reference (lax with CHWN dimension numbers). The others run each op as a primitive around its
Triton kernel: 'auto' lowers to the kernel on CUDA and to the XLA reference elsewhere, 'triton' insists on the
kernel (CUDA only), 'interpret' runs the kernel under the Triton interpreter on any platform (slow: tests).
"""

import jax
import jax.numpy as jnp

BACKENDS = ("auto", "xla", "triton", "interpret")


def check_backend(backend: str, dtype=None) -> str:
  """Returns 'xla' or the primitives' mode for `backend` and the input `dtype`, or raises one clear error.

  float64 input always takes the XLA reference: the kernels compute in float32 at most.
  """
  if backend not in BACKENDS:
    raise ValueError(f"unknown kernel backend {backend!r}; choose one of {', '.join(BACKENDS)}")
  return "xla" if dtype is not None and jnp.dtype(dtype) == jnp.float64 else backend


def accumulator(dtype):
  """float32 accumulation for bfloat16/float16/float32 inputs; float64 stays float64 (gradient checks)."""
  return jnp.promote_types(dtype, jnp.float32)


def dot_precision(dtype) -> str:
  """tl.dot's float32 mode, following JAX's default matmul precision: TF32 unless 'highest'/'float32'. 16-bit
  inputs ignore it, so they always ask for one value (one compiled kernel)."""
  exact = jax.config.jax_default_matmul_precision in ("highest", "float32")
  return "ieee" if exact or jnp.dtype(dtype) != jnp.float32 else "tf32"
