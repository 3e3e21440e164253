"""The benchmark's PyTorch rows (`torch:one`, `torch_flat:one`): the config's layer table as a PyTorch expert would
write and run it, timed as scripts/benchmark.py times ours.

The network is built from the same table (grouped convolutions for a layer that reads its own tower, so both of
the paper's towers run on one GPU; LRN within each tower; an fc layer of split='sum' one full matrix, which is the
sum of the towers' products), NCHW tensors in channels_last memory, autocast to the compute dtype over float32
weights. The step is the same as ours: random stored-size uint8 images whose crops and flips are cut on the GPU and
normalised there, cross-entropy in float32, SGD with momentum and weight decay (fused where torch has it). The whole
step, crops to the optimiser's update, is one `torch.compile`d function, with cuDNN's benchmark mode on, and is timed
in each compile mode asked for (MODES: what a user would try); the row reports the fastest and lists them all.
`torch_flat:one` is the same table with one tower (torchvision's AlexNet with the paper's widths and LRN): a
reference for what torch makes of an ungrouped network. torch is imported inside the functions only: the package
does not need it, the GPU image has it.
"""

import contextlib
import gc
import signal
import statistics
import time

from alexnet_jax.network.layers import kind_of
from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.network.table import Table

# torch.compile's modes, cheapest to compile first: reduce-overhead adds CUDA graphs to the default's kernels, and
# max-autotune-no-cudagraphs times Triton templates against cuBLAS and cuDNN for every GEMM and convolution.
MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
WARMUP = 5  # compiles, recompiles once the momentum exists, and lets CUDA graph trees record before the timing


def build(table: Table, image_size: int):
  """The table as a torch.nn.Sequential (on the CPU, float32); its parameters number what our network's do."""
  from torch import nn  # noqa: PLC0415

  shapes = layer_shapes(table, image_size)
  modules = []
  for layer, blocks in zip(table.layers, table.tower_blocks()):
    modules += kind_of(layer).torch(layer, nn, shapes.inputs[layer.name], table.towers if blocks else 1)
  return nn.Sequential(*modules)


def best_mode(modes: dict) -> str | None:
  """The mode of `modes` ({mode: its timing, or {'error': why}}) with the most images/s; None when none ran."""
  ran = {m: r["images_per_s"] for m, r in modes.items() if "error" not in r}
  return max(ran, key=ran.get) if ran else None


def modes_line(row: dict) -> str:
  """One line of a PyTorch row's compile modes: images/s and compile seconds each, or why a mode did not run."""
  parts = []
  for mode, r in row["torch_modes"].items():
    parts.append(f"{mode} error: {r['error']}" if "error" in r else
                 f"{mode} {r['images_per_s']:,.0f} img/s (compiled in {r['compile_s']:.0f} s)")
  return f"{row['system']} batch {row['batch']}: " + "; ".join(parts)


@contextlib.contextmanager
def time_limit(seconds: float | None):
  """Raises TimeoutError in the block once `seconds` have passed, and every 5 s after, should torch's autotuning
  catch the first: a compilation given up can run on past the limit before it stops."""
  if not seconds:
    yield
    return

  def expire(signum, frame):
    raise TimeoutError(f"compiling took over {seconds:g} s (--torch_compile_limit_s)")

  previous = signal.signal(signal.SIGALRM, expire)
  signal.setitimer(signal.ITIMER_REAL, seconds, 5.0)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def measure(config, table: Table, steps: int, windows: int, modes=MODES, compile_limit_s: float | None = None) -> dict:
  """Times the config's step in PyTorch on the first GPU in each compile mode of `modes`: the row fields
  benchmark.py's measure gives ours, for the fastest mode, and every mode's timing or error under torch_modes. A
  mode whose warm-up steps (its compilation) outlast `compile_limit_s` is given up."""
  import torch  # noqa: PLC0415

  torch.backends.cudnn.benchmark = True  # each convolution's fastest cuDNN algorithm for its shapes, as tuned runs do
  t_build = time.perf_counter()
  results = {}
  for mode in modes:
    try:
      with time_limit(compile_limit_s):
        step, compile_s = compiled_step(config, table, mode)
      results[mode] = timed(step, config.batch_size, steps, windows) | dict(compile_s=compile_s)
    except Exception as e:  # noqa: BLE001  (a mode that fails to compile or run is reported, and the others run)
      results[mode] = dict(error=" ".join(f"{type(e).__name__}: {e}".split())[:300])
    step = None
    torch._dynamo.reset()  # the next mode compiles afresh
    gc.collect()
    torch.cuda.empty_cache()
  best = best_mode(results)
  if best is None:
    raise ValueError("no torch.compile mode ran: " + "; ".join(f"{m}: {r['error']}" for m, r in results.items()))
  r = results[best]
  return dict(devices=1, mesh={}, dtype=config.dtype, batch=config.batch_size, per_device_batch=config.batch_size,
              image_size=config.image_size, width=config.width, step_ms=r["step_ms"],
              window_spread=r["window_spread"], images_per_s=r["images_per_s"], blocked_step_ms=r["blocked_step_ms"],
              step_gib=None, peak_gib=r["peak_gib"], loss=r["loss"], collective_bytes={},
              device=torch.cuda.get_device_name(), build_s=time.perf_counter() - t_build, torch_mode=best,
              torch_modes=results, torch_compile_limit_s=compile_limit_s, versions=versions())


