"""Every configuration key: the paper's value, what it may be and one line of doc (KEYS), and the one check that all
configs pass through (validate).

configs/*.py start from `paper_config()` and change values. It is locked: a key that is not here is a typo, and
setting it (in a config file, in code or as --config.key) raises an error that names it and the nearest known key.
`describe(config)` lists every key with its value, what it may be and its doc (the scripts' --show_config).
"""

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

import ml_collections

DTYPES = ("float32", "bfloat16")
DECODERS = ("auto", "cpu", "gpu")
CACHES = ("none", "device", "sharded", "host", "tiered")  # where decoded training images are kept (data/cache.py)
DEVICE_CACHES = ("device", "sharded", "tiered")  # those that keep images in device memory, sized by cache_bytes
GPU_BACKENDS = ("all", "hardware")  # nvImageCodec's backends for decoder 'gpu' (data/nvdecode.py)
PARALLEL_APIS = ("shard_map", "pmap")
SCHEDULES = ("steps", "cosine")
MAX_STEPS = 2**31 - 1  # steps are int32 on the devices
CACHE_MEMORY_FRACTION = 0.95  # of a GPU's memory for JAX's pool, when the device cache takes what the step leaves


@dataclasses.dataclass(frozen=True)
class Range:
  """A number of `kind` in [low, high] (finite, for a float: NaN passes no comparison, and an infinite number of
  epochs never ends); `also`: a further value allowed, said in `note`."""

  kind: type
  low: float
  high: float
  also: Any = None
  note: str = ""

  def __contains__(self, value) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
      return False
    if self.also is not None and value == self.also:
      return True
    if self.kind is int and not isinstance(value, int):
      return False
    return math.isfinite(value) and self.low <= value <= self.high

  def __str__(self) -> str:
    if self.kind is int:
      return f"an integer in [{self.low:,}, {self.high:,}]{self.note}"
    return f"a number in [{self.low:g}, {self.high:g}]{self.note}"


@dataclasses.dataclass(frozen=True)
class Choice:
  """One of `values` (or of what `values()` returns when called: registered networks)."""

  values: tuple | Callable

  def options(self) -> tuple:
    return self.values() if callable(self.values) else self.values

  def __contains__(self, value) -> bool:
    return any(value == v and type(value) is type(v) for v in self.options())

  def __str__(self) -> str:
    return "one of " + ", ".join(map(repr, self.options()))


@dataclasses.dataclass(frozen=True)
class Epochs:
  """A tuple of epochs, each a number in [0, high]."""

  high: float

  def __contains__(self, value) -> bool:
    return isinstance(value, tuple | list) and all(e in Range(float, 0, self.high) for e in value)

  def __str__(self) -> str:
    return f"a tuple of epochs in [0, {self.high:g}]"


class Text:
  """Any string."""

  def __contains__(self, value) -> bool:
    return isinstance(value, str)

  def __str__(self) -> str:
    return "a string"


def _networks() -> tuple:
  from alexnet_jax.network import table  # noqa: PLC0415  (configs import this module before jax is set up)

  return table.names()


def _backends() -> tuple:
  from alexnet_jax.ops.backend import BACKENDS  # noqa: PLC0415

  return BACKENDS


def _inits() -> tuple:
  from alexnet_jax.network.table import INITS  # noqa: PLC0415

  return INITS


def _strategies() -> tuple:
  from alexnet_jax.network.table import STRATEGIES  # noqa: PLC0415

  return (*STRATEGIES, "table")


BOOL, COUNT = Choice((False, True)), Range(int, 1, 2**20)
NATURAL = Range(int, 0, 2**31 - 1)


@dataclasses.dataclass(frozen=True)
class Key:
  value: Any  # the paper's
  allowed: Any  # what `in` tests the value against, and says in words
  doc: str


