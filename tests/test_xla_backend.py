"""The 'xla' backend as plain XLA computes: convolutions and GEMMs in the activation dtype, max-pool's gradient
without select-and-scatter (equal to XLA's own, ties included), LRN's gradient keeping nothing in float32, and no
transpose or reshape of an activation in the train step beyond the input's and the flatten before the first fc."""

import functools
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from alexnet_jax import ops
from alexnet_jax.config import paper_config
from alexnet_jax.data import device_batches
from alexnet_jax.measure import layouts
from alexnet_jax.training import train

B = 6  # a batch that no weight axis of the small config equals, so that a trailing 6 marks an activation


def xla_max_pool(x, size, stride):
  return lax.reduce_window(x, -jnp.inf, lax.max, (1, size, size, 1), (1, stride, stride, 1), "VALID")


@pytest.mark.parametrize("shape,size,stride", [
    ((3, 13, 13, 5), 3, 2),  # the paper's overlapping pool: an input lies in up to four windows
    ((2, 8, 9, 3), 2, 2),  # the last row and column lie in no window
    ((2, 9, 7, 3), 3, 1),  # up to nine windows per input
    ((1, 12, 12, 2), 3, 3),  # windows that touch without overlapping
])
def test_max_pool_gradient_equals_xla_select_and_scatter_exactly(shape, size, stride):
  rng = np.random.default_rng(sum(shape))
  x = np.maximum(rng.normal(size=shape), 0).astype(np.float32)  # ReLU output: zeros tie
  x[:, :4, :4] = 0  # whole windows of ties
  x[:, -3:, -3:] = rng.integers(0, 2, size=x[:, -3:, -3:].shape)  # ties between equal positive maxima
  y_want, vjp_want = jax.vjp(functools.partial(xla_max_pool, size=size, stride=stride), jnp.asarray(x))
  y_got, vjp_got = jax.jit(lambda v: jax.vjp(lambda u: ops.max_pool(u, size=size, stride=stride, backend="xla"), v))(
      jnp.asarray(x))
  dy = jnp.asarray(rng.normal(size=y_want.shape), jnp.float32)
  np.testing.assert_array_equal(y_got, y_want)
  np.testing.assert_array_equal(jax.jit(vjp_got)(dy)[0], vjp_want(dy)[0])  # same sums, same order: bit for bit


def test_max_pool_keeps_only_the_int8_offsets_and_no_select_and_scatter():
  x = jnp.ones((4, 13, 13, B), jnp.bfloat16)
  y, vjp = jax.vjp(lambda v: ops.max_pool(v, backend="xla"), x)
  assert [(r.dtype, r.shape) for r in jax.tree.leaves(vjp)] == [(jnp.int8, y.shape)]
  text = jax.jit(jax.grad(lambda v: ops.max_pool(v, backend="xla").astype(jnp.float32).sum())).lower(x).as_text()
  assert "select_and_scatter" not in text and "scatter" not in text


def test_max_pool_nan_window_routes_its_gradient_as_the_kernel_does():
  # A window holding NaN gives NaN, and its gradient goes to its first NaN: the Triton kernel's rule.
  x = np.random.default_rng(1).normal(size=(2, 7, 7, 3)).astype(np.float32)
  x[1, 2, 2, 1] = x[1, 2, 3, 1] = np.nan  # in windows (0..1, 0..1): the first of them in row-major order wins
  dy = np.random.default_rng(2).normal(size=(2, 3, 3, 3)).astype(np.float32)
  nan = np.zeros(dy.shape, bool)
  nan[1, :2, :2, 1] = True
  grads = {}
  for backend in ("xla", "interpret"):
    y, vjp = jax.vjp(lambda v: ops.max_pool(v, backend=backend), jnp.asarray(x))
    grads[backend] = np.asarray(vjp(jnp.asarray(dy))[0])
    np.testing.assert_array_equal(np.isnan(y), nan)
  np.testing.assert_allclose(grads["xla"], grads["interpret"], rtol=1e-6)  # the kernel adds in its own order
  assert grads["xla"][1, 2, 2, 1] == pytest.approx(dy[1, :2, :2, 1].sum()) and grads["xla"][1, 2, 3, 1] == 0


