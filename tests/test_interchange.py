"""Weights interchange with the PyTorch/Caffe grouped AlexNet: layouts, and logits against a float64 numpy reference
of that network written here from PyTorch's semantics (torch itself is not a dependency)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from alexnet_jax.config import paper_config
from alexnet_jax.network import interchange, sharding
from alexnet_jax.network.interchange import from_torch, to_torch, torch_shapes
from alexnet_jax.network.model import Network
from alexnet_jax.network.table import alexnet
from alexnet_jax.training import loop, restore, train

TORCHVISION_STYLE = {
    "conv1.weight": (96, 3, 11, 11), "conv1.bias": (96,),
    "conv2.weight": (256, 48, 5, 5), "conv2.bias": (256,),
    "conv3.weight": (384, 256, 3, 3), "conv3.bias": (384,),
    "conv4.weight": (384, 192, 3, 3), "conv4.bias": (384,),
    "conv5.weight": (256, 192, 3, 3), "conv5.bias": (256,),
    "fc6.weight": (4096, 9216), "fc6.bias": (4096,),
    "fc7.weight": (4096, 4096), "fc7.bias": (4096,),
    "fc8.weight": (1000, 4096), "fc8.bias": (1000,),
}


# The reference: PyTorch/Caffe semantics in NCHW, float64.

def conv(x, w, b, *, stride=1, padding=0, groups=1):
  """torch.nn.functional.conv2d: cross-correlation, OIHW weights, group g reads input block g, owns output block g."""
  n, c = x.shape[:2]
  f, cg, kh, kw = w.shape
  x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  windows = sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]  # (N, C, H', W', KH, KW)
  windows = windows.reshape(n, groups, c // groups, *windows.shape[2:])
  y = np.einsum("ngchwij,gfcij->ngfhw", windows, w.reshape(groups, f // groups, cg, kh, kw), optimize=True)
  return y.reshape(n, f, *y.shape[3:]) + b[:, None, None]


def lrn(x, *, groups, k=2.0, n=5, alpha=1e-4, beta=0.75):
  """The paper's formula, α not divided by n (unlike nn.LocalResponseNorm), window clipped at each group's edges."""
  a = x.reshape(x.shape[0], groups, -1, *x.shape[2:])
  squares = np.pad(a * a, ((0, 0), (0, 0), (n // 2, (n - 1) // 2), (0, 0), (0, 0)))
  sums = sliding_window_view(squares, n, axis=2).sum(-1)
  return (a / (k + alpha * sums) ** beta).reshape(x.shape)


def max_pool(x):
  return sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(-2, -1))


def relu(x):
  return np.maximum(x, 0.0)


def reference_logits(s, x, towers, lrn_groups=None):
  """Grouped AlexNet as Caffe's deploy prototxt and PyTorch write it, conv1 padded by 2 as in our table."""
  s = {k: np.asarray(v, np.float64) for k, v in s.items()}
  lrn_groups = towers if lrn_groups is None else lrn_groups
  x = max_pool(lrn(relu(conv(x, s["conv1.weight"], s["conv1.bias"], stride=4, padding=2)), groups=lrn_groups))
  x = max_pool(lrn(relu(conv(x, s["conv2.weight"], s["conv2.bias"], padding=2, groups=towers)), groups=lrn_groups))
  x = relu(conv(x, s["conv3.weight"], s["conv3.bias"], padding=1))
  x = relu(conv(x, s["conv4.weight"], s["conv4.bias"], padding=1, groups=towers))
  x = max_pool(relu(conv(x, s["conv5.weight"], s["conv5.bias"], padding=1, groups=towers)))
  x = x.reshape(x.shape[0], -1)  # torch.flatten(x, 1): (C, H, W) per image
  x = relu(x @ s["fc6.weight"].T + s["fc6.bias"])
  x = relu(x @ s["fc7.weight"].T + s["fc7.bias"])
  return x @ s["fc8.weight"].T + s["fc8.bias"]


