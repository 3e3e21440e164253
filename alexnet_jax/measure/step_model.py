"""A step-time model: the train step's time of a layer table under a placement on N GPUs, from measured parts.

Compute comes from per-layer kernel times measured on one H200 (docs/results/profile_*one_h200_*_b*.json, written by
scripts/dev/profile_step.py for `triton:one`: all towers on one GPU as grouped convolutions, bf16; PROFILES names each
network's files, and a table is matched to a network by its layers' shapes), interpolated
log-log in the batch a device runs, times the share of the layer's work a device does under the placement plan
(network/placement.py): a tower-split layer its towers' share, a 'data' layer its rows of the batch, a 'model' fc
layer its slice of the outputs; the update in proportion to the parameters a device holds. Collectives are the
plan's bytes (`Plan.traffic`) under NCCL's ring costs on a link (NVLink within a host, a network between hosts).
Activation collectives lie on the critical path; weight-gradient all-reduces may hide behind the backward pass
(`overlap`, the share of them XLA's asynchronous collectives hide). docs/step_model.md says what it assumes and how
close it comes to every measured step.
"""

import dataclasses
import functools
import glob
import itertools
import json
import math
import os

from alexnet_jax.network.layers import kind_of
from alexnet_jax.network.placement import SLICES, TOWERS, WHOLE, Plan, plan
from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.network.table import STRATEGIES, Table, with_places

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                       "results")
# Each profiled network: its builder's name and arguments, and its profiles' file pattern in docs/results.
PROFILES = {
    "alexnet": (dict(towers=2), "profile_one_h200_2026-12-03_b*.json"),
    "vgg16": (dict(towers=1), "profile_vgg16_one_h200_2026-12-03_b*.json"),
}
PROFILE_IMAGE_SIZE = 224  # the profiles' crops
ACTIVATION_BYTES = 2  # bf16, the profiles' compute dtype
H200_MEMORY = 141e9  # bytes of HBM3e per H200
# Held per parameter: float32 value, gradient and momentum, and the bf16 copy the update writes for the next step.
BYTES_PER_PARAMETER = 4 + 4 + 4 + 2
CROP_BYTES = 3 * 224 * 224 + 16  # a uint8 crop and its label, flip and colour shift, as gather_input moves them
# Fitted on FIT's rows (docs/step_model.md): the share of the gradient all-reduces hidden behind the backward pass,
# and what each collective costs the step beyond NCCL's ring (its launch, the devices meeting, the program split
# around it).
OVERLAP = 0.45
COLLECTIVE_US = 50.0


@dataclasses.dataclass(frozen=True)
class Link:
  """A link as NCCL sees it: its bus bandwidth (GB/s a GPU moves in a ring, `busbw` of nccl-tests) and the
  latency of one ring step (µs)."""

  name: str
  busbw_gbs: float
  latency_us: float
  source: str

  def ms(self, size: float, steps: int, factor: float) -> float:
    """factor·size bytes at busbw plus `steps` ring steps of latency, in ms."""
    return factor * size / (self.busbw_gbs * 1e6) + steps * self.latency_us * 1e-3


LINKS = {
    "nvlink4": Link("nvlink4", 370.0, 3.0, "H100/H200 NVLink 4: 450 GB/s a direction per GPU line rate; NCCL's ring "
                    "reaches ~370 GB/s busbw after ~20 % protocol overhead (NCCL's maintainers: "
                    "github.com/NVIDIA/nccl-tests/issues/212); the measured rows ran with NCCL_NVLS_ENABLE=0, so "
                    "ring, not NVLink SHARP"),
    "pcie5": Link("pcie5", 50.0, 5.0, "PCIe Gen5 x16: 64 GB/s a direction line rate, taken at ~80 % as NVLink's"),
    "ib_ndr": Link("ib_ndr", 45.0, 6.0, "InfiniBand NDR 400 Gb/s = 50 GB/s a direction, one NIC per GPU as in HGX "
                   "H200 systems, taken at ~90 %"),
    "eth100": Link("eth100", 11.0, 15.0, "100 GbE (RoCE) = 12.5 GB/s, one NIC per GPU, taken at ~90 %"),
}


def link(name: str | Link) -> Link:
  if isinstance(name, Link):
    return name
  if name not in LINKS:
    raise ValueError(f"unknown link {name!r}; choose one of {', '.join(LINKS)}")
  return LINKS[name]