def versions() -> dict:
  import torch  # noqa: PLC0415
  import triton  # noqa: PLC0415

  return dict(torch=torch.__version__, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
              triton=triton.__version__)


def compiled_step(config, table: Table, mode: str):
  """The config's train step in torch, compiled whole in `mode` and run through its warm-up steps, and the seconds
  those took."""
  import torch  # noqa: PLC0415
  import torch.nn.functional as F  # noqa: PLC0415

  t0 = time.perf_counter()
  device, dtype = torch.device("cuda"), getattr(torch, config.dtype)
  torch.manual_seed(config.seed)
  model = build(table, config.image_size).to(device, memory_format=torch.channels_last)
  try:
    opt = torch.optim.SGD(model.parameters(), lr=config.learning_rate, momentum=config.momentum,
                          weight_decay=config.weight_decay, fused=True)
  except (RuntimeError, TypeError):  # a torch without the fused SGD
    opt = torch.optim.SGD(model.parameters(), lr=config.learning_rate, momentum=config.momentum,
                          weight_decay=config.weight_decay, foreach=True)
  n, crop, size = config.batch_size, config.image_size, config.dataset.resize or config.image_size
  classes = table.weighted()[-1].filters
  g = torch.Generator(device=device).manual_seed(0)
  images = torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8, device=device, generator=g)
  offsets = torch.randint(0, size - crop + 1, (n, 2), device=device, generator=g)
  flips = torch.rand(n, device=device, generator=g) < 0.5
  labels = torch.randint(0, classes, (n,), device=device, generator=g)
  mean = torch.tensor([0.485, 0.456, 0.406], device=device) * 255
  std = torch.tensor([0.229, 0.224, 0.225], device=device) * 255
  span = torch.arange(crop, device=device)

  @torch.compile(mode=None if mode == "default" else mode)
  def step():
    rows = (offsets[:, 0, None] + span)[:, :, None]
    cols = offsets[:, 1, None] + torch.where(flips[:, None], crop - 1 - span, span)
    crops = images[torch.arange(n, device=device)[:, None, None], rows, cols[:, None, :]]  # (N, crop, crop, 3)
    x = ((crops.float() - mean) / std).permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
      logits = model(x)
    loss = F.cross_entropy(logits.float(), labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()

  def marked():
    torch.compiler.cudagraph_mark_step_begin()  # each call a new step: CUDA graphs may reuse the last one's outputs
    return step()

  torch.cuda.reset_peak_memory_stats()
  for _ in range(WARMUP):
    marked()
  torch.cuda.synchronize()
  return marked, time.perf_counter() - t0


def timed(step, batch: int, steps: int, windows: int) -> dict:
  """Throughput and latency of a warm step as benchmark.py measures ours: `windows` windows of `steps` steps back to
  back, then as many steps each waited for."""
  import torch  # noqa: PLC0415

  pipelined = []
  for _ in range(windows):
    t0 = time.perf_counter()
    for _ in range(steps):
      loss = step()
    torch.cuda.synchronize()
    pipelined.append((time.perf_counter() - t0) / steps)
  blocked = []
  for _ in range(steps):
    t0 = time.perf_counter()
    loss = step()
    torch.cuda.synchronize()
    blocked.append(time.perf_counter() - t0)
  ms = statistics.median(pipelined) * 1e3
  return dict(step_ms=ms, window_spread=(max(pipelined) - min(pipelined)) * 1e3 / ms, images_per_s=batch / ms * 1e3,
              blocked_step_ms=statistics.median(blocked) * 1e3, loss=float(loss),
              peak_gib=torch.cuda.max_memory_allocated() / 2**30)
