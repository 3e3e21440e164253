"""VGG-16 (Simonyan & Zisserman 2014, configuration D) on ImageNet: one tower, data-parallel over every device
present (the authors used four GPUs so).

Their recipe: batch 256, SGD momentum 0.9, weight decay 5e-4, learning rate 0.01 divided by 10 three times when the
validation accuracy stopped improving, 74 epochs, dropout 0.5 in fc6 and fc7, and training images rescaled to a
shorter side of 256 with random 224 crops, flips and PCA colour shifts: the data settings of the paper's config.
The drops here are fixed at epochs 30, 50 and 65 (no plateau detection). They initialised the deep nets from a
trained VGG-11, and found later that Glorot's rule trains them from scratch: this config uses it ('glorot'), which
spends its first few hundred steps near chance before it learns. He's scale, whose activations keep their size
through the 13 conv layers without normalisation, learns sooner but jumps back to chance or to NaN in bfloat16,
at lr 0.01 and within a warm-up at 0.005, under plain XLA's convolutions as under ours (docs/BENCHMARKS.md has
the runs).
"""

from alexnet_jax.config import paper_config


def get_config():
  config = paper_config()
  config.network = "vgg16"
  config.towers = 1
  config.mesh.model = 1
  config.mesh.data = -1
  config.weight_init = "glorot"
  config.batch_size = 256
  config.num_epochs = 74.0
  config.lr_drop_epochs = (30.0, 50.0, 65.0)
  return config
