"""The strategies of table.with_strategy (tower, data, hybrid) and pmap's data parallelism compute the same
training steps on any (data, model) mesh: parameters after two steps, dropout included, within float rounding. The
network has each of the paper's kinds of layer at its smallest, so that every mesh compiles in seconds;
tests/test_placement.py checks each strategy's placement of the paper's network."""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alexnet_jax.config import paper_config, validate
from alexnet_jax.data import device_batches
from alexnet_jax.network import sharding
from alexnet_jax.network.model import Network
from alexnet_jax.network.table import Layer, Table, alexnet, register, with_strategy
from alexnet_jax.training import pmap, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = 8


@register("strategies_test_net")
def small_net(*, num_classes, width, towers, lrn_alpha_over_n):
  """A conv reading across towers (alexnet's conv3), LRN, pools, an fc layer reading the towers, a second one reading
  the first's (the hybrid's slices, gathered and reordered), dropout, and the last fc layer's partial sums."""
  del width
  return Table((Layer("conv1", "conv", filters=8, size=5, stride=2),
                Layer("lrn1", "lrn", size=5, k=2.0, alpha=1e-4, beta=0.75, alpha_over_n=lrn_alpha_over_n),
                Layer("pool1", "pool", size=3, stride=2),
                Layer("conv2", "conv", filters=8, size=3, padding=1, inputs="all"),
                Layer("pool2", "pool", size=3, stride=2),
                Layer("fc3", "fc", filters=32, inputs="all"),
                Layer("drop3", "dropout", rate=0.5),
                Layer("fc4", "fc", filters=32, inputs="all"),
                Layer("drop4", "dropout", rate=0.5),
                Layer("fc5", "fc", filters=num_classes, split="sum", relu=False)), towers)


def tiny_config(strategy="tower", model=1, data=1):
  c = paper_config()
  c.network, c.image_size, c.weight_init, c.learning_rate = "strategies_test_net", 32, "he", 0.05
  c.dataset.name, c.dataset.num_classes, c.batch_size, c.eval_batch_size = "procedural", 10, B, B
  c.strategy, c.mesh.model, c.mesh.data = strategy, model, data
  return c


def two_steps(config) -> dict:
  """Parameters after two train steps on a fixed batch, as host arrays."""
  setup = train.make_setup(config, 10, 1000)
  state = train.create_train_state(setup, jax.random.key(0))
  batch = setup.batch_layout.put(device_batches.random_batch(B, 32, 10, size=40))
  step = jax.jit(functools.partial(train.train_step, setup=setup))
  for _ in range(2):
    state, _ = step(state, batch, jax.random.key(1))
  return jax.tree.map(np.asarray, state.params)


