"""2-D convolution, CHWN in and out (cuda-convnet's filter_acts).

Layouts: images x (C, H, W, N); filters w (C/groups, KH, KW, F) — cuda-convnet's (colors, filter pixels, filters)
order, filters last so that one loaded patch serves many filters; bias b (F,); output (F, H', W', N).
Groups split C and F into equal consecutive blocks: group g reads channels [g·C/G, (g+1)·C/G) and owns filters
[g·F/G, (g+1)·F/G). That is how the towers of the paper run side by side on one device.
"""

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax.ops.backend import accumulator, check_backend

_DIMS = ("CHWN", "IHWO", "CHWN")


def conv2d_reference(x, w, b=None, *, stride=1, padding=0, groups=1, relu=False):
  """XLA reference; accumulates in float32 whatever the input dtype."""
  y = lax.conv_general_dilated(
      x, w.astype(x.dtype), window_strides=(stride, stride), padding=((padding, padding), (padding, padding)),
      dimension_numbers=_DIMS, feature_group_count=groups, preferred_element_type=accumulator(x.dtype))
  if b is not None:
    y = y + b.astype(y.dtype)[:, None, None, None]
  if relu:
    y = jax.nn.relu(y)
  return y.astype(x.dtype)


def conv2d(x, w, b=None, *, stride=1, padding=0, groups=1, relu=False, backend="auto"):
  """Convolution with fused bias and optional ReLU; see the module docstring for layouts."""
  c, _, _, _ = x.shape
  cin, kh, kw, f = w.shape
  if c != cin * groups or f % groups:
    raise ValueError(f"conv2d: input has {c} channels and filters {w.shape} with groups={groups}; need "
                     f"channels == {cin}·groups and filters divisible by groups")
  if b is not None and b.shape != (f,):
    raise ValueError(f"conv2d: bias shape {b.shape} does not match {f} filters")
  check_backend(backend)
  return conv2d_reference(x, w, b, stride=stride, padding=padding, groups=groups, relu=relu)