def ring_all_reduce_ms(size: float, n: int, on: Link) -> float:
  """NCCL's ring all-reduce of `size` bytes over n devices: 2(n−1)/n·S/busbw + 2(n−1)·latency."""
  return on.ms(size, 2 * (n - 1), 2 * (n - 1) / n) if n > 1 else 0.0


def ring_gather_ms(size: float, n: int, on: Link) -> float:
  """An all-gather (or reduce-scatter) whose whole tensor is `size` bytes: (n−1)/n·S/busbw + (n−1)·latency."""
  return on.ms(size, n - 1, (n - 1) / n) if n > 1 else 0.0


@dataclasses.dataclass(frozen=True)
class Hosts:
  """GPUs per host on `intra`, hosts joined by `inter`: a collective over several hosts runs in two levels (NCCL's
  rails: each GPU its own NIC), within each host on the tensor, between hosts on each GPU's 1/local share."""

  gpus: int
  count: int = 1
  intra: Link = LINKS["nvlink4"]
  inter: Link = LINKS["ib_ndr"]
  launch_us: float = 0.0  # a collective's own cost in the step, whatever it moves (COLLECTIVE_US)

  def collective_ms(self, kind: str, size: float, members: tuple[int, ...]) -> float:
    return self.ring_ms(kind, size, members) + (self.launch_us * 1e-3 if len(members) > 1 else 0.0)

  def ring_ms(self, kind: str, size: float, members: tuple[int, ...]) -> float:
    hosts = len({m // self.gpus for m in members})
    local = len(members) // hosts
    if kind == "all-reduce":
      if hosts == 1:
        return ring_all_reduce_ms(size, local, self.intra)
      return 2 * ring_gather_ms(size, local, self.intra) + ring_all_reduce_ms(size / local, hosts, self.inter)
    return ring_gather_ms(size, local, self.intra) + ring_gather_ms(size / local, hosts, self.inter)


def interpolate(xs, ys, x: float) -> float:
  """y at x, piecewise linear in log-log between the points, the end segments extended."""
  lx = [math.log(v) for v in xs]
  i = min(max(sum(v <= math.log(x) for v in lx) - 1, 0), len(xs) - 2)
  if ys[i] <= 0 or ys[i + 1] <= 0:
    return max(ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i]), 0.0)
  slope = (math.log(ys[i + 1]) - math.log(ys[i])) / (lx[i + 1] - lx[i])
  return ys[i] * math.exp(slope * (math.log(x) - lx[i]))


NETWORK_ROWS = ("outside the network", "no HLO op", "no op_name")  # the profile's groups of no layer


@dataclasses.dataclass(frozen=True)
class Profile:
  """Per-layer kernel times of one GPU at several batches: series[(layer, pass)] ms per step at each of `batches`;
  'input' the crops kernel, 'update' the rest outside the network (SGD's fusions, copies), 'gemm' cuBLAS GEMMs that
  the trace ties to no HLO op (fc layers' products), 'step' the untraced step and 'kernels' the groups' sum."""

  batches: tuple[int, ...]
  series: dict[tuple[str, str], tuple[float, ...]]
  sources: tuple[str, ...]

  def ms(self, key, batch: float) -> float:
    return interpolate(self.batches, self.series[key], batch) if key in self.series else 0.0

  def gaps(self, batch: float) -> float:
    """The untraced step over its kernels' sum: launch gaps and host time between kernels."""
    return self.ms(("step", ""), batch) / self.ms(("kernels", ""), batch)


def series_key(group: dict) -> tuple[str, str]:
  layer, kind = group["layer"], group["kind"]
  if layer == "outside the network":
    return ("input", "") if kind.startswith("triton") else ("update", "")
  if layer == "no HLO op":
    return ("gemm", "") if kind == "other" else ("update", "")
  if layer == "no op_name":  # a fusion scoped to no layer (VGG-16's pad, µs a step): counted with the crops
    return "input", ""
  return layer, group["pass"]


def profile_pattern(network: str = "alexnet") -> str:
  return os.path.join(RESULTS, PROFILES[network][1])