def random_state(shapes, seed=0):
  """A torch-layout dict, He-scaled so activations stay O(image scale); biases large enough to matter."""
  rng = np.random.default_rng(seed)
  state = {}
  for key, shape in shapes.items():
    fan_in = int(np.prod(shape[1:])) if key.endswith(".weight") else 1
    std = (2.0 / fan_in) ** 0.5 if key.endswith(".weight") else 1.0
    state[key] = (std * rng.standard_normal(shape)).astype(np.float32)
  return state


def random_images(n, size, seed=1):
  h, w = (size, size) if isinstance(size, int) else size
  # Raw mean-subtracted pixels (std ≈ 50) push α·Σa² to the size of k, so LRN is far from linear and its grouping
  # changes the logits measurably.
  return 50.0 * np.random.default_rng(seed).standard_normal((n, 3, h, w))


def our_logits(table, params, x_nchw):
  net = Network(table, weight_init="he")
  x = jnp.asarray(x_nchw.transpose(1, 2, 3, 0), jnp.float32)  # NCHW → CHWN
  return np.asarray(jax.jit(lambda p, x: net.apply({"params": p}, x, train=False))(params, x))


def assert_logits_close(got, want, rtol=1e-4):
  scale = np.abs(want).max()
  np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


# 1. Layouts and the round trip.

def test_paper_net_round_trip_and_torchvision_shapes():
  table = alexnet()
  net = Network(table)
  shapes = jax.eval_shape(net.init, jax.random.key(0), jax.ShapeDtypeStruct((3, 224, 224, 1), jnp.float32))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda a: rng.standard_normal(a.shape, np.float32), shapes["params"])

  state = to_torch(params, table)
  assert {k: v.shape for k, v in state.items()} == TORCHVISION_STYLE
  assert list(state) == list(TORCHVISION_STYLE)  # layer order, weight before bias, as a torch state_dict
  assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in state.values())
  assert torch_shapes(table) == TORCHVISION_STYLE

  # Tower b (t=1) is the second block of outputs; fc8's tower b holds the second block of input columns.
  assert state["conv1.weight"][48 + 7, 2, 4, 9] == params["conv1"]["kernel"][1, 2, 4, 9, 7]
  assert state["conv2.weight"][128 + 7, 5, 2, 3] == params["conv2"]["kernel"][1, 5, 2, 3, 7]
  assert state["conv3.weight"][192 + 1, 200, 0, 2] == params["conv3"]["kernel"][1, 200, 0, 2, 1]
  assert state["fc6.weight"][2048 + 5, 100] == params["fc6"]["kernel"][1, 100, 5]
  assert state["fc8.weight"][3, 2048 + 10] == params["fc8"]["kernel"][1, 10, 3]
  assert state["conv5.bias"][128 + 3] == params["conv5"]["bias"][1, 3]
  np.testing.assert_array_equal(state["fc8.bias"], params["fc8"]["bias"])

  back = from_torch(state, table)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  for path, want in jax.tree_util.tree_leaves_with_path(params):
    got = back[path[0].key][path[1].key]
    assert got.dtype == np.float32, jax.tree_util.keystr(path)
    np.testing.assert_array_equal(got, want, err_msg=jax.tree_util.keystr(path))


def test_any_float_dtype_and_array_like_is_accepted():
  table = alexnet(num_classes=10, width=0.25)
  state = random_state(torch_shapes(table, image_size=112))
  want = from_torch(state, table, image_size=112)
  mixed = {k: v.astype(np.float64) for k, v in state.items()}
  mixed["conv1.bias"] = state["conv1.bias"].tolist()  # anything np.asarray takes
  mixed["conv2.bias"] = state["conv2.bias"].astype(jnp.bfloat16)
  got = from_torch(mixed, table, image_size=112)
  for name in want:
    assert got[name]["kernel"].dtype == got[name]["bias"].dtype == np.float32
    np.testing.assert_array_equal(got[name]["kernel"], want[name]["kernel"])
  np.testing.assert_allclose(got["conv2"]["bias"], want["conv2"]["bias"], rtol=1e-2)
  # The result owns its memory: editing it leaves the caller's dict alone.
  got["conv3"]["bias"][:] = 0
  assert np.abs(mixed["conv3.bias"]).max() > 0


# 2. The same weights give the same logits as the PyTorch/Caffe network.

