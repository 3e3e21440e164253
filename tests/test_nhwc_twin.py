"""scripts/bench_nhwc.py's baseline, the plain-XLA NHWC twin of a one-tower table, computes our network: same
parameters (in its layouts), same logits."""

import os
import runpy

import jax
import numpy as np
import pytest

from alexnet_jax import networks
from alexnet_jax.model import Network

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWIN = runpy.run_path(os.path.join(ROOT, "scripts", "bench_nhwc.py"), run_name="bench_nhwc")


# LRN and 7×7/2, 5×5/2; 3×3 stacks; both end in 2×2 maps, so fc6 reads its rows in the twin's (H, W, C) order
@pytest.mark.parametrize("name, size", [("zfnet", 96), ("vgg11", 64)])
def test_nhwc_twin_gives_our_logits(name, size):
  table = networks.get_network(name, num_classes=10, width=1 / 16, towers=1, lrn_alpha_over_n=False)
  net = Network(table, weight_init="he", backend="xla")
  x = jax.random.normal(jax.random.key(1), (3, size, size, 4))
  rng = np.random.default_rng(0)
  # He-scaled weights and nonzero biases, drawn by numpy: XLA:CPU takes seconds to compile flax's initialisers.
  fan_in = lambda s: int(np.prod(s[1:-1]))  # noqa: E731  (towers, …inputs…, outputs)
  params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) * (np.sqrt(2 / fan_in(s.shape)) if s.ndim > 2 else 0.1))
                        .astype(np.float32), jax.eval_shape(net.init, jax.random.key(0), x)["params"])
  ours = jax.jit(net.apply)({"params": params}, x)
  twin_params = TWIN["nhwc_params"](table, params, size)
  twin = jax.jit(lambda p, x: TWIN["nhwc_apply"](table, p, x))(twin_params, x.transpose(3, 1, 2, 0))
  np.testing.assert_allclose(np.asarray(twin), np.asarray(ours), rtol=1e-4, atol=1e-4 * float(np.abs(ours).max()))
