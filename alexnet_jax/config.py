"""Every configuration key with the paper's value, and the one check that all configs pass through.

configs/*.py start from `paper_config()` and change values. It is locked: a key that is not here is a typo, and
setting it (in a config file, in code or as --config.key) raises an error that names it and the nearest known key.
"""

import math

import ml_collections

DTYPES = ("float32", "bfloat16")
DECODERS = ("auto", "cpu", "gpu")
GPU_BACKENDS = ("all", "hardware")  # nvImageCodec's backends for decoder 'gpu' (data/nvdecode.py)
PARALLEL_APIS = ("shard_map", "pmap")


def paper_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # The network: a name registered in network/table.py, or by the config file itself (alexnet_jax.network.register),
  # and its towers.
  c.network = "alexnet"
  c.width = 1.0  # scales every hidden layer
  c.towers = 2
  c.image_size = 224
  c.weight_init = "paper"  # N(0, 0.01); 'he' scales by fan-in
  c.lrn_alpha_over_n = False  # the paper's formula; True gives Caffe's and cuda-convnet's α/n
  c.dtype = "float32"  # compute dtype; 'bfloat16' keeps float32 parameters
  c.kernel_backend = "auto"
  c.mesh = ml_collections.ConfigDict(dict(model=2, data=1))  # data=-1: every other device
  # Where each layer's work lies on the mesh (network/table.py, placement.py): 'tower' (the paper: towers over
  # mesh.model), 'data' (every weight on every device, the batch over all), 'hybrid' (convolutions 'data', fc layers
  # split over mesh.model: Krizhevsky 2014) or 'table' (each layer's own `place`).
  c.strategy = "tower"
  # False: the host gives each device the rows its first layer reads (the paper: each GPU the whole batch), so the
  # step moves nothing between devices but at conv3 and fc6–fc8. True: each device only its own rows, and the step
  # gathers the uint8 crops over mesh.model (half the host's bytes per device; decoder 'gpu' always does this).
  c.gather_input = False
  # How the train step is written: 'shard_map' (every strategy), or 'pmap' (jax.pmap and lax.pmean, training/pmap.py:
  # strategy 'data' only, for those who study pmap).
  c.parallel_api = "shard_map"
  c.cpu_devices = 0  # > 0: simulate this many CPU devices (the demo's two "GPUs"), over all processes of a run
  # Several processes (distributed.py, README Multi-host): process 0's host:port, the number of processes and this
  # one's id (unset: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID), or detect=True under Slurm, Open
  # MPI or on Cloud TPU.
  c.distributed = ml_collections.ConfigDict(dict(coordinator="", num_processes=0, process_id=-1, detect=False))
  # Data (data/pipeline.py): a tfds name prepared as array_record in data_dir (scripts/prepare_data.py), 'folder'
  # (data_dir/<split>/<class>/*.jpg), 'store' (the S×S JPEG store `make prepare … --store=data_dir` wrote) or
  # 'procedural'. Zeros mean "what the data has".
  c.dataset = ml_collections.ConfigDict(dict(
      name="imagenet2012", data_dir="", train_split="train", eval_split="validation", num_classes=0,
      num_train_examples=0, num_eval_examples=0,
      resize=256,  # S: images stored at shorter side S, central S×S; the device crops image_size (227: Caffe's)
      pca_sigma=0.1,  # "fancy PCA" colour noise; ImageNet's basis for imagenet2012, else computed from the data
      # Each batch is read (and decoded, on the host) by `threads` threads, in this process or in each of
      # `workers` worker processes (0: none; -1: none on CPU, where XLA needs the cores, else one per 2 cores:
      # one process stalls on the GIL; training/loop.input_workers has the measurements).
      threads=4, workers=-1,
      # Who decodes training images: 'cpu' (the host, decode.py), 'gpu' (each device its rows, with nvImageCodec in
      # a process per device: nvdecode.py; on CPU devices its libjpeg-turbo backend) or 'auto', the faster where
      # both can: 'cpu' today (pipeline._decoder has the measurements). With 'gpu', host_share of each batch is
      # decoded by the host beside the devices; gpu_backends: nvImageCodec's choice among its backends ('all':
      # the GPU's hardware JPEG engines for part of a batch, its CPU-assisted hybrid backend for the rest) or
      # 'hardware' (the engines for all, the others for what they fail): the hybrid's CPU threads compete with
      # the host's decoding.
      decoder="auto", host_share=0.0, gpu_backends="all",
      fast_decode=False))  # libjpeg-turbo's fast DCT and upsampling: ≤ 6 % faster, pixels off by ≤ 45 (decode.py)
  # Optimisation: SGD, momentum 0.9, weight decay 5e-4, lr 0.01 divided by 10 three times over ~90 epochs.
  c.batch_size = 128
  c.eval_batch_size = 128
  c.learning_rate = 0.01
  c.momentum = 0.9
  c.weight_decay = 5e-4
  c.num_epochs = 90.0
  c.lr_drop_epochs = (30.0, 60.0, 80.0)
  # Bookkeeping.
  c.log_every_steps = 100
  c.eval_every_steps = 5000
  c.checkpoint_every_steps = 1000
  c.checkpoints_to_keep = 3
  c.lock()  # recursive: the nested dicts refuse new keys too
  return c