CASES = {
    # Paper widths at a small image that still leaves pool5 2×2, so the (C, H, W) flatten order matters.
    "paper-width": dict(kw=dict(), image=99),
    "quarter-width": dict(kw=dict(num_classes=10, width=0.25), image=112),
    # Four towers and a non-square image (pool5 2×3: H and W cannot be confused).
    "four-towers": dict(kw=dict(num_classes=10, width=0.25, towers=4), image=(99, 131)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_the_grouped_torch_network(case):
  kw, image = CASES[case]["kw"], CASES[case]["image"]
  table = alexnet(**kw)
  state = random_state(torch_shapes(table, image))
  x = random_images(2, image)

  want = reference_logits(state, x, table.towers)
  got = our_logits(table, from_torch(state, table, image_size=image), x)
  assert got.shape == want.shape == (2, table.layers[-1].filters)
  assert_logits_close(got, want)

  # The check can see a mistake of the kind it guards against: LRN across the tower boundary moves the logits.
  mixed = reference_logits(state, x, table.towers, lrn_groups=1)
  assert np.abs(mixed - want).max() > 100 * 1e-4 * np.abs(want).max()


# 3. Sharded parameters convert as host ones do.

def test_sharded_params_give_the_same_dict():
  table = alexnet(num_classes=10, width=0.25)
  state = random_state(torch_shapes(table, image_size=112))
  params = from_torch(state, table, image_size=112)
  mesh = sharding.make_mesh(model=2)
  net = Network(table, weight_init="he")
  sharded = jax.device_put(params, sharding.param_shardings(mesh, net, params))
  assert len(sharded["conv2"]["kernel"].addressable_shards) == 2
  assert sharded["conv2"]["kernel"].addressable_shards[0].data.shape[0] == 1  # one tower per device

  got = to_torch(sharded, table)
  want = to_torch(params, table)
  assert list(got) == list(want)
  for key in want:
    assert isinstance(got[key], np.ndarray) and got[key].dtype == np.float32, key
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    np.testing.assert_array_equal(got[key], state[key], err_msg=key)

  # And the two-device model computes the torch network's logits from them.
  x = random_images(2, 112)
  apply = jax.jit(sharding.sharded_apply(net, mesh), static_argnums=3)
  logits = np.asarray(apply(sharded, jnp.asarray(x.transpose(1, 2, 3, 0), jnp.float32), jax.random.key(0), False))
  assert_logits_close(logits, reference_logits(state, x, 2))


# 4. Bad input.

def small(towers=2):
  table = alexnet(num_classes=10, width=0.25, towers=towers)
  return table, random_state(torch_shapes(table, image_size=112))


def test_missing_unexpected_and_misshapen_keys_are_named():
  table, state = small()
  del state["conv3.bias"]
  state["features.0.weight"] = np.zeros((64, 3, 11, 11), np.float32)
  state["conv2.weight"] = np.zeros((64, 24, 5, 5), np.float32)  # groups=1 instead of 2
  with pytest.raises(ValueError) as e:
    from_torch(state, table, image_size=112)
  message = str(e.value)
  assert "conv3.bias: missing, expected shape (96,)" in message
  assert "features.0.weight: unexpected key" in message
  assert "conv2.weight: expected shape (64, 12, 5, 5), got (64, 24, 5, 5)" in message


def test_wrong_image_size_is_a_shape_error_at_fc6():
  table, state = small()
  with pytest.raises(ValueError, match=r"fc6.weight: expected shape \(1024, 576\), got \(1024, 256\)"):
    from_torch(state, table, image_size=140)  # pool5 3×3 instead of 2×2


def test_wrong_tower_count_and_integer_weights_are_refused():
  table, state = small()
  with pytest.raises(ValueError, match=r"conv2.weight: expected shape \(64, 6, 5, 5\), got \(64, 12, 5, 5\)"):
    from_torch(state, small(towers=4)[0], image_size=112)
  state["fc8.bias"] = np.zeros(10, np.int32)
  with pytest.raises(ValueError, match="fc8.bias: expected a floating-point array, got dtype int32"):
    from_torch(state, table, image_size=112)


def test_to_torch_names_missing_and_unknown_layers():
  table, state = small()
  params = from_torch(state, table, image_size=112)
  params["conv9"] = params.pop("conv4")
  params["fc7"] = {"kernel": params["fc7"]["kernel"]}
  with pytest.raises(ValueError) as e:
    to_torch(params, table)
  message = str(e.value)
  assert "conv9: parameters of a layer the table does not have" in message
  assert "conv4: expected parameters 'kernel' and 'bias', got []" in message
  assert "fc7: expected parameters 'kernel' and 'bias', got ['kernel']" in message
  params = from_torch(state, table, image_size=112)
  params["fc8"]["bias"] = np.zeros((2, 5), np.float32)
  with pytest.raises(ValueError, match=r"fc8: expected a 3-d kernel and bias \(10,\), got kernel \(2, 512, 10\)"):
    to_torch(params, table)


def small_setup(classes: int):
  config = paper_config()
  config.width, config.image_size, config.weight_init, config.mesh.model = 0.0625, 64, "he", 2
  return config, train.make_setup(config, classes, 1000)


def test_a_run_starts_from_a_weights_file_and_makes_the_last_layer_anew_for_other_classes(tmp_path):
  _, setup10 = small_setup(10)
  trained = train.create_train_state(setup10, jax.random.key(5)).params  # "pretrained": another draw
  path = str(tmp_path / "weights.npz")
  np.savez(path, **to_torch(trained, setup10.net.table))
  _, setup5 = small_setup(5)
  fresh = train.create_train_state(setup5, jax.random.key(0)).params
  started = restore.weights_from(path, setup5, fresh)
  for name in ("conv1", "conv3", "fc7"):  # the file's, placed as the run places them
    np.testing.assert_array_equal(np.asarray(started[name]["kernel"]), np.asarray(trained[name]["kernel"]))
    assert started[name]["kernel"].sharding == fresh[name]["kernel"].sharding
  np.testing.assert_array_equal(np.asarray(started["fc8"]["kernel"]), np.asarray(fresh["fc8"]["kernel"]))  # anew


def test_training_from_a_weights_file_begins_with_its_weights(tmp_path):
  config, setup = small_setup(10)
  trained = train.create_train_state(setup, jax.random.key(5)).params
  np.savez(tmp_path / "w.npz", **to_torch(trained, setup.net.table))
  config.dataset.name, config.dataset.num_train_examples, config.dataset.num_eval_examples = "procedural", 8, 8
  config.batch_size, config.eval_batch_size, config.num_epochs = 8, 8, 1.0
  config.learning_rate, config.weight_decay, config.init_from = 1e-12, 0.0, str(tmp_path / "w.npz")
  workdir = str(tmp_path / "run")
  loop.train_and_evaluate(config, workdir)
  _, _, state = restore.restore_newest(workdir)
  for name, p in trained.items():  # one step of a vanishing learning rate later
    np.testing.assert_allclose(np.asarray(state.params[name]["kernel"]), np.asarray(p["kernel"]), atol=1e-6)


def test_weights_that_are_not_finite_are_refused_naming_the_key(tmp_path):
  _, setup = small_setup(10)
  state = to_torch(train.create_train_state(setup, jax.random.key(0)).params, setup.net.table)
  bad = dict(state, **{"conv2.weight": np.where(np.arange(state["conv2.weight"].size).reshape(
      state["conv2.weight"].shape) == 3, np.nan, state["conv2.weight"])})
  with pytest.raises(ValueError, match="conv2.weight: holds 1 values that are not finite in float32"):
    from_torch(bad, setup.net.table, image_size=64)
  huge = dict(state, **{"fc6.bias": np.full(state["fc6.bias"].shape, 1e300, np.float64)})
  with pytest.raises(ValueError, match=r"fc6.bias: holds [\d,]+ values that are not finite in float32"):
    from_torch(huge, setup.net.table, image_size=64)
  np.savez(tmp_path / "bad.npz", **bad)
  with pytest.raises(ValueError, match="conv2.weight: holds 1 values"):
    restore.weights_from(str(tmp_path / "bad.npz"), setup, train.create_train_state(setup, jax.random.key(0)).params)
  with pytest.raises(ValueError, match="a weights file must be .npz, .pt or .pth"):
    interchange.read(str(tmp_path / "w.bin"))
