"""The paper's network: its size, its layer shapes and its initialisation; and what a table refuses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_xla_backend import equations

from alexnet_jax.measure.kernel_shapes import ConvShape, alexnet_convs, alexnet_maps
from alexnet_jax.network.model import Network
from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.network.table import Layer, Table, alexnet, get_network


def paper_params(key=None, init="paper"):
  net = Network(alexnet(), weight_init=init)
  x = jnp.zeros((3, 224, 224, 1))
  if key is None:
    return jax.eval_shape(lambda: net.init(jax.random.key(0), x))["params"]
  return jax.jit(net.init)(key, x)["params"]


def test_paper_parameter_count_is_exact():
  params = paper_params()
  assert sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params)) == 60_965_224
  assert params["conv1"]["kernel"].shape == (2, 3, 11, 11, 48)
  assert params["conv2"]["kernel"].shape == (2, 48, 5, 5, 128)  # reads its own tower's 48 maps
  assert params["conv3"]["kernel"].shape == (2, 256, 3, 3, 192)  # reads all 256 maps of both towers
  assert params["fc6"]["kernel"].shape == (2, 9216, 2048)
  assert params["fc8"]["kernel"].shape == (2, 2048, 1000) and params["fc8"]["bias"].shape == (1000,)


def test_layer_shapes_follow_the_paper():
  net = Network(alexnet())
  x = jnp.zeros((3, 224, 224, 2))
  params = paper_params()
  _, state = jax.eval_shape(lambda p: net.apply({"params": p}, x, mutable=["intermediates"]), params)
  shapes = {k: v.shape for k, v in state["intermediates"]["activations"][0].items()}
  assert shapes["conv1"] == (96, 55, 55, 2)  # CHWN, both towers' 48 maps
  assert shapes["pool1"] == (96, 27, 27, 2)
  assert shapes["conv2"] == (256, 27, 27, 2)
  assert shapes["pool2"] == (256, 13, 13, 2)
  assert shapes["conv5"] == (256, 13, 13, 2)
  assert shapes["pool5"] == (256, 6, 6, 2)
  assert shapes["fc6"] == (4096, 2) and shapes["fc8"] == (1000, 2)


@pytest.mark.parametrize("name, size", [("alexnet", 224), ("zfnet", 224), ("vgg16", 224), ("alexnet", 67)])
def test_computed_shapes_are_the_traced_model_s(name, size):
  # The placement plan counts bytes, and the weight converters check shapes, with shapes computed from the table:
  # they must be the model's, parameters and activations, for every network.
  table = get_network(name, num_classes=17, width=0.5, towers=2 if name == "alexnet" else 1, lrn_alpha_over_n=False)
  x = jax.ShapeDtypeStruct((3, size, size, 3), jnp.float32)
  variables = jax.eval_shape(lambda x: Network(table).init(jax.random.key(0), x, mutable=True), x)
  shapes = layer_shapes(table, size, 3)
  assert {name: {k: v.shape for k, v in p.items()} for name, p in variables["params"].items()} == shapes.params
  assert {k: v.shape for k, v in variables["intermediates"]["activations"][0].items()} == shapes.outputs


def test_dropout_keeps_each_unit_with_half_the_probability_and_doubles_it():
  table = Table((Layer("fc6", "fc", filters=4000), Layer("drop6", "dropout", rate=0.5),
                 Layer("fc7", "fc", filters=2, relu=False)), towers=1)
  net = Network(table, backend="xla")
  x = jnp.ones((8, 10))
  params = jax.jit(net.init)(jax.random.key(0), x)["params"]
  params["fc6"] = dict(kernel=jnp.zeros_like(params["fc6"]["kernel"]), bias=jnp.ones_like(params["fc6"]["bias"]))
  _, state = net.apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(1)}, mutable=True)
  kept = np.asarray(state["intermediates"]["activations"][0]["drop6"])
  assert set(np.unique(kept).tolist()) == {0.0, 2.0}
  assert abs(float(kept.mean()) - 1.0) < 0.03


def test_paper_initialisation_statistics():
  params = paper_params(jax.random.key(0))
  for name, p in params.items():
    w = np.asarray(p["kernel"])
    assert abs(w.mean()) < 1e-3 and abs(w.std() - 0.01) < 1e-3, name
    want_bias = 1.0 if name in ("conv2", "conv4", "conv5", "fc6", "fc7") else 0.0
    np.testing.assert_array_equal(np.asarray(p["bias"]), want_bias, err_msg=name)
  # The two towers start from different filters.
  assert not np.allclose(params["conv1"]["kernel"][0], params["conv1"]["kernel"][1])


def test_he_initialisation_scales_by_fan_in():
  params = paper_params(jax.random.key(1), init="he")
  assert abs(float(params["conv1"]["kernel"].std()) - (2 / (3 * 11 * 11)) ** 0.5) < 2e-3
  assert abs(float(params["fc6"]["kernel"].std()) - (2 / 9216) ** 0.5) < 1e-4
  assert float(jnp.abs(params["fc6"]["bias"]).max()) == 0.0


def test_glorot_initialisation_scales_by_fan_in_and_fan_out():
  params = paper_params(jax.random.key(1), init="glorot")
  # conv2 per tower: 48 channels in, 128 filters out, 5×5; fc6 reads both towers' 9216 features into its 2048
  assert abs(float(params["conv2"]["kernel"].std()) - (2 / (25 * (48 + 128))) ** 0.5) < 2e-4
  assert abs(float(params["fc6"]["kernel"].std()) - (2 / (9216 + 2048)) ** 0.5) < 1e-4
  assert float(jnp.abs(params["conv2"]["bias"]).max()) == 0.0


def test_per_tower_shapes_for_the_kernels_follow_the_paper():
  # What scripts/dev/verify_kernels.py and bench_kernels.py run: one tower's share, traced from the table.
  n = 128
  assert alexnet_convs(n) == [
      ConvShape("conv1", (3, 224, 224, n), (3, 11, 11, 48), 4, 2),
      ConvShape("conv2", (48, 27, 27, n), (48, 5, 5, 128), 1, 2),
      ConvShape("conv3", (256, 13, 13, n), (256, 3, 3, 192), 1, 1),  # reads both towers' maps
      ConvShape("conv4", (192, 13, 13, n), (192, 3, 3, 192), 1, 1),
      ConvShape("conv5", (192, 13, 13, n), (192, 3, 3, 128), 1, 1)]
  assert alexnet_maps(n) == {"lrn1": (48, 55, 55, n), "pool1": (48, 55, 55, n), "lrn2": (128, 27, 27, n),
                             "pool2": (128, 27, 27, n), "pool5": (128, 13, 13, n)}


def test_width_classes_and_lrn_convention_scale_the_table():
  table = alexnet(num_classes=10, width=0.25, towers=4, lrn_alpha_over_n=True)
  filters = {layer.name: layer.filters for layer in table.layers if layer.filters}
  assert filters == dict(conv1=24, conv2=64, conv3=96, conv4=96, conv5=64, fc6=1024, fc7=1024, fc8=10)
  assert table.towers == 4
  lrns = [(layer.size, layer.k, layer.alpha, layer.beta, layer.alpha_over_n) for layer in table.layers
          if layer.kind == "lrn"]
  assert lrns == [(5, 2.0, 1e-4, 0.75, True)] * 2


def test_lrn_constants_come_from_the_layer():
  # α/n on the layer gives a different network than the paper's α: the model reads the layer, not a default.
  x = 30.0 * jax.random.normal(jax.random.key(0), (3, 67, 67, 2))
  logits = []
  for alpha_over_n in (False, True):
    net = Network(alexnet(num_classes=10, width=0.25, lrn_alpha_over_n=alpha_over_n), weight_init="he")
    logits.append(jax.jit(net.apply)(jax.jit(net.init)(jax.random.key(1), x), x))
  assert float(jnp.abs(logits[0] - logits[1]).max()) > 1e-3 * float(jnp.abs(logits[0]).max())


def test_conv_before_an_lrn_a_pool_or_a_conv_leaves_its_relu_s_mask_to_that_layers_kernels():
  # conv1 and conv2 feed LRNs, conv3 and conv4 convs, conv5 a pool: their kernels write the conv clamped at 0, with
  # the ReLU's mask left out of their gradient, and the LRN, pool and conv kernels after them mask it as they write
  # their own gradient (LRN and pool apply the ReLU again as they read: free there). Each LRN and the pool after it
  # are one op. What the layers output is unchanged.
  net = Network(alexnet(num_classes=10, width=0.25), weight_init="he", backend="interpret")
  x = 30.0 * jax.random.normal(jax.random.key(0), (3, 67, 67, 2))
  params = jax.jit(net.init)(jax.random.key(1), x)
  jaxpr = jax.make_jaxpr(lambda p: net.apply(p, x))(params)
  calls = [(e.primitive.name, e.params["relu"], e.params.get("relu_left", False), e.params.get("images"))
           for e in equations(jaxpr.jaxpr)
           if e.primitive.name in ("chwn_conv_fwd", "chwn_lrn_fwd", "chwn_max_pool_fwd", "chwn_lrn_max_pool_fwd")]
  conv, left = "chwn_conv_fwd", ("chwn_conv_fwd", True, True, "plain")
  norm = [left, ("chwn_lrn_max_pool_fwd", True, False, None)]
  want = norm * 2 + [left, (conv, True, True, "clamped"), (conv, True, True, "clamped"),
                     ("chwn_max_pool_fwd", True, False, None)]
  assert calls == want, calls
  logits, state = jax.jit(lambda p: net.apply(p, x, mutable=["intermediates"]))(params)
  acts = state["intermediates"]["activations"][0]
  for name in ("conv1", "conv2", "conv3", "conv4", "conv5"):  # ReLU outputs, as the table says
    assert float(acts[name].min()) == 0.0, name
  reference = Network(alexnet(num_classes=10, width=0.25), weight_init="he", backend="xla")
  want, want_state = jax.jit(lambda p: reference.apply(p, x, mutable=["intermediates"]))(params)
  np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4)
  want_acts = want_state["intermediates"]["activations"][0]
  assert acts.keys() == want_acts.keys()
  for name in acts:  # every layer's output, the pools' that now apply the ReLU included
    np.testing.assert_allclose(acts[name], want_acts[name], rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("name, size", [("alexnet", 67), ("vgg16", 32)])
def test_the_backward_leaves_xla_no_pass_over_a_conv_s_maps(name, size):
  # Every ReLU mask of a conv's output is applied by the next layer's kernels, every bias gradient summed by the
  # filter gradient's kernel: no select or sum over 4-D maps is left to XLA. Traced only.
  net = Network(get_network(name, num_classes=10, width=0.0625), weight_init="he", backend="interpret")
  x = jnp.zeros((3, size, size, 2))
  params = jax.eval_shape(net.init, jax.random.key(1), x)
  grad = jax.make_jaxpr(jax.grad(lambda p: net.apply(p, x).sum()))(params).jaxpr
  assert not [e.primitive.name for e in equations(grad) if e.primitive.name in ("select_n", "reduce_sum")
              and e.invars[-1].aval.ndim == 4]
  with_bias = [e for e in equations(grad) if e.primitive.name == "chwn_conv_wgrad" and e.params.get("bias")]
  assert len(with_bias) == sum(layer.kind == "conv" for layer in get_network(name).layers)


def test_bad_tables_and_names_are_refused():
  with pytest.raises(ValueError, match="unknown network 'lenet'; choose one of .*alexnet"):
    get_network("lenet")
  with pytest.raises(ValueError, match="unknown kind"):
    Layer("x", "deconv")
  with pytest.raises(ValueError, match="split='sum'"):
    Layer("x", "conv", filters=4, split="sum")
  with pytest.raises(ValueError, match="LRN layer needs size ≥ 1, k > 0 and beta > 0"):
    Layer("x", "lrn", size=5)
  conv, fc = Layer("c", "conv", filters=6, size=3), Layer("f", "fc", filters=10, split="sum")
  with pytest.raises(ValueError, match="6 filters do not split over 4 towers"):
    Table((conv, fc), towers=4)
  with pytest.raises(ValueError, match="must end with fc layers"):
    Table((conv, Layer("p", "pool", size=2)))
  with pytest.raises(ValueError, match=r"layer p reads \(C, H, W, N\) maps, but f left \(features, N\)"):
    Table((conv, fc, Layer("p", "pool", size=2)))
  with pytest.raises(ValueError, match="split='sum' needs per-tower inputs"):
    Table((fc,))
  with pytest.raises(ValueError, match="an fc layer reading its own tower needs split='sum'"):
    Table((conv, Layer("f", "fc", filters=10)))
  with pytest.raises(ValueError, match="unique"):
    Table((conv, conv, fc))


def test_a_plan_for_another_model_axis_is_refused():
  # A setup's plan for two devices on the model axis, applied with every tower on this one: said, not re-planned.
  from alexnet_jax.network import placement  # noqa: PLC0415

  table = alexnet(num_classes=10, width=0.0625)
  net = Network(table, plan=placement.plan(table, model=2))
  with pytest.raises(ValueError, match="plan is for a model axis of 2 devices, but it runs on 1"):
    jax.eval_shape(lambda x: net.init(jax.random.key(0), x), jax.ShapeDtypeStruct((3, 67, 67, 2), jnp.float32))
