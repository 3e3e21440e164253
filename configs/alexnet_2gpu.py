"""The paper: AlexNet on ImageNet, two towers on a 2-device mesh (Krizhevsky, Sutskever & Hinton 2012)."""

from alexnet_jax.config import paper_config


def get_config():
  return paper_config()