def apply_process_settings(config: ml_collections.ConfigDict) -> None:
  """Sets what a config fixes for the whole process, so a script calls it before its first JAX call: absl's log
  verbosity (WARNING) and, if config.cpu_devices > 0, how many CPU devices JAX simulates."""
  import jax  # noqa: PLC0415  (configs import this module before jax is set up)
  from absl import logging  # noqa: PLC0415

  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO; the progress bar says enough
  if config.cpu_devices:  # must precede the first use of a JAX backend
    jax.config.update("jax_num_cpu_devices", config.cpu_devices)


def _choices(config, key, allowed):
  if config[key] not in allowed:
    raise ValueError(f"config.{key}={config[key]!r} is not one of {', '.join(map(repr, allowed))}")


# Every numeric key, its type and its range, in words and as a test. Floats must be finite too: NaN passes no
# comparison (so `nan <= 0` lets it through), and an infinite number of epochs never ends.
_POSITIVE, _NATURAL, _COUNT = ("> 0", lambda v: v > 0), ("≥ 0", lambda v: v >= 0), ("≥ 1", lambda v: v >= 1)
RANGES = (
    ("seed", int, *_NATURAL), ("width", float, *_POSITIVE), ("towers", int, *_COUNT), ("image_size", int, *_COUNT),
    ("mesh.model", int, *_COUNT),
    ("mesh.data", int, "≥ 1, or -1 for every other device", lambda v: v >= 1 or v == -1),
    ("cpu_devices", int, *_NATURAL), ("distributed.num_processes", int, *_NATURAL),
    ("distributed.process_id", int, "≥ -1 (-1: unset)", lambda v: v >= -1), ("dataset.num_classes", int, *_NATURAL),
    ("dataset.num_train_examples", int, *_NATURAL), ("dataset.num_eval_examples", int, *_NATURAL),
    ("dataset.resize", int, *_COUNT), ("dataset.pca_sigma", float, *_NATURAL), ("dataset.threads", int, *_COUNT),
    ("dataset.workers", int, "≥ -1 (-1: automatic)", lambda v: v >= -1),
    ("dataset.host_share", float, "in [0, 1]", lambda v: 0 <= v <= 1), ("batch_size", int, *_COUNT),
    ("eval_batch_size", int, *_COUNT), ("learning_rate", float, *_POSITIVE),
    ("momentum", float, "in [0, 1)", lambda v: 0 <= v < 1), ("weight_decay", float, *_NATURAL),
    ("num_epochs", float, *_POSITIVE), ("log_every_steps", int, *_COUNT), ("eval_every_steps", int, *_COUNT),
    ("checkpoint_every_steps", int, *_COUNT), ("checkpoints_to_keep", int, *_COUNT),
)


def _is_number(value, kind) -> bool:
  if isinstance(value, bool) or not isinstance(value, int | float):
    return False
  return isinstance(value, int) if kind is int else math.isfinite(value)


def _check_range(config, key: str, kind, rule: str, inside) -> None:
  value = config
  for part in key.split("."):
    value = value[part]
  if not (_is_number(value, kind) and inside(value)):
    raise ValueError(f"config.{key} must be {'an integer' if kind is int else 'a finite number'} {rule}, "
                     f"got {value!r}")


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Raises one ValueError naming the first value out of range (unknown keys never get in: the config is locked)."""
  from alexnet_jax import ops  # noqa: PLC0415  (configs import this module before jax is set up)
  from alexnet_jax.network import table  # noqa: PLC0415  (configs import this module before jax is set up)
  from alexnet_jax.network.table import INITS  # noqa: PLC0415

  _choices(config, "network", table.names())
  _choices(config, "weight_init", INITS)
  _choices(config, "dtype", DTYPES)
  _choices(config, "kernel_backend", ops.BACKENDS)
  for key, allowed in (("decoder", DECODERS), ("gpu_backends", GPU_BACKENDS)):
    if config.dataset[key] not in allowed:
      raise ValueError(f"config.dataset.{key}={config.dataset[key]!r} is not one of "
                       f"{', '.join(map(repr, allowed))}")
  for key, kind, rule, inside in RANGES:
    _check_range(config, key, kind, rule, inside)
  drops = config.lr_drop_epochs
  if not isinstance(drops, tuple | list) or not all(_is_number(e, False) and e >= 0 for e in drops):
    raise ValueError(f"config.lr_drop_epochs must be a tuple of epochs (finite numbers ≥ 0), got {drops!r}")
  _choices(config, "strategy", (*table.STRATEGIES, "table"))
  _choices(config, "parallel_api", PARALLEL_APIS)
  _choices(config, "gather_input", (False, True))
  if config.parallel_api == "pmap" and config.strategy != "data":
    raise ValueError(f"config.parallel_api='pmap' is data parallelism: it needs config.strategy='data', got "
                     f"{config.strategy!r}")
  data, model = config.mesh.data, config.mesh.model
  if config.strategy == "tower" and config.towers % model:
    raise ValueError(f"config.mesh.model={model} must divide config.towers={config.towers}")
  if data != -1 and (config.batch_size % data or config.eval_batch_size % data):
    raise ValueError(f"config.batch_size and eval_batch_size must be divisible by config.mesh.data={data}")
  return config
