"""Network in Network (Lin, Chen & Yan 2013) on ImageNet: one tower, data-parallel over every device present.

The paper gives no ImageNet recipe beyond the model; this is AlexNet's (the paper's config: batch 128, SGD momentum
0.9, weight decay 5e-4, learning rate 0.01 ÷10 at epochs 30, 60 and 80, the same data settings) with He's
initialisation: twelve layers of N(0, 0.01) weights start with logits too small to learn from.
"""

from alexnet_jax.config import paper_config


def get_config():
  config = paper_config()
  config.network = "nin"
  config.towers = 1
  config.mesh.model = 1
  config.mesh.data = -1
  config.weight_init = "he"
  return config
