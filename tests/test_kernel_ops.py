"""The ops as primitives around their Triton kernels: the real kernels under the interpreter ('interpret') against
'xla', through jit, grad, vmap, shard_map with check_vma on two CPU devices, and jax.export for CPU and TPU; 'auto'
without a CUDA device is the XLA reference (tests/test_gpu_kernels.py stages both on a GPU)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from alexnet_jax import ops

RNG = np.random.default_rng(0)


def rand(*shape, scale=1.0):
  return jnp.asarray(RNG.normal(size=shape) * scale, jnp.float32)


OPS = {
    # name: (op(backend) -> f(*args), args); shapes are ragged on purpose (odd maps, N = 3 and 33)
    "conv_grouped_relu": (lambda be: lambda x, w, b: ops.conv2d(x, w, b, padding=2, groups=2, relu=True, backend=be),
                          (rand(6, 9, 9, 3), rand(3, 5, 5, 8, scale=0.2), rand(8))),
    "conv_stride4": (lambda be: lambda x, w: ops.conv2d(x, w, stride=4, padding=2, backend=be),
                     (rand(3, 19, 19, 3), rand(3, 11, 11, 4, scale=0.1))),
    "max_pool": (lambda be: lambda x: ops.max_pool(x, backend=be), (jnp.maximum(rand(5, 13, 11, 33), 0),)),
    "lrn": (lambda be: lambda x: ops.lrn(x, groups=2, backend=be), (rand(8, 5, 5, 3, scale=40),)),
    # the conv's ReLU moved into the LRN after it (network/model.py does so for conv1 and conv2)
    "conv_lrn_relu": (lambda be: lambda x, w, b: ops.lrn(ops.conv2d(x, w, b, padding=2, groups=2, backend=be),
                                                         groups=2, relu=True, backend=be),
                      (rand(6, 9, 9, 3), rand(3, 5, 5, 8, scale=0.2), rand(8))),
    # an LRN and the pool after it as one op, the conv's ReLU in it (model.py: conv1 and conv2)
    "conv_lrn_pool_relu": (lambda be: lambda x, w, b: ops.lrn_max_pool(
        ops.conv2d(x, w, b, padding=2, groups=2, backend=be), groups=2, relu=True, backend=be),
                           (rand(6, 11, 9, 3), rand(3, 5, 5, 8, scale=0.2), rand(8))),
    "lrn_max_pool": (lambda be: lambda x: ops.lrn_max_pool(x, groups=2, backend=be), (rand(8, 9, 7, 33, scale=40),)),
    # and into the pool after it (model.py: conv5, and VGG's last conv of each block)
    "conv_pool_relu": (lambda be: lambda x, w, b: ops.max_pool(ops.conv2d(x, w, b, padding=1, groups=2, backend=be),
                                                               relu=True, backend=be),
                       (rand(6, 9, 9, 3), rand(3, 3, 3, 8, scale=0.2), rand(8))),
}


def loss(op, *args):
  y = op(*args)
  return (y * jnp.cos(jnp.arange(y.size).reshape(y.shape))).sum()  # a cotangent that is not all ones


@pytest.mark.parametrize("name", sorted(OPS))
def test_primitive_matches_xla_forward_and_gradient(name):
  make, args = OPS[name]
  with jax.default_matmul_precision("highest"):
    want = jax.jit(make("xla"))(*args)
    got = jax.jit(make("interpret"))(*args)
    argnums = tuple(range(len(args)))
    want_g = jax.jit(jax.grad(functools.partial(loss, make("xla")), argnums))(*args)
    got_g = jax.jit(jax.grad(functools.partial(loss, make("interpret")), argnums))(*args)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  for g, w in zip(got_g, want_g):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(jnp.abs(w).max()))


@pytest.mark.parametrize("name", ["conv_grouped_relu", "max_pool", "lrn", "lrn_max_pool"])
def test_vmap_folds_into_the_image_axis(name):
  make, args = OPS[name]
  stacked = jnp.stack([args[0], 2 * args[0]])
  with jax.default_matmul_precision("highest"):
    got = jax.vmap(lambda x: make("interpret")(x, *args[1:]))(stacked)
    want = jnp.stack([make("xla")(x, *args[1:]) for x in stacked])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_vmap_over_filters_maps():
  _, (x, w, b) = OPS["conv_grouped_relu"]
  ws = jnp.stack([w, -w])
  with jax.default_matmul_precision("highest"):
    got = jax.vmap(lambda w: ops.conv2d(x, w, b, padding=2, groups=2, backend="interpret"))(ws)
    want = jnp.stack([ops.conv2d(x, w, b, padding=2, groups=2) for w in ws])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_primitives_inside_shard_map_with_check_vma():
  # Images split over two devices by their image axis N, the weights replicated: the gradient of the replicated
  # weights is summed over the devices by the transpose of the widening the ops insert.
  mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  x, w = rand(4, 9, 9, 6), rand(4, 3, 3, 4, scale=0.3)

  def net(backend):
    def local(x, w):
      y = ops.conv2d(x, w, padding=1, relu=True, backend=backend)
      y = ops.lrn(ops.max_pool(y, backend=backend), backend=backend)
      y = ops.lrn_max_pool(y, backend=backend)
      return jax.lax.psum((y ** 2).sum(), "data")

    return jax.shard_map(local, mesh=mesh, in_specs=(P(None, None, None, "data"), P()), out_specs=P(),
                         check_vma=True)

  with jax.default_matmul_precision("highest"):
    want = jax.jit(jax.value_and_grad(net("xla"), (0, 1)))(x, w)  # one program, not one per operation
    got = jax.jit(jax.value_and_grad(net("interpret"), (0, 1)))(x, w)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4), got, want)


def test_auto_without_a_cuda_device_traces_the_reference_alone():
  # No program made here can carry the kernels (jax-triton compiles them for the GPU it sees): nothing is staged.
  make, args = OPS["conv_lrn_relu"]
  jaxprs = [str(jax.make_jaxpr(jax.grad(functools.partial(loss, make(b)), (0, 1, 2)))(*args)) for b in ("auto", "xla")]
  assert jaxprs[0] == jaxprs[1] and "cond[" not in jaxprs[0] and "chwn_" not in jaxprs[0]


def test_export_for_cpu_and_tpu_lowers_on_a_cpu_host():
  # The CUDA branches are left out of a CPU+TPU artifact: no Triton kernel and no host callback in it, and the
  # artifact run on this CPU gives the live values and gradients.
  def f(x, w):
    y = ops.lrn(ops.max_pool(ops.conv2d(x, w, padding=1, relu=True)), groups=2)
    return (y ** 2).sum()

  x, w = rand(4, 9, 9, 6), rand(4, 3, 3, 4, scale=0.3)
  step = jax.jit(jax.value_and_grad(f, (0, 1)))
  exported = jax.export.export(step, platforms=["cpu", "tpu"])(x, w)
  text = exported.mlir_module()
  assert "triton" not in text and "callback" not in text
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), exported.call(x, w), step(x, w))


def test_eager_calls_reuse_one_compiled_program():
  from alexnet_jax.ops.kernel import KernelPrimitive  # noqa: PLC0415

  x = jnp.maximum(rand(2, 7, 7, 3), 0)
  ops.max_pool(x, backend="interpret")
  before = KernelPrimitive._eager.cache_info()
  ops.max_pool(x, backend="interpret")
  after = KernelPrimitive._eager.cache_info()
  assert (after.hits, after.misses) == (before.hits + 1, before.misses)


def test_triton_backend_without_a_gpu_says_so():
  _, args = OPS["max_pool"]
  with pytest.raises(ValueError, match="needs a CUDA GPU"):
    jax.jit(OPS["max_pool"][0]("triton"))(*args)


def test_two_tower_model_on_two_devices_runs_the_kernels():
  # The paper's split at width 1/16 on a 67×67 image (the smallest that keeps every layer), with dropout: the
  # kernels under the interpreter give the XLA model's loss and gradients (ragged batches: the ops' tests above).
  from alexnet_jax.network import sharding  # noqa: PLC0415
  from alexnet_jax.network.model import Network  # noqa: PLC0415
  from alexnet_jax.network.table import alexnet  # noqa: PLC0415

  layers = alexnet(num_classes=10, width=0.0625)
  x = jax.random.normal(jax.random.key(1), (3, 67, 67, 1))
  mesh = sharding.make_mesh(model=2)
  results = []
  params = jax.jit(Network(layers, weight_init="he").init)(jax.random.key(0), x)["params"]  # either backend's
  for backend in ("xla", "interpret"):
    net = Network(layers, weight_init="he", backend=backend)
    params = jax.device_put(params, sharding.param_shardings(mesh, net, params))
    apply = sharding.sharded_apply(net, mesh)
    with jax.default_matmul_precision("highest"):
      results.append(jax.jit(jax.value_and_grad(lambda p: (apply(p, x, jax.random.key(2), True) ** 2).mean()))(
          params))
  (want, want_g), (got, got_g) = results
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * float(jnp.abs(w).max()))


def test_network_in_network_runs_the_kernels():
  # NiN at width 1/16 on 64×64 (its maps 15, 7, 3, 1): its 1×1 convolutions and global average pool under the
  # interpreter give the XLA network's loss and gradients.
  from alexnet_jax.network.model import Network  # noqa: PLC0415
  from alexnet_jax.network.table import nin  # noqa: PLC0415

  layers = nin(num_classes=10, width=0.0625)
  x = jax.random.normal(jax.random.key(1), (3, 64, 64, 2))
  params = jax.jit(Network(layers, weight_init="he").init)(jax.random.key(0), x)["params"]
  results = []
  for backend in ("xla", "interpret"):
    net = Network(layers, weight_init="he", backend=backend)
    with jax.default_matmul_precision("highest"):
      results.append(jax.jit(jax.value_and_grad(lambda p: (net.apply({"params": p}, x) ** 2).mean()))(params))
  (want, want_g), (got, got_g) = results
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * float(jnp.abs(w).max()))


def test_training_crops_kernel_equals_the_data_s_device_augmentation():
  # The input kernel against XLA's crop, flip, colour shift and normalise, transposed to CHWN: float32 to its
  # rounding, float16 to one rounding of the same value; ragged sizes (N = 5, 13-pixel crops of 20-pixel images).
  from alexnet_jax.data import device_augment  # noqa: PLC0415
  from alexnet_jax.ops import crops  # noqa: PLC0415

  n, stored, size, mean, std = 5, 20, 13, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
  images = jnp.asarray(RNG.integers(0, 256, (n, stored, stored, 3)), jnp.uint8)
  offsets = jnp.asarray([[0, 0], [7, 7], [3, 0], [0, 5], [2, 6]], jnp.int32)
  flips = jnp.asarray([True, False, True, True, False])
  shifts = rand(n, 3, scale=0.1)
  crop = device_augment.crop_flip(images, offsets, flips, size)
  want = jnp.transpose(device_augment.normalise(crop, shifts, mean, std), (3, 1, 2, 0))
  for dtype, rtol in ((jnp.float32, 1e-6), (jnp.float16, 2.0 ** -10)):
    got = crops.crops(images, offsets, flips, shifts, size=size, mean=mean, std=std, dtype=dtype, mode="interpret")
    assert got.dtype == dtype and got.shape == (3, size, size, n)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=rtol, atol=1e-6)
  with pytest.raises(ValueError, match="does not fit 20×20 images"):
    crops.crops(images, offsets, flips, shifts, size=21, mean=mean, std=std, dtype=jnp.float32, mode="interpret")
