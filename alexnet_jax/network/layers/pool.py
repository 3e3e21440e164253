"""The pools, CHWN: pool (max, cuda-convnet's overlapping 3×3/2 and VGG's 2×2/2), avg_pool and global_avg_pool
(Network in Network's). Windows lie on the map, so an output size rounds down ((H + 2·padding − size)//stride + 1)
as cuda-convnet's kernels do; Caffe's pools round up, which a table matches with the layer before's padding."""

import functools

import jax.numpy as jnp
from jax import lax

from alexnet_jax import ops
from alexnet_jax.network.layers.kind import Kind, register_kind, windowed


def windowed_shape(layer, shape):
  return shape[0], *windowed(layer, shape, "window does"), shape[-1]


def _window(layer, padding=True):
  window = dict(size=layer.size, stride=layer.stride)
  return window | dict(padding=layer.padding) if padding else window


def check_max(layer):
  if layer.padding:
    raise ValueError(f"layer {layer.name}: a max-pool's windows lie on the map (padding 0)")


def run_max(net, step, x, train):
  del train
  return ops.max_pool(x, **_window(step.layer, False), relu=step.relu_in, backend=net.backend)


def plain_max(net, p, x, train):
  del net, train
  layer = p.layer
  return lax.reduce_window(x, -jnp.inf, lax.max, (1, layer.size, layer.size, 1), (1, layer.stride, layer.stride, 1),
                           "VALID")


def torch_max(layer, nn, shape, towers):
  del shape, towers
  return [nn.MaxPool2d(layer.size, layer.stride)]


MAX_POOL = register_kind(Kind("pool", run_max, plain_max, torch_max, output_shape=windowed_shape, check=check_max,
                              takes_relu=True,
                              op=lambda layer, **kw: functools.partial(ops.max_pool, **_window(layer, False), **kw)))


def run_avg(net, step, x, train):
  del train
  return ops.avg_pool(x, **_window(step.layer), backend=net.backend)


def plain_avg(net, p, x, train):
  """Each window's mean over size² elements, the zero padding counted (PyTorch's count_include_pad)."""
  del net, train
  layer, pad = p.layer, p.layer.padding
  sums = lax.reduce_window(x, 0.0, lax.add, (1, layer.size, layer.size, 1), (1, layer.stride, layer.stride, 1),
                           ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  return sums / layer.size**2


def torch_avg(layer, nn, shape, towers):
  del shape, towers
  return [nn.AvgPool2d(layer.size, layer.stride, layer.padding, count_include_pad=True)]


AVG_POOL = register_kind(Kind("avg_pool", run_avg, plain_avg, torch_avg, output_shape=windowed_shape,
                              op=lambda layer, **kw: functools.partial(ops.avg_pool, **_window(layer), **kw)))


def run_global(net, step, x, train):
  del train
  return ops.global_avg_pool(x, backend=net.backend)


def plain_global(net, p, x, train):
  del net, p, train
  return jnp.mean(x, axis=(1, 2))


def torch_global(layer, nn, shape, towers):
  del layer, shape, towers
  return [nn.AdaptiveAvgPool2d(1), nn.Flatten()]


GLOBAL_AVG_POOL = register_kind(Kind("global_avg_pool", run_global, plain_global, torch_global,
                                     output_shape=lambda layer, shape: (shape[0], shape[-1]), flattens=True,
                                     op=lambda layer, **kw: functools.partial(ops.global_avg_pool, **kw)))
