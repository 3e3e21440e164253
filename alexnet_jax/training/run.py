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
# keys that older run.json files may lack
LATER_KEYS = ("dataset.flip", "num_steps", "warmup_steps", "dataset.host_cache_bytes")
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
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"{path} cannot be read ({type(e).__name__}: {e}): it is not what training wrote") from None


def from_description(d: dict) -> Run:
  if not isinstance(d, dict):
    raise ValueError(f"it holds a JSON {type(d).__name__}, not the object training writes")
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
  classes = _classes(data["classes"], table.weighted()[-1].filters)
  _check_statistics(statistics)
  return Run(config, table, classes, statistics, data["size"], data["num_train"], data["source"])


def _classes(classes, outputs: int) -> tuple[str, ...]:
  """The class names, one per output of the network's last layer."""
  if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
    raise ValueError(f"dataset.classes is {type(classes).__name__} {str(classes)[:60]!r}, not a list of names")
  if len(classes) != outputs or len(set(classes)) != len(classes):
    raise ValueError(f"dataset.classes names {len(classes)} classes ({len(set(classes))} different) for the "
                     f"{outputs} outputs of the network")
  return tuple(classes)


def _check_statistics(statistics: Statistics) -> None:
  """Pixel statistics that normalise to finite numbers: 3 channels, std above 0."""
  shapes = dict(mean=(3,), std=(3,), eigval=(3,), eigvec=(3, 3))
  for name, shape in shapes.items():
    value = getattr(statistics, name)
    if value.shape != shape or not np.isfinite(value).all():
      raise ValueError(f"dataset.statistics.{name} is {value.tolist()}: {'×'.join(map(str, shape))} finite numbers "
                       "expected")
  if not (statistics.std > 0).all():
    raise ValueError(f"dataset.statistics.std is {statistics.std.tolist()}: the images are divided by it, so each "
                     "must be above 0")


def with_overrides(run: Run, config) -> Run:
  """`run` with `config` (the run's config as a reader changed it) in place of its own; one ValueError naming a
  changed key of RUN_KEYS."""
  for name in RUN_KEYS:
    if get(config, name) != get(run.config, name):
      raise ValueError(f"config.{name}={get(config, name)!r} conflicts with the run's {get(run.config, name)!r} "
                       f"({FILE}): its checkpoints hold that network and its inputs; drop the override")
  return dataclasses.replace(run, config=config)