def test_lrn_gradient_keeps_only_its_input():
  # Computed in float32 inside; the backward pass recomputes it from x instead of keeping float32 powers.
  x = jnp.ones((8, 5, 5, B), jnp.bfloat16)
  _, vjp = jax.vjp(lambda v: ops.lrn(v, groups=2, backend="xla"), x)
  assert [(r.dtype, r.shape) for r in jax.tree.leaves(vjp)] == [(jnp.bfloat16, x.shape)]


def test_lrn_in_bfloat16_is_float32_lrn_rounded():
  # k + α·Σa² in bfloat16 would round the α term away (k = 2, steps of 2^-6); computed in float32 it is kept.
  x = jnp.asarray(np.random.default_rng(3).normal(size=(12, 4, 4, B)) * 8, jnp.bfloat16)
  got = ops.lrn(x, groups=2, backend="xla")
  want = ops.lrn(x.astype(jnp.float32), groups=2, backend="xla").astype(jnp.bfloat16)
  np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_conv_and_dense_compute_in_bfloat16_forward_and_backward():
  rng = np.random.default_rng(4)
  x, w, b = (jnp.asarray(rng.normal(size=s), dt) for s, dt in
             [((4, 9, 9, B), jnp.bfloat16), ((2, 3, 3, 8), jnp.float32), ((8,), jnp.float32)])
  fc_w = jnp.asarray(rng.normal(size=(8 * 5 * 5, 10)), jnp.float32)

  def loss(x, w, b, fc_w):
    y = ops.conv2d(x, w, b, stride=2, padding=1, groups=2, relu=True, backend="xla")
    return ops.dense(y.reshape(-1, B), fc_w, relu=True, backend="xla").astype(jnp.float32).sum()

  jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1, 2, 3)))(x, w, b, fc_w)
  heavy = [e for e in equations(jaxpr.jaxpr) if e.primitive.name in ("conv_general_dilated", "dot_general")]
  assert len(heavy) == 6  # conv forward, data and filter gradient; the same for the fc layer
  for e in heavy:
    assert {v.aval.dtype for v in (*e.invars, *e.outvars)} == {jnp.dtype(jnp.bfloat16)}, e
    assert e.params["preferred_element_type"] in (None, jnp.bfloat16), e


def equations(jaxpr):
  """Every equation of a jaxpr and of the jaxprs inside it, in program order."""
  for e in jaxpr.eqns:
    yield e
    for sub in jax.extend.core.jaxprs_in_params(e.params):
      yield from equations(sub)


def small_config(model: int):
  c = paper_config()
  c.width, c.image_size, c.weight_init, c.dtype = 0.25, 112, "he", "bfloat16"
  c.dataset.name, c.dataset.num_classes, c.batch_size, c.kernel_backend = "procedural", 10, B, "xla"
  c.mesh.model = model
  return c


def lowered_step_text(config) -> str:
  setup = train.make_setup(config, 10, 1000)
  state = jax.eval_shape(lambda k: train.create_train_state(setup, k), jax.random.key(0))
  batch = setup.batch_layout.put(device_batches.random_batch(B, config.image_size, 10))
  return jax.jit(functools.partial(train.train_step, setup=setup)).lower(state, batch, jax.random.key(0)).as_text()


def reshaped_activations(text: str, op: str, batch_first: bool) -> list[tuple[str, str]]:
  """(operand, result) types of every `op` (transpose, reshape) whose operand or result is a 4-D or 5-D activation:
  batch last (CHWN), or, with batch_first, first (the NHWC images)."""
  found = []
  for a, r in re.findall(rf"stablehlo\.{op} .*?: \((tensor<[^>]*>)\) -> (tensor<[^>]*>)", text):
    dims = [[int(d) for d in t[7:-1].split("x")[:-1]] for t in (a, r)]
    if any(len(d) >= 4 and (d[-1] == B or batch_first and d[0] == B) for d in dims):
      found.append((a, r))
  return found