@functools.cache
def load_profile(pattern: str = profile_pattern()) -> Profile:
  paths = sorted(glob.glob(pattern), key=lambda p: json.load(open(p))["batch"])
  if len(paths) < 2:
    raise ValueError(f"a step model needs profiles at two batches or more; found {len(paths)} at {pattern}")
  summaries = [json.load(open(p)) for p in paths]
  series = {}
  for i, s in enumerate(summaries):
    gpu = next(iter(s["devices"].values()))
    sums = {("step", ""): s["untraced_step_ms"], ("kernels", ""): sum(g["ms"] for g in gpu["groups"])}
    for g in gpu["groups"]:
      sums[series_key(g)] = sums.get(series_key(g), 0.0) + g["ms"]
    for key, ms in sums.items():
      series.setdefault(key, [0.0] * len(summaries))[i] = ms
  return Profile(tuple(s["batch"] for s in summaries), {k: tuple(v) for k, v in series.items()},
                 tuple(os.path.basename(p) for p in paths))


def step_rows(path: str, system: str) -> dict[int, float]:
  """{global batch: step ms} of `system`'s rows in a benchmark's JSON (docs/results)."""
  rows = json.load(open(os.path.join(RESULTS, path)))
  return {r["batch"]: r["step_ms"] for r in rows if r["system"] == system}


@dataclasses.dataclass(frozen=True)
class Baseline:
  """The one-GPU step measured at a commit: compute is scaled by it over the profile's step, at the batch a device
  runs (constant past the measured batches), for rows measured when the kernels were slower."""

  commit: str
  steps: dict[int, float]  # one-GPU step ms by batch
  sources: tuple[str, ...]

  def scale(self, profile: Profile, batch: float) -> float:
    if not self.steps:
      return 1.0
    batches = sorted(self.steps)
    ratios = [self.steps[b] / profile.ms(("step", ""), b) for b in batches]
    if len(batches) == 1 or batch <= batches[0]:
      return ratios[0] if batch <= batches[0] else ratios[-1]
    return ratios[-1] if batch >= batches[-1] else interpolate(batches, ratios, batch)


CURRENT = Baseline("profile", {}, ())


def baseline(commit: str, *sources: tuple[str, str, tuple[int, ...]]) -> Baseline:
  """A Baseline from (file, system, batches) rows of one GPU."""
  steps = {b: ms for path, system, batches in sources for b, ms in step_rows(path, system).items() if b in batches}
  return Baseline(commit, steps, tuple(path for path, _, _ in sources))


@dataclasses.dataclass(frozen=True)
class LayerRow:
  """One layer on one device: its rows of the batch, its share of the layer's work, compute and collectives."""

  layer: str
  place: str
  rows: int
  share: float
  compute_ms: float  # forward and backward
  critical_ms: float  # activation collectives and summed partial outputs
  gradient_ms: float  # its weight gradients' all-reduce, before any overlap


@dataclasses.dataclass(frozen=True)
class Prediction:
  step_ms: float
  images_per_s: float
  compute_ms: float
  comm_ms: float  # on the critical path: activation collectives, and the gradient all-reduces not hidden
  gradient_ms: float  # every gradient all-reduce, hidden or not
  model: int
  data: int
  places: dict[str, str]  # each weighted layer's place: what config.network's table takes (table.with_places)
  rows: tuple[LayerRow, ...]
  traffic: dict[tuple[str, str, int], int]  # Plan.traffic: bytes per step of each collective
  memory_bytes: float  # a device's parameters, gradients, optimiser state and activations (an estimate)

  @property
  def bytes(self) -> int:
    return sum(self.traffic.values())


def mesh_of(table: Table, devices: int, model: int | None = None) -> int:
  """The model axis a placed table spreads over `devices` as scripts/benchmark.py's layouts do: the towers over
  'model' where a layer is placed 'tower', every device where 'model' (the hybrid), else 1."""
  if model is None:
    if table.placed("tower"):
      model = math.gcd(table.towers, devices)
    else:
      model = devices if table.placed("model") else 1
  if model < 1 or devices % model:
    raise ValueError(f"a model axis of {model} does not divide {devices} devices")
  return model


def placed(table: Table, strategy_or_places) -> Table:
  if isinstance(strategy_or_places, dict):
    return with_places(table, strategy_or_places)
  if strategy_or_places == "table":
    return table
  if strategy_or_places not in STRATEGIES:
    raise ValueError(f"unknown strategy {strategy_or_places!r}; choose one of {', '.join(STRATEGIES)}, table, or "
                     "give {layer: place}")
  from alexnet_jax.network.table import with_strategy  # noqa: PLC0415
  return with_strategy(table, strategy_or_places)


