"""ZFNet, VGG-11, VGG-16 and Network in Network as layer tables on the CHWN ops: the published parameter counts and
maps, one tower and so no tower collectives, and each config's train step fitting a batch of the demo data at reduced
width."""

import functools
import math
import os
import runpy

import jax
import numpy as np
import pytest

from alexnet_jax.data import get_dataset, train_batches
from alexnet_jax.measure import hlo
from alexnet_jax.network import table
from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.training import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# XLA:CPU's LLVM passes take 10× longer than the steps here (16 s for VGG-16's initialisation alone): these tests
# check numbers, not speed.
QUICK = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def network(name, width=1.0):
  return table.get_network(name, num_classes=1000, width=width, towers=1, lrn_alpha_over_n=False)


def count(table, image_size=224) -> int:
  params = layer_shapes(table, image_size).params
  return sum(math.prod(shape) for layer in params.values() for shape in layer.values())


def dense(*sizes) -> int:
  """Weights and biases of layers that map sizes[i] inputs to sizes[i+1] outputs."""
  return sum(a * b + b for a, b in zip(sizes, sizes[1:]))


def test_parameter_counts_are_the_published_ones():
  # Simonyan & Zisserman's Table 2 rounds them to 133 and 138 million; these are the exact counts of configurations
  # A and D (torchvision's vgg11 and vgg16 have the same).
  assert count(network("vgg11")) == 132_863_336
  assert count(network("vgg16")) == 138_357_544
  # Zeiler & Fergus publish no count: it follows from their Figure 3, filters (in × k × k → out) then 6×6×256 → fc.
  convs = [(3, 7, 96), (96, 5, 256), (256, 3, 384), (384, 3, 384), (384, 3, 256)]
  assert count(network("zfnet")) == sum(c * k * k * f + f for c, k, f in convs) + dense(6 * 6 * 256, 4096, 4096, 1000)
  # Lin, Chen & Yan publish no count either; their released ImageNet model's layers (in × k × k → out) give it, and
  # its 29 MB of float32 weights.
  convs = [(3, 11, 96), (96, 1, 96), (96, 1, 96), (96, 5, 256), (256, 1, 256), (256, 1, 256), (256, 3, 384),
           (384, 1, 384), (384, 1, 384), (384, 3, 1024), (1024, 1, 1024), (1024, 1, 1000)]
  assert count(network("nin")) == sum(c * k * k * f + f for c, k, f in convs) == 7_595_176


def test_maps_are_the_papers():
  zf = layer_shapes(network("zfnet"), 224).inputs
  assert zf["pool1"][1:3] == (110, 110)  # conv1 7×7/2
  assert zf["conv3"][1:3] == zf["pool5"][1:3] == (13, 13)
  assert zf["fc6"][:3] == (256, 6, 6)
  vgg = layer_shapes(network("vgg16"), 224).inputs
  assert [vgg[f"pool{i}"][:3] for i in range(1, 6)] == [(64, 224, 224), (128, 112, 112), (256, 56, 56),
                                                         (512, 28, 28), (512, 14, 14)]
  assert vgg["fc6"][:3] == (512, 7, 7)
  assert not any(layer.kind == "lrn" for layer in network("vgg16").layers)
  nin = layer_shapes(network("nin"), 224)
  assert [nin.inputs[f"pool{i}"][:3] for i in range(1, 4)] == [(96, 55, 55), (256, 27, 27), (384, 13, 13)]
  assert nin.inputs["conv2"][1:3] == (27, 27) and nin.inputs["conv4-1024"][1:3] == (6, 6)  # Caffe's from pool1 on
  assert nin.inputs["pool4"][:3] == (1000, 6, 6) and nin.outputs["pool4"] == (1000, 1)  # the logits, one map a class


@pytest.mark.parametrize("name", ["zfnet", "vgg11", "vgg16", "nin"])
def test_one_tower_networks_refuse_towers(name):
  with pytest.raises(ValueError, match=f"{name} is a one-tower network.*config.towers=1"):
    table.get_network(name, num_classes=10, width=1.0, towers=2, lrn_alpha_over_n=False)


def reduced_config(name):
  """configs/<name>.py at 1/16 width (NiN's 1/8) on the demo's procedural data, over both CPU devices (its
  mesh.data=-1)."""
  config = runpy.run_path(os.path.join(ROOT, "configs", f"{name}.py"))["get_config"]()
  config.width, config.image_size = 1 / 16, 32 if name.startswith("vgg") else 64  # VGG's five pools: 32 → 1
  if name == "nin":  # at 1/16 its 6-map stages, dropout after the third, learnt little in 60 steps
    config.width = 1 / 8
  config.weight_init = "he"  # zfnet's N(0, 0.01) needs many more steps to leave its starting plateau
  config.dataset.name, config.dataset.num_classes, config.dataset.num_train_examples = "procedural", 10, 1000
  config.batch_size = 16
  return config


@pytest.mark.parametrize("name", ["zfnet", "vgg11", "vgg16", "nin"])
def test_config_trains_on_the_demo_data_without_tower_collectives(name):
  config = reduced_config(name)
  dataset = get_dataset(config)
  setup = train.dataset_setup(config, dataset)
  key = jax.random.key(0)
  state = train.train_state_init(setup).lower(key).compile(QUICK)(key)
  batch = setup.batch_layout.put(train_batches(dataset, config.batch_size)[0][0])
  lowered = jax.jit(functools.partial(train.train_step, setup=setup), donate_argnums=0).lower(state, batch, key)
  step = lowered.compile(QUICK)
  # One tower, two data shards: inside the network only the gradients move (summed over 'data'); no layer gathers
  # or scatters maps as AlexNet's conv3 and fc6–fc8 do between towers. (The logits are gathered for the metrics.)
  assert setup.mesh.shape == {"data": 2, "model": 1}
  names = [layer.name for layer in setup.net.table.layers]
  in_layers = {c.kind for c in hlo.collectives(step.as_text()) if c.layers(names)}
  assert in_layers == {"all-reduce"}
  losses = []
  for _ in range(60):
    state, metrics = step(state, batch, key)
    losses.append(float(metrics["loss"]) / float(metrics["count"]))
  # Chance is ln 10 = 2.30; with dropout in fc6 and fc7 the last five losses averaged 1.0–1.5 (2026-11-30).
  assert np.mean(losses[-5:]) < 1.75, losses
