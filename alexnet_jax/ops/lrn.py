"""Local response normalisation across channels, CHWN in and out.

  b[c] = a[c] / (k + α · Σ_{c' = c−n/2}^{c+n/2} a[c']²)^β

with the sum clipped at the first and last channel. The paper writes α without dividing by n (k=2, n=5, α=1e-4,
β=0.75); Caffe and cuda-convnet's code use α/n. `alpha_over_n` chooses. In CHWN neighbouring channels are H·W·N
elements apart, so the window is a sum over the leading axis. Groups (towers) are normalised separately: the
paper's GPUs never saw each other's maps in this layer.
"""

from jax import lax

from alexnet_jax.ops.backend import accumulator, check_backend

LRN_PAPER = dict(k=2.0, n=5, alpha=1e-4, beta=0.75)


def lrn_reference(x, *, k=2.0, n=5, alpha=1e-4, beta=0.75, alpha_over_n=False, groups=1):
  """XLA reference, computed in float32 (float64 for float64 input)."""
  c = x.shape[0]
  a = x.astype(accumulator(x.dtype)).reshape(groups, c // groups, *x.shape[1:])
  window = (1, n, 1, 1, 1)
  sums = lax.reduce_window(a * a, 0.0, lax.add, window, (1,) * 5,
                           ((0, 0), (n // 2, (n - 1) // 2), (0, 0), (0, 0), (0, 0)))
  scale = alpha / n if alpha_over_n else alpha
  return (a * (k + scale * sums) ** -beta).reshape(x.shape).astype(x.dtype)


def lrn(x, *, k=2.0, n=5, alpha=1e-4, beta=0.75, alpha_over_n=False, groups=1, backend="auto"):
  """x (C, H, W, N) → same shape; each of `groups` consecutive channel blocks is normalised on its own."""
  if x.shape[0] % groups:
    raise ValueError(f"lrn: {x.shape[0]} channels do not split into {groups} groups")
  check_backend(backend)
  return lrn_reference(x, k=k, n=n, alpha=alpha, beta=beta, alpha_over_n=alpha_over_n, groups=groups)
