"""`make train`: the paper's two-tower split on two simulated CPU devices, on the built-in procedural dataset.

The topology is the paper's (5 conv with LRN and overlapping pools, 3 fc with dropout, conv3 and fc6–fc8 reading
across towers); it is narrower (width 1/4), sees 112×112 images and uses He initialisation, so that it learns in a
few minutes on two CPU cores.
"""

from alexnet_jax.config import paper_config


def get_config():
  config = paper_config()
  config.cpu_devices = 2
  config.width = 0.25
  config.image_size = 112
  config.weight_init = "he"
  config.dataset.name = "procedural"
  config.dataset.num_classes = 10
  config.dataset.num_train_examples = 20_000
  config.dataset.num_eval_examples = 1_000
  config.batch_size = 64
  config.eval_batch_size = 100
  config.learning_rate = 0.01
  config.num_epochs = 2.0
  config.lr_drop_epochs = (1.5,)
  config.log_every_steps = 20
  config.eval_every_steps = 300
  config.checkpoint_every_steps = 200
  return config