def assert_same(params, reference):
  for path, want in jax.tree_util.tree_leaves_with_path(reference):
    got = functools.reduce(lambda t, k: t[k.key], path, params)
    scale = np.abs(want).max() + 1e-12
    np.testing.assert_allclose(got / scale, want / scale, atol=2e-5, err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def one_device():
  return two_steps(tiny_config())


def test_pmap_data_parallelism_gives_the_shard_map_numbers(one_device):
  config = tiny_config("data", 1, 2)
  setup = train.make_setup(config, 10, 1000)
  state = pmap.stack(setup.mesh, train.create_train_state(setup, jax.random.key(0)))
  batch = pmap.rows(setup.mesh, setup.batch_layout.put(device_batches.random_batch(B, 32, 10, size=40)))
  assert state.params["fc5"]["bias"].shape == (2, 10) and batch["image"].shape == (2, B // 2, 40, 40, 3)
  step = pmap.train_step(setup)
  for _ in range(2):
    state, metrics = step(state, batch, jax.random.key(1))
  assert int(metrics["count"]) == B and int(state.step[1]) == 2  # one copy of the metrics, a replica per device
  assert_same(jax.tree.map(lambda x: np.asarray(x[1]), state.params), one_device)
  assert_same(jax.tree.map(np.asarray, pmap.unstack(setup.mesh, state).params), one_device)


@pytest.mark.parametrize("strategy, model, data, narrow", [
    ("tower", 2, 1, {"conv1", "conv2", "fc3", "fc4", "fc5"}),
    ("hybrid", 2, 1, {"fc3", "fc4", "fc5"}),  # the convs' batch is split over both devices
    ("data", 1, 2, set())])
def test_the_step_on_narrow_kernels_gives_the_numbers_of_the_step_converting_them(strategy, model, data, narrow):
  """The kernels that the update writes in bfloat16 beside the params, for the next step to read, are those whose
  gradients no devices sum (which are summed in float32); the params come out bit for bit as where the network
  converts them itself."""
  config = tiny_config(strategy, model, data)
  config.dtype = "bfloat16"
  setup = train.make_setup(config, 10, 1000)
  reference = train.create_train_state(setup, jax.random.key(0))
  batch = setup.batch_layout.put(device_batches.random_batch(B, 32, 10, size=40))
  convert, steps = jax.jit(functools.partial(train.train_step, setup=setup)), train.jitted(setup)
  state = steps.into_step(train.create_train_state(setup, jax.random.key(0)))
  for _ in range(2):
    reference, _ = convert(reference, batch, jax.random.key(1))
    state, _ = steps.step(state, batch, jax.random.key(1))
  kernels = {name: np.asarray(k["kernel"]) for name, k in (state.compute_kernels or {}).items()}
  held = steps.out_of_step(state)
  assert held.compute_kernels is None and reference.compute_kernels is None
  got = jax.tree.leaves((held.params, held.opt_state))
  for (path, want), got in zip(jax.tree_util.tree_leaves_with_path((reference.params, reference.opt_state)), got,
                               strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=jax.tree_util.keystr(path))
  assert set(kernels) == narrow
  for name, kernel in kernels.items():
    assert kernel.dtype == jnp.bfloat16
    np.testing.assert_array_equal(kernel, np.asarray(held.params[name]["kernel"]).astype(jnp.bfloat16), name)


def test_pmap_is_refused_for_strategies_other_than_data_in_one_line():
  config = tiny_config("hybrid", 2, 1)
  config.parallel_api = "pmap"
  with pytest.raises(ValueError, match=r"^config.parallel_api='pmap' is data parallelism: it needs "
                     r"config.strategy='data', got 'hybrid'$"):
    validate(config)


# Each strategy on four devices, the model and data axes of 2 × 2 meshes among them (two-device meshes are their
# special cases: the paper's split in tests/test_parallel.py, the hybrid over two processes in tests/test_multihost.py;
# 'data' on a 1 × 4 mesh splits the batch as on 2 × 2, over one axis instead of two).
FOUR_DEVICES = """
import jax
jax.config.update("jax_num_cpu_devices", 4)
from tests.test_strategies import assert_same, tiny_config, two_steps
reference = two_steps(tiny_config())
for strategy, model, data in [("tower", 2, 2), ("data", 2, 2), ("hybrid", 4, 1), ("hybrid", 2, 2)]:
  assert_same(two_steps(tiny_config(strategy, model, data)), reference)
  print(strategy, model, data, "same", flush=True)
"""


def test_every_strategy_on_four_devices_trains_as_one_device():
  run = subprocess.run([sys.executable, "-c", FOUR_DEVICES], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=ROOT, TRITON_INTERPRET="1"))
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.count("same") == 4


def test_strategies_place_every_layer():
  table = alexnet(num_classes=10, width=0.25)
  places = {s: "".join(layer.place[0] for layer in with_strategy(table, s).layers) for s in ("tower", "data", "hybrid")}
  assert places == dict(tower="t" * 15, data="d" * 15, hybrid="d" * 10 + "m" * 5)
  with pytest.raises(ValueError, match="unknown strategy 'pipeline'"):
    with_strategy(table, "pipeline")


def test_bad_placements_are_refused_in_one_line():
  conv, fc = Layer("conv1", "conv", filters=8, size=3), Layer("fc", "fc", filters=10, relu=False)
  with pytest.raises(ValueError, match="place='model' is for fc layers"):
    Layer("conv1", "conv", filters=8, size=3, place="model")
  with pytest.raises(ValueError, match="must come first"):
    Table((conv, Layer("conv2", "conv", filters=8, size=3, place="data"), fc), 1)
  with pytest.raises(ValueError, match="place it 'data' like conv1"):
    Table((Layer("conv1", "conv", filters=8, size=3, place="data"), Layer("pool1", "pool", size=2, stride=2), fc), 1)
  # A one-tower classifier of 9 outputs cannot be cut into 2 slices of 'model'.
  net = Network(Table((Layer("conv1", "conv", filters=8, size=3, stride=2, place="data"),
                       Layer("fc", "fc", filters=9, relu=False, place="model")), 1))
  x = jnp.zeros((3, 9, 9, 4))
  params = jax.jit(net.init)(jax.random.key(0), x)["params"]
  with pytest.raises(ValueError, match=r"^layer fc: its bias \(1, 9\) does not split over the 2 devices of 'model'$"):
    sharding.sharded_apply(net, sharding.make_mesh(model=2))(params, x, jax.random.key(0))