KEYS = {
    "seed": Key(0, NATURAL, "the initial weights', dropout's and data order's seed"),
    "network": Key("alexnet", Choice(_networks), "a layer table registered in network/table.py, or by the config "
                   "file itself (alexnet_jax.network.register)"),
    "width": Key(1.0, Range(float, 1e-3, 64), "scales every hidden layer's filters and features"),
    "towers": Key(2, Range(int, 1, 64), "the towers every weighted layer is split over (the paper's two GPUs)"),
    "image_size": Key(224, Range(int, 8, 4096), "the crop the network sees, cut from the stored images"),
    "weight_init": Key("paper", Choice(_inits), "'paper': N(0, 0.01) and the table's biases; 'he': "
                       "N(0, 2/fan-in), zero biases (trains small nets); 'glorot': N(0, 2/(fan-in + fan-out)), zero "
                       "biases (deep nets without normalisation: VGG)"),
    "init_from": Key("", Text(), "a weights file in the PyTorch/Caffe layout (.npz or .pt) to start from; fc8 is "
                     "made anew where the classes differ ('': none)"),
    "lrn_alpha_over_n": Key(False, BOOL, "LRN's α divided by its window, as Caffe's and cuda-convnet's code (the "
                            "paper's formula: False)"),
    "dtype": Key("float32", Choice(DTYPES), "the compute dtype; parameters stay float32"),
    "kernel_backend": Key("auto", Choice(_backends), "'auto': the Triton kernels on CUDA, but each convolution "
                          "direction cuDNN's where measured faster (ops/conv_choice.py), XLA elsewhere; 'triton' "
                          "(every kernel), 'xla', or 'interpret' (the kernels on the CPU, slow)"),
    "mesh.model": Key(2, Range(int, 1, 4096), "devices on the mesh axis 'model' (the towers, fc slices)"),
    "mesh.data": Key(1, Range(int, 1, 65536, also=-1, note=", or -1: every other device"),
                     "devices on the mesh axis 'data' (splits the batch)"),
    "strategy": Key("tower", Choice(_strategies), "where each layer's work lies: the "
                    "paper's towers, data parallelism, the hybrid (convs data, fc layers model), or each layer's "
                    "own place"),
    "gather_input": Key(False, BOOL, "each device gets only its own rows and the step gathers the crops over "
                        "'model' (False: the rows its first layer reads, as the paper's GPUs did)"),
    "parallel_api": Key("shard_map", Choice(PARALLEL_APIS), "how the step is written: shard_map (every strategy) "
                        "or pmap (strategy 'data' only)"),
    "cpu_devices": Key(0, Range(int, 0, 1024), "simulate this many CPU devices over all processes of a run (0: "
                       "what JAX finds)"),
    "distributed.coordinator": Key("", Text(), "process 0's host:port in a run of several processes (unset: "
                                   "JAX_COORDINATOR_ADDRESS)"),
    "distributed.num_processes": Key(0, Range(int, 0, 65536), "processes of the run (unset: JAX_NUM_PROCESSES)"),
    "distributed.process_id": Key(-1, Range(int, -1, 65535, note=" (-1: unset, JAX_PROCESS_ID)"),
                                  "this process's id"),
    "distributed.detect": Key(False, BOOL, "let JAX find the processes (Slurm, Open MPI, Cloud TPU)"),
    "dataset.name": Key("imagenet2012", Text(), "a tfds name prepared in data_dir, 'folder' (data_dir/<split>/"
                        "<class>/*.jpg), 'store' (what make prepare wrote) or 'procedural' (built in)"),
    "dataset.data_dir": Key("", Text(), "where the dataset lies"),
    "dataset.train_split": Key("train", Text(), "the training split's name"),
    "dataset.eval_split": Key("validation", Text(), "the evaluation split's name"),
    "dataset.num_classes": Key(0, Range(int, 0, 10**6), "classes (0: the dataset's)"),
    "dataset.num_train_examples": Key(0, NATURAL, "training examples used (0: all)"),
    "dataset.num_eval_examples": Key(0, NATURAL, "evaluation examples used (0: all)"),
    "dataset.resize": Key(256, Range(int, 8, 4096), "S: images stored at shorter side S, central S×S"),
    "dataset.pca_sigma": Key(0.1, Range(float, 0, 10), "the paper's PCA colour noise"),
    "dataset.flip": Key(True, BOOL, "mirror training crops at random, as the paper (False for classes that a mirror "
                        "changes: text, digits, left and right); multi-crop evaluation mirrors only if it is on"),
    "dataset.threads": Key(4, Range(int, 1, 1024), "threads reading and decoding each batch"),
    "dataset.workers": Key(-1, Range(int, 0, 1024, also=-1, note=", or -1: none on CPU, else one per 2 cores"),
                           "worker processes reading batches"),
    "dataset.decoder": Key("auto", Choice(DECODERS), "who decodes training images: the host ('cpu'), the devices "
                           "('gpu', nvImageCodec), or 'auto' (the host today)"),
    "dataset.host_share": Key(0.0, Range(float, 0, 1), "with decoder 'gpu': the share of each batch the host "
                              "decodes beside the devices"),
    "dataset.gpu_backends": Key("all", Choice(GPU_BACKENDS), "with decoder 'gpu': nvImageCodec's backends"),
    "dataset.cache": Key("none", Choice(CACHES), "'device': each training image decoded once per run, kept in "
                         "device memory and read there in later epochs; 'sharded': the same, the devices that split "
                         "the batch's rows each holding a block of the images (as many times more in all), the "
                         "batch's cached rows exchanged between them each step; 'host': kept in the host's memory "
                         "and copied with each batch; 'tiered': the first images as 'sharded', the next as 'host', "
                         "the rest decoded every epoch; 'none': decoded every epoch"),
    "dataset.cache_bytes": Key(0, Range(int, 0, 2**60), "with cache 'device', 'sharded' or 'tiered': the bytes the "
                               "images may take on each device (0: what the step leaves free)"),
    "dataset.host_cache_bytes": Key(0, Range(int, 0, 2**60), "with cache 'host' or 'tiered': the bytes the images "
                                    "may take in each process (0: 3/4 of the host's available memory)"),
    "dataset.fast_decode": Key(False, BOOL, "libjpeg-turbo's fast DCT and upsampling (pixels off by ≤ 45)"),
    "batch_size": Key(128, COUNT, "the global training batch"),
    "eval_batch_size": Key(128, COUNT, "the global evaluation batch"),
    "learning_rate": Key(0.01, Range(float, 1e-12, 1e6), "the initial learning rate"),
    "lr_schedule": Key("steps", Choice(SCHEDULES), "'steps': ÷10 at each of lr_drop_epochs (the paper); 'cosine': "
                       "cosine decay to 0 over the run"),
    "lr_drop_epochs": Key((30.0, 60.0, 80.0), Epochs(10**6), "epochs after which the learning rate is divided by 10"),
    "warmup_epochs": Key(0.0, Range(float, 0, 10**6), "linear warm-up from 0 over these epochs (0: none, as the "
                         "paper)"),
    "warmup_steps": Key(0, NATURAL, "linear warm-up over these steps, in place of warmup_epochs (0: warmup_epochs "
                        "decides)"),
    "momentum": Key(0.9, Range(float, 0, 0.999999), "SGD momentum"),
    "weight_decay": Key(5e-4, Range(float, 0, 1), "added to the gradient before momentum, as the paper's rule"),
    "label_smoothing": Key(0.0, Range(float, 0, 0.999999), "the targets' share spread over every class (0: none, "
                           "as the paper)"),
    "num_epochs": Key(90.0, Range(float, 1e-6, 10**6), "epochs to train"),
    "num_steps": Key(0, NATURAL, "steps to train, in place of num_epochs: a run's length whatever the dataset's size "
                     "(0: num_epochs decides)"),
    "log_every_steps": Key(100, Range(int, 1, MAX_STEPS), "steps between training-metric lines"),
    "eval_every_steps": Key(5000, Range(int, 1, MAX_STEPS), "steps between evaluations"),
    "checkpoint_every_steps": Key(1000, Range(int, 1, MAX_STEPS), "steps between checkpoints"),
    "checkpoints_to_keep": Key(3, Range(int, 1, 10**4), "the newest checkpoints kept"),
}


