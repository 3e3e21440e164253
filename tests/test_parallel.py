"""The split: two devices with a tower each compute what one device with both towers computes; each weight and its
momentum live on their tower's device; and what XLA makes of it (tests/test_comm_report.py reads its collectives)."""

import functools
import re

import jax
import numpy as np

from alexnet_jax.config import paper_config
from alexnet_jax.data import device_batches
from alexnet_jax.measure import hlo
from alexnet_jax.network import sharding
from alexnet_jax.network.model import Network
from alexnet_jax.network.table import Layer, Table, alexnet
from alexnet_jax.training import train

B = 4


def small_config(**changes):
  c = paper_config()
  c.width, c.image_size, c.weight_init = 0.0625, 64, "he"
  c.dataset.name, c.dataset.num_classes, c.batch_size = "procedural", 10, B
  c.update(changes)
  return c


def logits_and_grads(model_devices, train_mode, table=alexnet(num_classes=10, width=0.0625), size=64):
  net = Network(table, weight_init="he")
  x = jax.random.normal(jax.random.key(1), (3, size, size, B))
  params = jax.jit(net.init)(jax.random.key(0), x)["params"]
  mesh = sharding.make_mesh(model=model_devices)
  apply = sharding.sharded_apply(net, mesh)
  params = jax.device_put(params, sharding.param_shardings(mesh, net, params))

  def loss(p):
    logits = apply(p, x, jax.random.key(3), train_mode)
    return (logits * np.arange(10)).sum() / B, logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return np.asarray(logits), jax.tree.map(np.asarray, grads)


def test_two_devices_match_one_device():
  # In training mode, so that dropout's masks must agree too (without it the same path, dropout left out).
  logits1, grads1 = logits_and_grads(1, True)
  logits2, grads2 = logits_and_grads(2, True)
  np.testing.assert_allclose(logits2, logits1, rtol=1e-5, atol=1e-5)
  for path, g1 in jax.tree_util.tree_leaves_with_path(grads1):
    g2 = functools.reduce(lambda t, k: t[k.key], path, grads2)
    scale = np.abs(g1).max() + 1e-12
    np.testing.assert_allclose(g2 / scale, g1 / scale, atol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_last_layer_split_over_towers_is_gathered_whole():
  # A table whose classifier splits its outputs over the towers (not AlexNet's fc8): logits are gathered at the end.
  table = Table((Layer("conv1", "conv", filters=8, size=3, stride=2), Layer("conv2", "conv", filters=8, size=3),
                 Layer("fc", "fc", filters=10, inputs="all", relu=False)))
  logits1, grads1 = logits_and_grads(1, False, table, 17)
  logits2, grads2 = logits_and_grads(2, False, table, 17)
  np.testing.assert_allclose(logits2, logits1, rtol=1e-5, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), grads2, grads1)


def lowered_train_step(config):
  setup = train.make_setup(config, 10, 1000)
  state = train.create_train_state(setup, jax.random.key(0))
  s = config.image_size
  batch = setup.batch_layout.put(device_batches.random_batch(B, s, 10))
  step = jax.jit(functools.partial(train.train_step, setup=setup))
  return setup, state, step.lower(state, batch, jax.random.key(0))


def test_auto_traces_the_reference_program_off_cuda():
  # Without a CUDA device here no program can carry the kernels: 'auto' traces the network as 'xla' does, once (the
  # kernels staged beside the references cost a second of tracing per step, and XLA:CPU compiled the convolutions
  # in CHWN when the choice was made inside the shard_map).
  jaxprs = {}
  for backend in ("auto", "xla"):
    setup = train.make_setup(small_config(kernel_backend=backend), 10, 1000)
    state = jax.eval_shape(train.train_state_init(setup), jax.random.key(0))
    batch = device_batches.random_batch(B, 64, 10)
    jaxprs[backend] = str(jax.make_jaxpr(functools.partial(train.train_step, setup=setup))(
        state, batch, jax.random.key(0)))
  assert jaxprs["auto"] == jaxprs["xla"]
  assert "cond[" not in jaxprs["auto"] and "chwn_" not in jaxprs["auto"]


def test_momentum_lives_with_its_weight():
  setup, state, _ = lowered_train_step(small_config())
  for name in ("conv2", "fc8"):
    for leaf in ("kernel", "bias"):
      weight, momentum = state.params[name][leaf], state.opt_state[1][0].trace[name][leaf]
      assert momentum.sharding == weight.sharding, (name, leaf)
  assert state.params["conv2"]["kernel"].sharding.spec == jax.sharding.PartitionSpec("model")
  assert state.params["fc8"]["bias"].sharding.spec == jax.sharding.PartitionSpec()  # one bias for the summed layer
  assert state.step.sharding.is_fully_replicated


