"""The paper's network on one device: both towers run side by side as grouped convolutions, same numbers."""

from alexnet_jax.config import paper_config


def get_config():
  config = paper_config()
  config.mesh.model = 1
  return config