def paper_config() -> ml_collections.ConfigDict:
  """Every key at the paper's value (KEYS); locked."""
  c = ml_collections.ConfigDict()
  for name, key in KEYS.items():
    *parents, leaf = name.split(".")
    node = c
    for parent in parents:
      if parent not in node:
        node[parent] = ml_collections.ConfigDict()
      node = node[parent]
    node[leaf] = key.value
  c.lock()  # recursive: the nested dicts refuse new keys too
  return c


def get(config, name: str):
  """config's value of a dotted key."""
  value = config
  for part in name.split("."):
    value = value[part]
  return value


def describe(config) -> str:
  """Every key: its value in `config`, what it may be, and its doc."""
  width = max(map(len, KEYS))
  return "\n".join(f"{name:{width}} = {get(config, name)!r}\n{'':{width}}   {key.allowed}: {key.doc}"
                   for name, key in KEYS.items())


def apply_process_settings(config: ml_collections.ConfigDict) -> None:
  """Sets what a config fixes for the whole process, so a script calls it before its first JAX call: if
  config.cpu_devices > 0, how many CPU devices JAX simulates; with a device cache that takes what the step leaves,
  JAX's share of GPU memory (CACHE_MEMORY_FRACTION, unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise)."""
  import jax  # noqa: PLC0415  (configs import this module before jax is set up)

  validate_key(config, "cpu_devices")  # before JAX makes that many
  if config.cpu_devices:  # must precede the first use of a JAX backend
    jax.config.update("jax_num_cpu_devices", config.cpu_devices)
  if config.cpu_devices > 1:
    os.environ.setdefault("NPROC", str(cpu_threads(config.cpu_devices)))
  if config.dataset.cache in DEVICE_CACHES and not config.dataset.cache_bytes:
    # The cache takes what JAX's memory pool leaves beside the step, and the pool is 75 % of a GPU by default.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", str(CACHE_MEMORY_FRACTION))