def test_bfloat16_export_for_tpu_keeps_its_collectives_in_bfloat16():
  # XLA:CPU needs the gather's gradient (a reduce-scatter) in float32; a program traced here for another platform
  # must not carry that workaround.
  setup = train.make_setup(small_config(dtype="bfloat16"), 10, 1000)
  state = train.create_train_state(setup, jax.random.key(0))
  forward = train.logits_fn(setup)
  images = jax.ShapeDtypeStruct((B, 64, 64, 3), np.float32)
  grad = jax.jit(jax.grad(lambda p, x: forward(p, x, jax.random.key(0), True).sum()))

  def collectives(platform):
    """{op: the element type of each of its results}; a reduce_scatter's type follows its body, lines later."""
    text = jax.export.export(grad, platforms=[platform])(state.params, images).mlir_module()
    return {op: re.findall(rf'"stablehlo.{op}"\(.*?[)>] : \(tensor<[^>]*>\) -> tensor<[0-9x]*x(\w+)>', text, re.S)
            for op in ("all_gather", "reduce_scatter")}

  # conv3, fc6 and fc7 read across towers: a gather each, and its gradient.
  assert collectives("tpu") == dict(all_gather=["bf16"] * 3, reduce_scatter=["bf16"] * 3)
  assert collectives("cpu") == dict(all_gather=["bf16"] * 3, reduce_scatter=["f32"] * 3)


def test_hlo_reader_parses_each_replica_group_form():
  text = "\n".join([
      "ENTRY %main.7_spmd (param.2: f32[2,3]) -> f32[2,3] {",
      '%a = f32[8,4]{1,0} all-gather(%x), replica_groups=[1,2]<=[2], dimensions={0}, metadata={op_name="n/conv3/g"}',
      # A combined all-reduce lists the paths of the ops it combines.
      '%g = (f32[2]{0}, f32[6]{0}) all-reduce(%p, %q), replica_groups={{0,1}}, '
      'metadata={op_name="j/(t/fc6/w:t/conv3/w)"}',
      '%b = bf16[4]{0} reduce-scatter(%y), replica_groups={{0,1}}, dimensions={0}, metadata={op_name="n/fc6/r"}',
      "%c = (f32[2]{0}, f32[3]{0}) all-reduce-start(%z, %y), replica_groups=mesh['data'=2,'model'=2] {'data','model'}",
      "%d = (f32[2]{0}, f32[3]{0}) all-reduce-done(%c)",
      # As (operands…, results…), a combined async all-reduce: each tensor once, split by the layers on its path.
      "%h = (f32[2]{0}, f32[6]{0}, f32[2]{0}, f32[6]{0}) all-reduce-start(f32[2]{0} %p, f32[6]{0} %q), "
      'replica_groups={{0,1}}, metadata={op_name="j/(t/fc6/w:t/conv3/w)"}',
      "}",
      "%wrapped.3 (x: f32[4,3]) -> f32[8,3] {",
      # GPU's async forms return (operand, result): count the gathered result and the scattered operand once.
      "%e = (f32[4,3]{1,0}, f32[8,3]{1,0}) all-gather-start(%x), replica_groups={{0,1}}, dimensions={0}",
      "%f = (f32[8,3]{1,0}, f32[4,3]{1,0}) reduce-scatter-start(%x), replica_groups={{0,1}}, dimensions={0}",
  ])
  got = [(c.kind, c.group_size, c.bytes, c.layers(["conv3", "fc6"])) for c in hlo.collectives(text)]
  assert got == [("all-gather", 2, 128, ("conv3",)), ("all-reduce", 2, 32, ("conv3", "fc6")),
                 ("reduce-scatter", 2, 16, ("fc6",)), ("all-reduce", 4, 20, ()),
                 ("all-reduce", 2, 32, ("conv3", "fc6")), ("all-gather", 2, 96, ()), ("reduce-scatter", 2, 96, ())]
  assert [c.computation for c in hlo.collectives(text)] == ["ENTRY %main.7_spmd"] * 5 + ["%wrapped.3"] * 2
  assert hlo.collectives(text)[4].by_layer(["conv3", "fc6"]) == {"fc6": 8, "conv3": 24}
