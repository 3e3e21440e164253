"""What a run's directory says of itself: run.json, written when training starts and beside every checkpoint, holds
the resolved config, the dataset's facts (class names, pixel statistics, stored and crop sizes, source) and the
network's layer table. Evaluating, exporting, drawing and predicting read it, and need nothing but the workdir: not
the config file (nor the code that registered a network of its own), not the training data.

A reader may override keys of the run's config (--config.KEY=VALUE: the mesh, the batch, the backend, where the data
lies now), but not those that made the network and its inputs what the checkpoints hold (RUN_KEYS).
"""

import dataclasses
import json
import os

import ml_collections
import numpy as np

from alexnet_jax.config import KEYS, get, paper_config
from alexnet_jax.data.statistics import Statistics
from alexnet_jax.network.table import Layer, Table

FILE = "run.json"
VERSION = 1
LATER_KEYS = ("dataset.flip", "num_steps", "warmup_steps")  # keys that run.json files of version 1 may lack
# What a checkpoint's numbers mean: a reader that changes one of these reads another network, or other inputs.
RUN_KEYS = ("network", "width", "towers", "image_size", "lrn_alpha_over_n", "dataset.name", "dataset.resize",
            "dataset.num_classes")


@dataclasses.dataclass(frozen=True)
class Run:
  config: ml_collections.ConfigDict
  table: Table
  classes: tuple[str, ...]
  statistics: Statistics
  size: int  # S: the side of the stored images the network's crops are cut from
  num_train: int  # training examples (the schedule's epochs count them)
  source: str  # where the data came from

  @property
  def image_size(self) -> int:
    return self.config.image_size


def describe(config, dataset, table: Table) -> dict:
  """run.json's content for a run of `config` on `dataset` (data.Dataset) with the network `table`."""
  return dict(
      version=VERSION,
      config=config.to_dict(),
      dataset=dict(name=dataset.name, source=config.dataset.data_dir, classes=list(dataset.classes),
                   statistics={k: np.asarray(v).tolist() for k, v in dataclasses.asdict(dataset.statistics).items()},
                   size=dataset.size, image_size=config.image_size, num_train=dataset.num_train,
                   num_eval=dataset.num_eval),
      network=dict(towers=table.towers, layers=[dataclasses.asdict(layer) for layer in table.layers]))


def write(workdir: str, description: dict) -> None:
  """run.json in workdir, whole or not at all (a reader never sees half of it)."""
  path = os.path.join(workdir, FILE)
  with open(path + ".tmp", "w") as f:
    json.dump(description, f, indent=1)
  os.replace(path + ".tmp", path)


def read(workdir: str) -> Run:
  """The Run that workdir's run.json describes; one ValueError if there is none or it cannot be read."""
  path = os.path.join(workdir, FILE)
  if not os.path.isdir(workdir):
    raise ValueError(f"--workdir {workdir} is not a directory: pass the workdir of a training run")
  try:
    with open(path) as f:
      return from_description(json.load(f))
  except FileNotFoundError:
    raise ValueError(f"{workdir} holds no {FILE}: pass the workdir of a training run (it writes {FILE} when it "
                     "starts)") from None
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path} cannot be read ({type(e).__name__}: {e}): it is not what training wrote") from None


def from_description(d: dict) -> Run:
  if d.get("version") != VERSION:
    raise ValueError(f"version {d.get('version')!r}, this package reads {VERSION}")
  config = paper_config()
  for name in KEYS:
    *parents, leaf = name.split(".")
    node, stored = config, d["config"]
    for part in parents:
      node, stored = node[part], stored[part]
    if leaf not in stored and name in LATER_KEYS:
      continue  # a run written before the key existed ran at its paper value
    value = stored[leaf]
    node[leaf] = tuple(value) if isinstance(value, list) else value
  data, network = d["dataset"], d["network"]
  table = Table(tuple(Layer(**layer) for layer in network["layers"]), network["towers"])
  statistics = Statistics(**{k: np.asarray(v, np.float32) for k, v in data["statistics"].items()})
  return Run(config, table, tuple(data["classes"]), statistics, data["size"], data["num_train"], data["source"])


def with_overrides(run: Run, config) -> Run:
  """`run` with `config` (the run's config as a reader changed it) in place of its own; one ValueError naming a
  changed key of RUN_KEYS."""
  for name in RUN_KEYS:
    if get(config, name) != get(run.config, name):
      raise ValueError(f"config.{name}={get(config, name)!r} conflicts with the run's {get(run.config, name)!r} "
                       f"({FILE}): its checkpoints hold that network and its inputs; drop the override")
  return dataclasses.replace(run, config=config)
