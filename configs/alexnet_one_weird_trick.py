"""The paper's network placed layer by layer as in Krizhevsky's "One weird trick for parallelizing convolutional
neural networks" (2014) and cuda-convnet2's layer files: the convolutions data-parallel (every device holds every
filter and convolves its own images), the fully-connected layers model-parallel (each device a slice of every
weight matrix: where the weights are, not the maps, is what is large). On a 2-device mesh; any other needs only
--config.mesh.model (and --config.mesh.data for pairs of pairs).

What each layer moves between devices: `python scripts/comm_report.py --config configs/alexnet_one_weird_trick.py`
(on a CPU host add --config.cpu_devices=2).
"""

from alexnet_jax.config import paper_config
from alexnet_jax.network import register, with_places
from alexnet_jax.network.table import alexnet

# Layer: where its work lies (network/table.py). Pools, LRNs and dropout work where the layer before them does.
PLACES = {
    "conv1": "data", "conv2": "data", "conv3": "data", "conv4": "data", "conv5": "data",
    "fc6": "model", "fc7": "model", "fc8": "model",
}


@register("alexnet_one_weird_trick")
def placed_alexnet(**kwargs):
  return with_places(alexnet(**kwargs), PLACES)


def get_config():
  config = paper_config()
  config.network = "alexnet_one_weird_trick"
  config.strategy = "table"
  return config
