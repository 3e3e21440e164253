"""The `backend` switch shared by every op with a kernel.

'xla' runs the op's XLA reference (lax with CHWN dimension numbers). 'auto', in a process with a CUDA device,
stages both the reference and the kernels and lets the lowering platform choose: on CUDA the kernels, each or XLA's
own computation of it, whichever a measured table has faster at its shapes (mode 'fastest': ops/kernel.py), the
reference everywhere else, so one traced program (and one `jax.export` artifact) serves CPU, TPU and GPU; in a
process without one it is the reference alone, as no program made there can carry the kernels (jax-triton compiles
them for the GPU it sees). 'triton' insists on the kernels (CUDA only); 'interpret' runs the kernels under the
Triton interpreter on any platform (slow: tests).
"""

import functools

import jax
import jax.numpy as jnp

BACKENDS = ("auto", "xla", "triton", "interpret")
FASTEST = "fastest"  # 'auto' on CUDA, resolved (by_platform): what a network passes on to its ops


def check_backend(backend: str, dtype=None) -> str:
  """Returns 'xla' or `backend` for the input `dtype`, or raises one clear error.

  float64 input always takes the XLA reference: the kernels compute in float32 at most.
  """
  if backend not in (*BACKENDS, FASTEST):
    raise ValueError(f"unknown kernel backend {backend!r}; choose one of {', '.join(BACKENDS)}")
  return "xla" if dtype is not None and jnp.dtype(dtype) == jnp.float64 else backend


@functools.cache
def cuda_here() -> bool:
  """Whether this process has a CUDA device, which compiling the kernels into a program needs."""
  try:
    return bool(jax.devices("cuda"))
  except RuntimeError:  # no CUDA backend in this jaxlib, or no GPU
    return False


def by_platform(backend: str, build):
  """build(backend) for a backend other than 'auto'; for 'auto', a function that runs build(FASTEST) where the
  program is lowered for CUDA and build('xla') everywhere else — or build('xla') alone without a CUDA device here,
  where tracing the kernels too would only cost time. The one place where 'auto' is resolved, for an op (dispatch)
  or for a whole network (network.sharding.sharded_apply)."""
  if backend == "auto" and not cuda_here():
    backend = "xla"
  if backend != "auto":
    return build(backend)
  kernels, reference = build(FASTEST), build("xla")
  return lambda *args: jax.lax.platform_dependent(*args, cuda=kernels, default=reference)


def dispatch(backend: str, reference, kernel, *operands):
  """reference(*operands) or kernel(*operands, mode=…), as `backend` asks; operands[0] sets the dtype.

  Under 'auto' JAX differentiates the reference where it runs, and the kernel path by its primitives' own rules.
  """
  mode = check_backend(backend, operands[0].dtype)
  return by_platform(mode, lambda m: reference if m == "xla" else functools.partial(kernel, mode=m))(*operands)


def accumulator(dtype):
  """float32 accumulation for bfloat16/float16/float32 inputs; float64 stays float64 (gradient checks)."""
  return jnp.promote_types(dtype, jnp.float32)


def dot_precision(dtype) -> str:
  """tl.dot's float32 mode, following JAX's default matmul precision: TF32 unless 'highest'/'float32'. 16-bit
  inputs ignore it, so they always ask for one value (one compiled kernel)."""
  exact = jax.config.jax_default_matmul_precision in ("highest", "float32")
  return "ieee" if exact or jnp.dtype(dtype) != jnp.float32 else "tf32"