def profiled_table(network: str = "alexnet") -> Table:
  """The table PROFILES' network was profiled as (width 1, 1000 classes)."""
  from alexnet_jax.network.table import get_network  # noqa: PLC0415
  return get_network(network, **PROFILES[network][0])


@functools.cache
def profiled_shapes(network: str = "alexnet") -> dict:
  return layer_shapes(profiled_table(network), PROFILE_IMAGE_SIZE, 1).params


def odd_layers(shapes: dict, known: dict) -> list[str]:
  """The table's layers the network's profiles do not time as the table shapes them, then the network's it lacks."""
  return [name for name, leaves in shapes.items() if known.get(name) != leaves] + sorted(set(known) - set(shapes))


def check_profiled(table: Table, image_size: int) -> str:
  """The profiled network (PROFILES) whose layers the table has, shaped alike, at 224; else a table or crop the
  profiles do not describe is refused."""
  if image_size != PROFILE_IMAGE_SIZE:
    raise ValueError(f"the measured kernel times are of {PROFILE_IMAGE_SIZE}×{PROFILE_IMAGE_SIZE} crops, not "
                     f"{image_size}")
  shapes = layer_shapes(table, image_size, 1).params
  odd = {network: odd_layers(shapes, profiled_shapes(network)) for network in PROFILES}
  closest = min(odd, key=lambda network: len(odd[network]))
  if odd[closest]:
    raise ValueError(f"no measured kernel times for layer {odd[closest][0]} as this table shapes it: the profiles time "
                     "the paper's AlexNet (2 towers) and VGG-16 (one tower), width 1, 1000 classes")
  return closest


