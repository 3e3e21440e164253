"""The network core: layer tables (table.py), the placement plan that puts their layers on a (data, model) mesh
(placement.py), their shapes (shapes.py), the flax module that executes a plan (model.py), the mesh and the
shard_map'd forward pass (sharding.py), and weights in the PyTorch/Caffe layout (interchange.py).

A config file that brings a network of its own registers its table here: `@alexnet_jax.network.register("name")`.
"""

from alexnet_jax.network.placement import Plan, plan
from alexnet_jax.network.table import Layer, Table, get_network, register, with_places, with_strategy

__all__ = ["Layer", "Plan", "Table", "get_network", "plan", "register", "with_places", "with_strategy"]
