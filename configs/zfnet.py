"""ZFNet (Zeiler & Fergus 2013) on ImageNet: one tower, data-parallel over every device present.

Their recipe: batch 128, SGD momentum 0.9, learning rate 0.01 annealed by hand when the validation error
plateaued, 70 epochs, N(0, 0.01) weights and zero biases, dropout 0.5 in fc6 and fc7. The annealing here is a
fixed ÷10 at epochs 30 and 50 (no plateau detection); weight decay is AlexNet's 5e-4 (theirs is not stated), and
their renormalisation of conv filters whose RMS exceeds 0.1 is left out.
"""

from alexnet_jax.config import paper_config


def get_config():
  config = paper_config()
  config.network = "zfnet"
  config.towers = 1
  config.mesh.model = 1
  config.mesh.data = -1
  config.num_epochs = 70.0
  config.lr_drop_epochs = (30.0, 50.0)
  return config