def share_of(p, the_plan: Plan) -> float:
  """The share of a layer's work (both towers, its rows) that one device computes."""
  if the_plan.model == 1:
    return 1.0
  where = p.weights or p.input
  towers = the_plan.table.towers
  return {TOWERS: (towers // the_plan.model) / towers, SLICES: 1 / the_plan.model, WHOLE: 1.0}[where]


def rows_of(p, the_plan: Plan, batch: int) -> int:
  return batch // the_plan.data // (the_plan.model if p.split_batch else 1)


def fc_weights(table: Table) -> dict[str, float]:
  """Each fc layer's share of the fc kernels' elements, by which the GEMMs that name no layer are shared out."""
  shapes = layer_shapes(table, PROFILE_IMAGE_SIZE, 1).params
  sizes = {layer.name: math.prod(shapes[layer.name]["kernel"]) for layer in table.weighted() if kind_of(layer).flat}
  return {name: size / sum(sizes.values()) for name, size in sizes.items()}


def layer_compute_ms(p, the_plan: Plan, batch: int, profile: Profile, base: Baseline, gemm: float) -> tuple:
  """(rows, share, ms) of one layer's forward and backward on a device."""
  name, rows, share = p.layer.name, rows_of(p, the_plan, batch), share_of(p, the_plan)
  ms = profile.ms((name, "fwd"), rows) + profile.ms((name, "bwd"), rows) + gemm * profile.ms(("gemm", ""), rows)
  return rows, share, ms * share * profile.gaps(rows) * base.scale(profile, rows)


def parameters(the_plan: Plan) -> tuple[int, int]:
  """(parameters a device holds, parameters of the network)."""
  shapes = layer_shapes(the_plan.table, PROFILE_IMAGE_SIZE, 1).params
  held = total = 0
  for p in the_plan.layers:
    for leaf, shape in shapes.get(p.layer.name, {}).items():
      total += math.prod(shape)
      held += math.prod(shape) // (the_plan.model if p.split_weights[leaf] else 1)
  return held, total


def memory_bytes(the_plan: Plan, batch: int) -> float:
  """Parameters with their gradients and optimiser state, each layer's output in bf16 (kept for the backward pass)
  and the crops, for one device: an estimate, not the allocator's figure."""
  shapes = layer_shapes(the_plan.table, PROFILE_IMAGE_SIZE, 1)
  activations = sum(math.prod(shapes.outputs[p.layer.name]) * rows_of(p, the_plan, batch) * share_of(p, the_plan)
                    for p in the_plan.layers)
  crops = math.prod(shapes.inputs[the_plan.layers[0].layer.name]) * batch // the_plan.data
  return parameters(the_plan)[0] * BYTES_PER_PARAMETER + (activations + crops) * ACTIVATION_BYTES


def groups(the_plan: Plan) -> dict[str, tuple[int, ...]]:
  """The devices of the first group of each mesh axis; device d·model + m is row d, column m of the mesh."""
  model, data = the_plan.model, the_plan.data
  return dict(model=tuple(range(model)), data=tuple(j * model for j in range(data)),
              all=tuple(range(model * data)))


def collective_ms(the_plan: Plan, batch: int, hosts: Hosts, gather_input: bool) -> tuple[dict, dict, dict]:
  """({layer: critical ms}, {layer: gradient all-reduce ms}, traffic) of the plan's collectives on `hosts`."""
  traffic = the_plan.traffic(PROFILE_IMAGE_SIZE, batch, ACTIVATION_BYTES)
  members, critical, gradient = groups(the_plan), {}, {}
  for (name, kind, n), size in traffic.items():
    add = lambda into, ms, key=name: into.__setitem__(key, into.get(key, 0.0) + ms)  # noqa: E731
    if kind != "all-reduce":
      add(critical, hosts.collective_ms(kind, size, members["model"]))
      continue
    p = the_plan[name]
    partial = p.layer.filters * (batch // the_plan.data) * 4 if p.reduce and n == the_plan.model else 0
    if partial:
      add(critical, hosts.collective_ms(kind, partial, members["model"]))
    if size > partial:
      axis = "all" if p.layer.place == "data" and the_plan.model > 1 else "data"
      add(gradient, hosts.collective_ms(kind, size - partial, members[axis]))
  if gather_input and the_plan.model > 1 and the_plan.layers[0].layer.place != "data":
    size = batch // the_plan.data * CROP_BYTES
    traffic["input", "all-gather", the_plan.model] = size
    critical["input"] = hosts.collective_ms("all-gather", size, members["model"])
  return critical, gradient, traffic


def predict(table: Table, strategy_or_places="tower", devices: int = 1, batch: int = 128,
            link_name: str | Link = "nvlink4", *, hosts: int = 1, network: str | Link = "ib_ndr",
            model: int | None = None, overlap: float = OVERLAP, launch_us: float = COLLECTIVE_US,
            base: Baseline = CURRENT, gather_input: bool = False, image_size: int = PROFILE_IMAGE_SIZE,
            profile: Profile | None = None) -> Prediction:
  """The train step of `table` placed by a strategy ('tower', 'data', 'hybrid', 'table') or {layer: place} on
  `devices` GPUs (over `hosts` hosts, `link_name` within each, `network` between), for a global batch; `overlap`
  and `launch_us` as OVERLAP and COLLECTIVE_US; `model` the
  mesh's model axis (default: mesh_of's); `base` the one-GPU step whose commit the kernels are taken at;
  `gather_input` each device cuts its own rows' crops and the towers swap them (how the two-GPU split was
  measured)."""
  if devices < 1 or hosts < 1 or devices % hosts:
    raise ValueError(f"{devices} devices do not spread evenly over {hosts} hosts")
  if not 0 <= overlap <= 1:
    raise ValueError(f"overlap is a share of the gradient all-reduces, 0 to 1, not {overlap}")
  table = placed(table, strategy_or_places)
  profiled = check_profiled(table, image_size)
  model = mesh_of(table, devices, model)
  the_plan = plan(table, "table", model, devices // model)
  if batch % devices:
    raise ValueError(f"a global batch of {batch} does not split over {devices} devices")
  profile = profile or load_profile(profile_pattern(profiled))
  topology = Hosts(devices // hosts, hosts, link(link_name), link(network), launch_us)
  critical, gradient, traffic = collective_ms(the_plan, batch, topology, gather_input)
  gemm = fc_weights(table)
  rows, compute, backward = [], 0.0, 0.0
  for p in the_plan.layers:
    name = p.layer.name
    n, share, ms = layer_compute_ms(p, the_plan, batch, profile, base, gemm.get(name, 0.0))
    rows.append(LayerRow(name, p.layer.place, n, share, ms, critical.get(name, 0.0), gradient.get(name, 0.0)))
    compute += ms
    backward += ms * backward_share(profile, name, n)
  compute += outside_ms(the_plan, batch, profile, base, gather_input)
  grads = sum(gradient.values())
  exposed = sum(critical.values()) + grads - min(overlap * grads, backward)
  step = compute + exposed
  places = {layer.name: layer.place for layer in table.weighted()}
  return Prediction(step, batch / step * 1e3, compute, exposed, grads, model, devices // model, places, tuple(rows),
                    traffic, memory_bytes(the_plan, batch))


def backward_share(profile: Profile, name: str, rows: int) -> float:
  forward, backward = profile.ms((name, "fwd"), rows), profile.ms((name, "bwd"), rows)
  return backward / (forward + backward) if forward + backward else 0.0


def outside_ms(the_plan: Plan, batch: int, profile: Profile, base: Baseline, gather_input: bool) -> float:
  """The crops of the device's rows, and the update in proportion to the parameters it holds."""
  spread = the_plan.layers[0].split_batch or (gather_input and the_plan.layers[0].layer.place != "data")
  rows = batch // the_plan.data // (the_plan.model if spread else 1)
  held, total = parameters(the_plan)
  ms = profile.ms(("input", ""), rows) + profile.ms(("update", ""), rows) * held / total
  return ms * profile.gaps(rows) * base.scale(profile, rows)


# The one-GPU step at the commits the multi-GPU rows were measured at (docs/BENCHMARKS.md's History): (file, system,
# batches) rows of docs/results.
BASELINES = {
    "b277794": (("step_2026-12-01_one_tuned.json", "triton:one", (128, 512)),),
    "56f1610": (("step_2026-11-30_one_h200.json", "triton:one", (128, 512)),),
    "567173f": (("scaling_h200_n1_b128.json", "triton:dp", (128,)),
                ("step_2026-11-30_one_h200_lrn.json", "triton:one", (512, 1024))),
    "5fdc646": (("step_2026-11-30_one_h200_lrn.json", "triton:one", (128, 512, 1024)),),
}
STRATEGY_OF = {"triton:one": "tower", "triton:split": "tower", "triton:dp": "data", "triton:hybrid": "hybrid"}
MULTI = ("triton:split", "triton:dp", "triton:hybrid")
# (file, the commit of its one-GPU baseline: 'profile' for the profiles' own, systems); FIT: the rows the global
# parameters (NVLink's busbw, the overlap) were chosen on.
CHECKS = (
    ("torch_expert_h200.json", "profile", ("triton:one",)),
    ("bench_one_h200_2026-12-02_lrn_pool.json", "profile", ("triton:one",)),
    ("step_2026-12-01_split_tuned.json", "b277794", MULTI),
    ("strategies_2026-11-30_h200x2_b128.json", "567173f", MULTI),
    ("strategies_2026-11-30_h200x2_b512.json", "567173f", MULTI),
    ("strategies_2026-11-30_h200x2_b1024.json", "567173f", MULTI),
    ("step_2026-12-01_split_base.json", "56f1610", MULTI),
    ("step_2026-11-30_split.json", "56f1610", MULTI),
    ("step_2026-11-30_h200x2_b512.json", "5fdc646", MULTI),
    ("scaling_h200_n2_b128.json", "567173f", MULTI),
)
FIT = ("strategies_2026-11-30_h200x2_b128.json",)


@dataclasses.dataclass(frozen=True)
class Check:
  file: str
  system: str
  batch: int
  devices: int
  baseline: str  # the commit whose one-GPU step the compute is scaled to
  measured: float  # images/s
  predicted: float
  fitted: bool  # a row the global parameters were chosen on

  @property
  def error(self) -> float:
    return self.predicted / self.measured - 1


def gathers_input(row: dict) -> bool:
  """The row's step gathered the crops over the towers (its compiled step's collectives say so)."""
  return any(k.startswith("input") and "all-gather" in k for k in row.get("collective_bytes", {}))


def checks(table: Table | None = None, files: tuple[str, ...] | None = None, **kwargs) -> list[Check]:
  """Every recorded AlexNet step of ours in CHECKS (or those of `files`), predicted at its commit's one-GPU step;
  kwargs go to predict."""
  from alexnet_jax.network.table import alexnet  # noqa: PLC0415
  table = table or alexnet()
  bases = {commit: baseline(commit, *rows) for commit, rows in BASELINES.items()} | {"profile": CURRENT}
  out = []
  for path, commit, systems in CHECKS:
    if files is not None and path not in files:
      continue
    for row in json.load(open(os.path.join(RESULTS, path))):
      if row["system"] not in systems or row["system"] not in STRATEGY_OF:
        continue
      p = predict(table, STRATEGY_OF[row["system"]], row["devices"], row["batch"], base=bases[commit],
                  model=row["mesh"]["model"], gather_input=gathers_input(row), **kwargs)
      out.append(Check(path, row["system"], row["batch"], row["devices"], commit, row["images_per_s"],
                       p.images_per_s, path in FIT))
  return out


def fit(launches=tuple(range(0, 101, 5)), overlaps=tuple(i / 20 for i in range(21))) -> tuple[float, float]:
  """(COLLECTIVE_US, OVERLAP): the grid point whose predictions of FIT's rows are closest (least squares of the
  log ratio) to the measured ones."""
  def cost(launch_us, overlap):
    return sum(math.log1p(c.error) ** 2 for c in checks(files=FIT, launch_us=launch_us, overlap=overlap))
  return min(itertools.product(launches, overlaps), key=lambda point: cost(*point))


@dataclasses.dataclass(frozen=True)
class Searched:
  best: Prediction
  named: dict[str, Prediction]  # tower (where there are towers), data, hybrid as benchmark.py's layouts place them
  tried: int  # placements predicted (valid tables on a valid mesh)


def named_strategies(table: Table) -> tuple[str, ...]:
  """The strategies that differ on this table: with one tower, 'tower' is the whole network on each device, 'data'."""
  return STRATEGIES if table.towers > 1 else tuple(s for s in STRATEGIES if s != "tower")


def candidates(table: Table):
  """Every table of per-layer places the table's rules accept: each weighted layer 'tower' or 'data', an fc layer
  'model' too ('tower' left out with one tower: there it is 'data' or refused)."""
  weighted = table.weighted()
  spread = ("tower", "data") if table.towers > 1 else ("data",)
  choices = [spread + ("model",) if kind_of(layer).sliced else spread for layer in weighted]
  for places in itertools.product(*choices):
    try:
      yield with_places(table, {layer.name: place for layer, place in zip(weighted, places)})
    except ValueError:
      continue  # e.g. a 'data' layer after a 'tower' one


def search(table: Table, devices: int, batch: int, link_name="nvlink4", memory: float = H200_MEMORY,
           **kwargs) -> Searched:
  """The fastest placement (per-layer places and model axis) predicted for `devices` GPUs that fits in `memory`
  bytes a device, beside the named strategies; kwargs go to predict."""
  named = {s: predict(table, s, devices, batch, link_name, **kwargs) for s in named_strategies(table)}
  best, tried = None, 0
  for candidate in candidates(table):
    for model in (m for m in range(1, devices + 1) if devices % m == 0):
      try:
        p = predict(candidate, "table", devices, batch, link_name, model=model, **kwargs)
      except ValueError:
        continue  # towers that do not spread over this model axis, a batch that does not split
      tried += 1
      if p.memory_bytes <= memory and (best is None or p.step_ms < best.step_ms):
        best = p
  if best is None:
    raise ValueError(f"no placement of the table on {devices} devices fits in {memory / 1e9:.0f} GB a device")
  return Searched(best, named, tried)


# One-GPU rows recorded without a raw step file: (network, system, batch, images/s, where, commit measured at).
RECORDED = (("vgg16", "triton:one", 64, 4060.0, "docs/BENCHMARKS.md, 2026-11-30", "630d65b"),)


def one_gpu_checks(network: str = "vgg16") -> list[Check]:
  """A network's one-GPU step predicted beside its recorded rows (RECORDED: measured at an older commit than the
  profiles, not rescaled) and its profiles' own untraced steps."""
  table = profiled_table(network)
  out = [Check(f"{where} ({commit})", system, batch, 1, "profile", ips,
               predict(table, "data", 1, batch).images_per_s, False)
         for name, system, batch, ips, where, commit in RECORDED if name == network]
  for path in load_profile(profile_pattern(network)).sources:
    summary = json.load(open(os.path.join(RESULTS, path)))
    measured = summary["batch"] / summary["untraced_step_ms"] * 1e3
    out.append(Check(path, summary["system"], summary["batch"], 1, "profile", measured,
                     predict(table, "data", 1, summary["batch"]).images_per_s, False))
  return out