@pytest.mark.parametrize("model", [1, 2])  # both towers on one device (grouped convolutions), or one tower each
def test_train_step_moves_no_activation_between_layouts(model):
  # XLA's GPU layout assignment picks each convolution's layout (NHWC for bf16) and carries it through the ops
  # between them when nothing pins one: no transpose of ours, no reshape but the flatten before fc6, no scatter.
  text = lowered_step_text(small_config(model))
  assert "select_and_scatter" not in text
  convolutions = re.findall(r"stablehlo\.convolution.*?: \((tensor<[^>]*>), (tensor<[^>]*>)\) -> (tensor<[^>]*>)",
                            text)
  assert len(convolutions) == 14 and all(t.endswith("xbf16>") for c in convolutions for t in c), convolutions
  images = (f"tensor<{B}x112x112x3xbf16>", f"tensor<3x112x112x{B}xbf16>")  # the NHWC batch made CHWN, in bf16
  assert reshaped_activations(text, "transpose", batch_first=True) == [images]
  flatten = (f"tensor<64x2x2x{B}xbf16>", f"tensor<256x{B}xbf16>")  # pool5 (C, H, W, N) → (C·H·W, N), and back
  assert sorted(reshaped_activations(text, "reshape", batch_first=False)) == sorted([flatten, flatten[::-1]])


@pytest.mark.parametrize("model", [1, 2])
def test_every_gemm_of_the_train_step_reads_bfloat16(model):
  # A float32 operand sends XLA:GPU's GEMM to TF32 kernels (~0.3 ms of AlexNet's step at batch 512 on one H200 for
  # fc8, whose partial logits are summed in float32): only fc8's forward result may be float32.
  text = lowered_step_text(small_config(model))
  gemms = re.findall(r"stablehlo\.dot_general.*?: \((tensor<[^>]*>), (tensor<[^>]*>)\) -> (tensor<[^>]*>)", text)
  # fc6, fc7, fc8: forward, data and weight gradient; with both towers on the device, those of fc6 and fc7 batched
  assert len(gemms) == 9, gemms
  assert all(a.endswith("xbf16>") and b.endswith("xbf16>") for a, b, _ in gemms), gemms
  assert [r for *_, r in gemms if not r.endswith("xbf16>")] == [f"tensor<10x{B}xf32>"], gemms
  # No tower-stacked fc weight (towers, inputs, outputs) is transposed to lay the towers side by side: transposes
  # within each tower (its GEMM's operand order, which XLA folds into the GEMM) keep the tower axis first.
  assert not re.findall(r"stablehlo\.transpose %\d+, dims = \[[1-9][^]]*\] : \(tensor<2x\d+x\d+x[bf]", text)


def test_float32_sum_of_bfloat16_dense_and_its_gradients():
  rng = np.random.default_rng(5)
  x, w, g = (rng.normal(size=s) for s in [(24, B), (24, 10), (10, B)])
  xb, wb, gb = (np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64) for a in (x, w, g))  # the operands as rounded
  y, vjp = jax.vjp(lambda x, w: ops.dense(x, w, out_dtype=jnp.float32, backend="xla"),
                   jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.float32))
  assert y.dtype == jnp.float32
  np.testing.assert_allclose(y, wb.T @ xb, rtol=1e-5, atol=1e-5)  # float32 accumulation of the rounded operands
  dx, dw = vjp(jnp.asarray(g, jnp.float32))
  assert (dx.dtype, dw.dtype) == (jnp.bfloat16, jnp.float32)
  np.testing.assert_allclose(np.float64(dx), wb @ gb, rtol=2e-2, atol=2e-2)  # cotangent rounded to bf16, bf16 out
  np.testing.assert_allclose(np.float64(dw), xb @ gb.T, rtol=2e-2, atol=2e-2)
  y64 = ops.dense(jnp.float32(x), jnp.float32(w), out_dtype=jnp.float32)  # float32 in: as before, one plain GEMM
  np.testing.assert_allclose(y64, w.T @ x, rtol=1e-5, atol=1e-5)


