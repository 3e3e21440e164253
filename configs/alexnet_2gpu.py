"""The paper: AlexNet on ImageNet, two towers on a 2-device mesh (Krizhevsky, Sutskever & Hinton 2012).

Reads imagenet2012 prepared by `make prepare` (docs/data.md) from --config.dataset.data_dir; another dataset needs
only data settings, e.g. --config.dataset.name=folder --config.dataset.data_dir=/data/my_images.
"""

from alexnet_jax.config import paper_config


def get_config():
  return paper_config()
