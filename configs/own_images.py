"""Your own images: a store that `make prepare ARGS='--name=folder …'` wrote from a folder of a few classes and a few
dozen to a few thousand images, trained on two simulated CPU devices (or two GPUs) to a model worth using.

The paper's topology at a quarter of its width on 112×112 crops of 128×128 stored images, so that it learns on two
CPU cores in minutes. Its length is counted in steps, not epochs: a folder of 120 images is 4 batches an epoch, and
the paper's 90 epochs would be 360 steps of nothing much. He initialisation, a short warm-up and a cosine decay let
it learn from the first steps, where the paper's N(0, 0.01) and constant rate can sit at chance on small sets. Crops
are mirrored, as the paper's; set --config.dataset.flip=False where a mirror changes the class (text, digits, left
and right). `prepare` prints the command with the store's splits.
"""

from alexnet_jax.config import paper_config


def get_config():
  config = paper_config()
  config.cpu_devices = 2
  config.width = 0.25
  config.image_size = 112
  config.weight_init = "he"
  config.dataset.name = "store"
  config.dataset.resize = 128
  config.dataset.eval_split = "val"
  config.dataset.num_classes = 0
  config.batch_size = 32
  config.eval_batch_size = 50
  config.learning_rate = 0.01
  config.lr_schedule = "cosine"
  config.num_steps = 600
  config.warmup_steps = 30
  config.label_smoothing = 0.1
  config.log_every_steps = 20
  config.eval_every_steps = 200
  config.checkpoint_every_steps = 200
  return config