def test_census_reads_convolutions_layout_changes_and_scatters_of_gpu_hlo():
  # Lines as XLA:GPU prints them: operands with their types, layouts minor-to-major.
  text = "\n".join([
      '  %p = bf16[96,55,55,128]{3,2,1,0} parameter(0)',
      '  %t = bf16[96,55,55,128]{0,2,1,3} transpose(bf16[96,55,55,128]{3,2,1,0} %p), dimensions={0,1,2,3}, '
      'metadata={op_name="jit(train_step)/jvp(Network)/conv2/transpose"}',
      '  %b = bf16[55,55,96,128]{3,1,0,2} transpose(bf16[96,55,55,128]{3,2,1,0} %p), dimensions={1,2,0,3}',  # bitcast
      '  %c = bf16[96,55,55,128]{0,2,1,3} copy(bf16[96,55,55,128]{3,2,1,0} %p), '
      'metadata={op_name="jit(train_step)/transpose(jvp(Network))/pool1/copy"}',
      '  %w = f32[3,11,11,96]{3,2,1,0} parameter(1)',
      '  %small = f32[3,11,11,96]{0,3,2,1} copy(f32[3,11,11,96]{3,2,1,0} %w)',  # below min_bytes
      '  %conv = (bf16[128,55,55,96]{3,2,1,0}, u8[0]{0}) custom-call(bf16[128,224,224,3]{3,2,1,0} %x, '
      'bf16[96,11,11,3]{3,2,1,0} %k), custom_call_target="__cudnn$convForward"',
      '  %s = f32[96,55,55,128]{3,2,1,0} select-and-scatter(f32[96,55,55,128]{3,2,1,0} %p, f32[1]{0} %d, f32[] %z)',
      '  %r = bf16[48,55,55,128]{3,2,1,0} reduce-scatter(bf16[96,55,55,128]{3,2,1,0} %p), dimensions={0}',
  ])
  found = layouts.census(text, ["conv1", "conv2", "pool1"], min_bytes=2 ** 20, batch=128)
  assert found["convolutions"] == {"bf16,bf16 -> bf16": 1} and found["scatters"] == {"select-and-scatter": 1}
  size = 96 * 55 * 55 * 128 * 2
  assert found["layout_changes"] == [
      {"layer": "conv2", "pass": "fwd", "op": "transpose", "type": "bf16[96,55,55,128]{0,2,1,3}", "bytes": size,
       "activation": True},
      {"layer": "pool1", "pass": "bwd", "op": "copy", "type": "bf16[96,55,55,128]{0,2,1,3}", "bytes": size,
       "activation": True}]
  assert found["activation_change_bytes"] == found["layout_change_bytes"] == 2 * size


def test_census_of_compiled_max_pool_gradients_on_cpu():
  # XLA:CPU prints operands by name only; its select-and-scatter becomes a scatter. Ours has none.
  x = jnp.ones((8, 13, 13, B), jnp.float32)
  grads = {"xla": jax.grad(lambda v: ops.max_pool(v, backend="xla").sum()),
           "plain": jax.grad(lambda v: xla_max_pool(v, 3, 2).sum())}
  found = {k: layouts.census(jax.jit(f).lower(x).compile().as_text(), [], 0, B) for k, f in grads.items()}
  assert found["xla"]["scatters"] == {} and sum(found["plain"]["scatters"].values()) >= 1
  moved = jax.jit(lambda v: jnp.transpose(v, (3, 1, 2, 0)) * 2).lower(x).compile().as_text()
  assert [m["type"].split("{")[0] for m in layouts.census(moved, [], 0, B)["layout_changes"]] == [f"f32[{B},13,13,8]"]
