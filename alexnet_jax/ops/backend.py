"""The `backend` switch shared by every op."""

# 'auto' resolves per platform; until the Triton kernels land every platform resolves to the XLA reference.
BACKENDS = ("auto", "xla")


def check_backend(backend: str) -> str:
  """Returns the concrete backend for `backend`, or raises one clear error."""
  if backend not in BACKENDS:
    raise ValueError(f"unknown kernel backend {backend!r}; choose one of {', '.join(BACKENDS)}")
  return "xla"


def accumulator(dtype):
  """float32 accumulation for bfloat16/float16/float32 inputs; float64 stays float64 (gradient checks)."""
  import jax.numpy as jnp  # noqa: PLC0415

  return jnp.promote_types(dtype, jnp.float32)
