"""The package from Python: configs by name, training, and a trained run you can classify images with.

  import alexnet_jax
  config = alexnet_jax.get_config("demo")           # configs/demo.py
  alexnet_jax.train(config, "runs/demo")            # as scripts/train.py does
  model = alexnet_jax.load("runs/demo")             # the run's newest checkpoint, on one device
  model.classes                                     # the class names, by label
  model.predict(images)                             # (N, classes) probabilities of uint8 images (N, H, W, 3)
  model.top(images, k=5)                            # [[(class, probability), …] per image]
  model.evaluate(crops=10)                          # top-1, top-5 and loss on the run's evaluation split

`load` needs nothing but the run's directory (its run.json and checkpoints); images of any size are resized to the
run's stored side S (shorter side S, the central S×S, as training stored them) and centre-cropped (or 10-cropped)
on the device.
"""

import functools
import importlib
import importlib.resources

import jax
import ml_collections
import numpy as np

from alexnet_jax.config import apply_process_settings
from alexnet_jax.data import augment, get_dataset, sources
from alexnet_jax.training import loop, run
from alexnet_jax.training.train import class_log_probs, eval_step


def config_names() -> tuple[str, ...]:
  files = importlib.resources.files("alexnet_jax.configs").iterdir()
  return tuple(sorted(f.name[:-3] for f in files if f.name.endswith(".py") and not f.name.startswith("_")))


def get_config(name: str) -> ml_collections.ConfigDict:
  """The config of configs/<name>.py (e.g. 'demo', 'alexnet_2gpu'; installed as alexnet_jax.configs), as
  --config configs/<name>.py gives it."""
  if name not in config_names():
    raise ValueError(f"no config {name!r}; the configs are {', '.join(config_names())}")
  return importlib.import_module(f"alexnet_jax.configs.{name}").get_config()


def train(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains `config` in `workdir` (resuming what is there), as scripts/train.py; returns the final eval metrics.
  config.cpu_devices (the simulated CPU devices) takes effect only before JAX's first computation in the process:
  after it, the devices JAX made are used."""
  try:
    apply_process_settings(config)
  except RuntimeError:  # JAX has computed already: its devices stay
    pass
  return loop.train_and_evaluate(config, workdir)


def load(workdir: str, **overrides) -> "Model":
  """The newest checkpoint of the run in `workdir`, on one device; `overrides` set keys of its config (e.g.
  kernel_backend='xla', eval_batch_size=64; 'dataset.data_dir' as dataset={'data_dir': …})."""
  return Model(workdir, overrides)


def stored(images, size: int) -> np.ndarray:
  """Images (Model.stored) as (N, size, size, 3) uint8, each at shorter side `size`, its central size×size."""
  out = []
  for image in images:
    image = sources.decode(image, size) if isinstance(image, str) else sources.as_rgb(sources.to_uint8(image))
    out.append(image if image.shape[:2] == (size, size) else augment.resize_center_crop(image, size))
  return np.stack(out) if out else np.zeros((0, size, size, 3), np.uint8)


class Model:
  """A trained run: its classes, and its network's predictions on images."""

  def __init__(self, workdir: str, overrides: dict):
    config = run.read(workdir).config
    config.mesh.model, config.mesh.data = 1, 1
    config.update(overrides)
    self.run, self.setup, self.state = loop.restore_newest(workdir, config)
    self.workdir = workdir
    self._scores = jax.jit(lambda params, images, crops: class_log_probs(self.setup, params, images, crops),
                           static_argnums=2)

  @property
  def classes(self) -> tuple[str, ...]:
    return self.run.classes

  @property
  def step(self) -> int:
    return int(self.state.step)

  def stored(self, images) -> np.ndarray:
    """Images — uint8 (N, H, W, 3), or a sequence of image arrays (8 or 16 bits, grey or colour, any size) or of
    image files' paths — as training stored them: (N, S, S, 3), each resized to shorter side S and cut to its
    central S×S."""
    return stored(images, self.run.size)

  def predict(self, images, crops: int = 1) -> np.ndarray:
    """Class probabilities (N, classes) of images (see `stored`), of their centre crops or the mean of 10 crops."""
    stored, batch = self.stored(images), self.run.config.eval_batch_size
    out = []
    for start in range(0, len(stored), batch):  # whole batches: one compiled program
      chunk = stored[start:start + batch]
      padded = np.concatenate([chunk, np.repeat(chunk[-1:], batch - len(chunk), 0)])
      out.append(np.exp(np.asarray(self._scores(self.state.params, padded, crops)))[:len(chunk)])
    return np.concatenate(out) if out else np.zeros((0, len(self.classes)), np.float32)

  def top(self, images, k: int = 5, crops: int = 1) -> list[list[tuple[str, float]]]:
    """The k likeliest classes of each image, with their probabilities."""
    probs = self.predict(images, crops)
    return [[(self.classes[c], float(p[c])) for c in np.argsort(-p, kind="stable")[:k]] for p in probs]

  def evaluate(self, crops: int = 1) -> dict:
    """Top-1, top-5, loss and count on the run's evaluation split (config.dataset.data_dir, where it lies now, may
    be given to load)."""
    config = self.run.config
    dataset = get_dataset(config, statistics=self.run.statistics)
    p_eval_step = jax.jit(functools.partial(eval_step, setup=self.setup), static_argnames="crops")
    return loop.evaluate(self.state, dataset, config, p_eval_step, self.setup.batch_rows, crops)
