"""conv: a convolution with its bias and (by default) a ReLU; each tower's filters read its own tower's maps, or
every tower's (inputs='all': AlexNet's conv3)."""

import jax
import jax.numpy as jnp
from jax import lax

from alexnet_jax import ops
from alexnet_jax.network.layers.kind import Kind, register_kind, windowed


def output_shape(layer, shape):
  return layer.filters, *windowed(layer, shape, "filters do"), shape[-1]


def run(net, step, x, train):
  """Towers side by side: filters of tower t become output block t, as grouped convolution where each tower reads
  its own block."""
  del train
  p, layer = step.plan, step.layer
  kernel, bias = net.weights(p, (p.towers, x.shape[0] // p.blocks, layer.size, layer.size,
                                 layer.filters // net.table.towers))
  side_by_side = jnp.moveaxis(kernel, 0, -2).reshape(*kernel.shape[1:-1], kernel.shape[0] * kernel.shape[-1])
  return ops.conv2d(x, side_by_side, bias, stride=layer.stride, padding=layer.padding, groups=p.blocks,
                    relu="left" if step.relu_out else layer.relu, relu_in=step.relu_in, backend=net.backend)


def plain(net, p, x, train):
  del train
  layer, pad = p.layer, p.layer.padding
  kernel, bias = net.weights(layer, (layer.size, layer.size, x.shape[-1] // p.blocks,
                                     layer.filters // net.table.towers * p.towers))
  x = lax.conv_general_dilated(x, kernel, (layer.stride, layer.stride), ((pad, pad), (pad, pad)),
                               dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=p.blocks)
  return jax.nn.relu(x + bias) if layer.relu else x + bias


def torch(layer, nn, shape, towers):
  groups = towers if layer.inputs == "tower" else 1
  conv = nn.Conv2d(shape[0], layer.filters, layer.size, layer.stride, layer.padding, groups=groups)
  return [conv, nn.ReLU(inplace=True)] if layer.relu else [conv]


CONV = register_kind(Kind("conv", run, plain, torch, output_shape=output_shape,
                          fan=lambda layer, shape: (shape[0], layer.size, layer.size), defers_relu=True,
                          takes_relu=True))