def cpu_threads(devices: int) -> int:
  """The threads of XLA:CPU's pool (which it reads from NPROC, else one per core) for `devices` simulated devices.
  Each device's program waits for the others in a pool thread at every collective, and the steps queued ahead run
  in the pool too: with a thread per core on two cores, both threads could wait in one device's collectives while
  the other device's part had no thread to run in, and XLA ended the process after 40 s. Waiting threads take no
  core, so a few per device cost nothing."""
  return max(os.cpu_count() or 1, 4 * devices)


def validate_key(config, name: str) -> None:
  value, allowed = get(config, name), KEYS[name].allowed
  if value not in allowed:
    raise ValueError(f"config.{name} must be {allowed}, got {value!r}")


def validate(config: ml_collections.ConfigDict, table=None) -> ml_collections.ConfigDict:
  """Raises one ValueError naming the first value not allowed (unknown keys never get in: the config is locked).
  `table`: the network itself (a run's, from its run.json), which config.network then need not name among the
  networks registered in this process (one registered by the run's config file)."""
  for name in KEYS:
    if name != "network" or table is None:
      validate_key(config, name)
  if config.parallel_api == "pmap" and config.strategy != "data":
    raise ValueError(f"config.parallel_api='pmap' is data parallelism: it needs config.strategy='data', got "
                     f"{config.strategy!r}")
  data, model = config.mesh.data, config.mesh.model
  if config.strategy == "tower" and config.towers % model:
    raise ValueError(f"config.mesh.model={model} must divide config.towers={config.towers}")
  if data != -1 and (config.batch_size % data or config.eval_batch_size % data):
    raise ValueError(f"config.batch_size and eval_batch_size must be divisible by config.mesh.data={data}")
  _check_cache(config.dataset)
  _check_image_size(config, table)
  return config


def _check_cache(dataset) -> None:
  """One line for a cache that cannot keep what the run decodes, or a size given to a cache it does not size."""
  if dataset.cache != "none" and dataset.decoder == "gpu":
    raise ValueError(f"config.dataset.cache={dataset.cache!r} keeps images the host decoded: it needs "
                     "config.dataset.decoder 'cpu' or 'auto', got 'gpu'")
  if dataset.cache == "host" and dataset.cache_bytes:  # once the host cache's size: it would be ignored silently
    raise ValueError("config.dataset.cache_bytes sizes the devices' caches: size cache 'host' with "
                     "config.dataset.host_cache_bytes")


def network_table(config, num_classes: int):
  """The layer table that config.network names, for `num_classes` classes, at the config's width, towers and LRN."""
  from alexnet_jax.network.table import get_network  # noqa: PLC0415

  return get_network(config.network, num_classes=num_classes, width=config.width, towers=config.towers,
                     lrn_alpha_over_n=config.lrn_alpha_over_n)


def _check_image_size(config, table=None) -> None:
  """One line for an image too small for the network's windows, before any data is read at that size."""
  from alexnet_jax.network.shapes import layer_shapes  # noqa: PLC0415

  table = table or network_table(config, max(2, config.dataset.num_classes))
  try:
    layer_shapes(table, config.image_size)
  except ValueError as e:
    raise ValueError(f"config.image_size={config.image_size} is too small for network {config.network!r}: {e}") \
        from None
