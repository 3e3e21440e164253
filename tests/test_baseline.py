"""The benchmark's plain-XLA baseline is the paper's network: same parameters, same logits and gradients as ours,
split over two devices and on one; and the same function as ours for the one-tower tables of the era after it. The
PyTorch one has the paper's parameters too."""

import jax
import numpy as np
import pytest

from alexnet_jax.measure import baseline, torch_step
from alexnet_jax.network import sharding, table
from alexnet_jax.network.model import Network
from alexnet_jax.network.table import alexnet

B, SIZE = 4, 112
TABLE = alexnet(num_classes=10, width=0.25)


def test_full_size_baseline_has_the_papers_parameter_count():
  net = baseline.PlainNetwork(alexnet())
  shapes = jax.eval_shape(lambda k: baseline.init_params(net, k, 224), jax.random.key(0))
  assert sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes)) == 60_965_224


def loss_and_grads(apply, params, images):
  def loss(p):
    logits = apply(p, images, jax.random.key(3), False)
    return (logits * np.arange(10)).sum() / B, logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return np.asarray(logits), jax.tree.map(np.asarray, grads)


@pytest.mark.parametrize("model_devices", [2, 1])
def test_baseline_computes_our_networks_function(model_devices):
  net = Network(TABLE, weight_init="he", backend="xla")
  nhwc = jax.random.normal(jax.random.key(1), (B, SIZE, SIZE, 3))
  params = jax.jit(net.init)(jax.random.key(0), nhwc.transpose(3, 1, 2, 0))["params"]
  mesh = sharding.make_mesh(model=model_devices)
  ours = sharding.sharded_apply(net, mesh)
  logits, grads = loss_and_grads(lambda p, x, k, t: ours(p, x.transpose(3, 1, 2, 0), k, t),
                                 jax.device_put(params, sharding.param_shardings(mesh, net, params)), nhwc)

  plain = baseline.PlainNetwork(TABLE, weight_init="he")
  mapped = baseline.from_ours(params, TABLE, SIZE)
  shapes = jax.eval_shape(lambda k: baseline.init_params(plain, k, SIZE), jax.random.key(0))
  assert jax.tree.map(lambda a: a.shape, mapped) == jax.tree.map(lambda s: s.shape, shapes)
  placed = jax.device_put(mapped, baseline.param_shardings(mesh, TABLE, mapped))
  plain_logits, plain_grads = loss_and_grads(baseline.sharded_apply(plain, mesh), placed, nhwc)

  np.testing.assert_allclose(plain_logits, logits, rtol=1e-4, atol=1e-4 * np.abs(logits).max())
  # Gradients map across as the parameters do (a permutation of their entries).
  expected = baseline.from_ours(grads, TABLE, SIZE)
  for path, g in jax.tree_util.tree_leaves_with_path(plain_grads):
    want = expected[path[0].key][path[1].key]
    scale = np.abs(want).max()
    np.testing.assert_allclose(g / scale, want / scale, atol=1e-4, err_msg=jax.tree_util.keystr(path))


# LRN and 7×7/2, 5×5/2; 3×3 stacks; both end in 2×2 maps, so fc6 reads its rows in the baseline's (H, W, C) order;
# NiN's 1×1 convolutions and its global average pool over 2×2 maps in place of fc layers
@pytest.mark.parametrize("name, size", [("zfnet", 96), ("vgg11", 64), ("nin", 96)])
def test_baseline_of_a_one_tower_table_computes_our_network(name, size):
  net_table = table.get_network(name, num_classes=10, width=1 / 16, towers=1, lrn_alpha_over_n=False)
  net = Network(net_table, weight_init="he", backend="xla")
  x = jax.random.normal(jax.random.key(1), (3, size, size, 4))
  params = jax.jit(net.init)(jax.random.key(0), x)["params"]
  ours = jax.jit(net.apply)({"params": params}, x)
  plain = baseline.sharded_apply(baseline.PlainNetwork(net_table), sharding.make_mesh(model=1))
  logits = plain(baseline.from_ours(params, net_table, size), x.transpose(3, 1, 2, 0), jax.random.key(3), False)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(ours), rtol=1e-4, atol=1e-4 * float(np.abs(ours).max()))


def test_the_pytorch_network_is_the_paper_s_table():
  torch = pytest.importorskip("torch")  # the GPU image has it; the benchmark's torch:one row runs it
  model = torch_step.build(alexnet(), 224)
  assert sum(p.numel() for p in model.parameters()) == 60_965_224
  assert [m.groups for m in model if isinstance(m, torch.nn.Conv2d)] == [1, 2, 1, 2, 2]  # conv3 reads both towers
  assert model.eval()(torch.zeros(2, 3, 224, 224)).shape == (2, 1000)


def test_the_pytorch_network_in_network_is_its_table():
  torch = pytest.importorskip("torch")
  model = torch_step.build(table.get_network("nin"), 224)
  assert sum(p.numel() for p in model.parameters()) == 7_595_176
  assert isinstance(model[-2], torch.nn.AdaptiveAvgPool2d)  # the logits: each class's map averaged
  assert model.eval()(torch.zeros(2, 3, 224, 224)).shape == (2, 1000)
