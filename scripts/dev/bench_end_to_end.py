"""Training on a store, end to end, against the same step on synthetic data, on the devices present: how much of
the step's speed the input path keeps, and where its time goes.

  python scripts/dev/bench_end_to_end.py --config configs/alexnet_2gpu.py [--config.key=value …] --store DIR
      [--steps 48] [--settings cpu:16:4,gpu-hardware:16:2:0.4] [--decoder_rows all,hardware] [--decoder_seconds 3]
      [--cache 1,0.5,host:0.5,tiered:0.33:0.67] [--group_rows 512,0] [--json OUT.json]

The config's network, mesh, batch size, dtype and kernels over the store, in one process and one compiled step.
Rows: synthetic (the step on random images already on the devices); decoders (nvdecode.DeviceDecoder for each
backend choice in --decoder_rows, alone and beside the step); host (for each --settings entry
decoder[-gpu_backends]:workers:threads[:host_share], the host's batches alone: bench_input.pipeline_rate); end to end
(the input path as train.py runs it: images/s, the ratio to synthetic, where the feed's thread spent its time);
cache (for each fraction f in --cache, 'sharded:f', 'host:f' or 'tiered:fd:fh' (fd of the store on the devices, the
next fh in the host's memory: f = fd + fh), the first epoch and the later ones against min(synthetic, host alone ÷
(1 − f)), where the feed's thread and the host cache's copies and puts spent their time in each, how long the host
cache's pages took to be asked for (host_memory.Pages) and how long after the cache was made the first epoch's window
opened, and how many ImageNet images the device cache would hold; the host and tiered caches once for each
--group_rows: the rows a put takes together, 0 a batch a put). A window that times decoding (the end-to-end rows, the
cache's first epoch) starts after start-up and after as many more steps as batches can stand built ahead
(`built_ahead`): a window opened on a full pipeline counts batches decoded before it. A first epoch shorter than three
times that is not timed: the row says how large a store would be.
"""

import collections
import json
import os
import statistics
import threading
import time

import jax
import numpy as np
from absl import flags
from bench_input import pipeline_rate  # scripts/dev/, beside this file

from alexnet_jax import cli
from alexnet_jax.config import GPU_BACKENDS, apply_process_settings
from alexnet_jax.data import cache, get_dataset, iterate, nvdecode, train_batches
from alexnet_jax.data.feed import AHEAD, IN_FLIGHT, Feed
from alexnet_jax.data.input import batch_placer
from alexnet_jax.data.pipeline import BATCHES_AHEAD
from alexnet_jax.data.device_batches import BatchLayout, random_batch
from alexnet_jax.training import loop, train


def built_ahead(workers: int, group: int = 1) -> int:
  """Batches that can stand decoded and waiting when a window opens: in each worker process, the batches under way
  (BATCHES_AHEAD) and Grain's one finished; the feed's, put (IN_FLIGHT puts) and ready (AHEAD puts' worth), `group`
  batches a put."""
  return (BATCHES_AHEAD + 1) * max(1, workers) + (IN_FLIGHT + AHEAD) * group


def settling(workers: int, group: int = 1) -> int:
  """Steps before a window that times decoding opens: start-up (the workers' first batches, the compiles), then as
  many as batches stand built ahead meanwhile."""
  return BATCHES_AHEAD * max(1, workers) + (AHEAD + 2) * group + built_ahead(workers, group)


def images_per_s(step_fn, batch: int, steps: int, windows: int = 3) -> float:
  """Median over windows of `steps` calls of step_fn back to back, one wait at the end of each."""
  jax.block_until_ready(step_fn())
  rates = []
  for _ in range(windows):
    start = time.perf_counter()
    for _ in range(steps):
      out = step_fn()
    jax.block_until_ready(out)
    rates.append(steps * batch / (time.perf_counter() - start))
  return statistics.median(rates)


def decode_rate(decoder, host_batch: dict, batch: int, seconds: float, stop: threading.Event | None = None) -> float:
  """Images/s of `decoder` on `host_batch` over and over for `seconds` (or until `stop`), as the feed drives it: the
  next batch handed over before the last is collected (IN_FLIGHT)."""
  start, done, pending = time.perf_counter(), 0, collections.deque()
  while time.perf_counter() - start < seconds and not (stop and stop.is_set()):
    pending.append(decoder.start(host_batch))
    if len(pending) == IN_FLIGHT:
      images, _, _ = pending.popleft()()
      done += batch
  while pending:
    images, _, _ = pending.popleft()()
    done += batch
  jax.block_until_ready(images)
  return done / (time.perf_counter() - start)


def bounded_rate(step_fn, batch: int, seconds: float) -> float:
  """Images/s of step_fn for `seconds` with at most AHEAD steps queued on the devices, as in training, where the
  loop waits for its batches: a step queued behind many others would hold back whatever the decoder queues."""
  start, done, queued = time.perf_counter(), 0, collections.deque()
  while time.perf_counter() - start < seconds:
    queued.append(step_fn())
    done += batch
    if len(queued) > AHEAD:
      jax.block_until_ready(queued.popleft())
  jax.block_until_ready(queued[-1])
  return done / (time.perf_counter() - start)


def decoder_rates(dataset, setup, batch: int, backends: str, step_fn, seconds: float) -> dict:
  """The device decoder (nvImageCodec's `backends`) on the store's first batch, over and over: alone, then from a
  thread while the training step runs (at most AHEAD steps queued): both rates, against the step's alone."""
  host_batch, _ = dataset.train.jpeg_batch(np.arange(batch), np.zeros(0, np.int32))
  spread = BatchLayout(setup.mesh, ("data", "model")).sharding(4)  # each device decodes its own rows
  decoder = nvdecode.DeviceDecoder(spread, batch, dataset.train, nvdecode.THREADS, backends)
  jax.block_until_ready(decoder(host_batch)[0])
  busy_before, start = decoder.seconds["decode"], time.perf_counter()
  rate = decode_rate(decoder, host_batch, batch, seconds)
  busy = (decoder.seconds["decode"] - busy_before) / (time.perf_counter() - start) / len(decoder.devices)
  out = dict(backends=backends, images_per_s=rate, per_device=rate / len(decoder.devices), processes_busy=busy,
             # and the cores each may run on: a child inherits its parent's affinity
             processes_cpus=[len(os.sched_getaffinity(device.process.pid)) for device in decoder.devices],
             step_images_per_s_alone=bounded_rate(step_fn, batch, seconds))
  stop, beside = threading.Event(), []
  thread = threading.Thread(target=lambda: beside.append(decode_rate(decoder, host_batch, batch, 1e9, stop)))
  thread.start()
  out["step_images_per_s_beside"] = bounded_rate(step_fn, batch, seconds)
  stop.set()
  thread.join()
  out["images_per_s_beside_training"] = beside[0]
  decoder.close()
  return out


cli.define_config("a configs/*.py file")
flags.DEFINE_string("store", None, "the store that scripts/prepare_data.py wrote")
flags.DEFINE_integer("steps", 48, "steps timed per row")
flags.DEFINE_integer("windows", 3, "a cache row's later epochs: the median of this many windows of --steps steps")
flags.DEFINE_string("settings", "cpu:16:4,gpu:8:2,gpu-hardware:8:2,gpu-hardware:16:2:0.4",
                    "decoder[-gpu_backends]:workers:threads[:host_share], comma-separated")
flags.DEFINE_string("decoder_rows", ",".join(GPU_BACKENDS),
                    "the gpu_backends to time the device decoder alone with, comma-separated ('' for none)")
flags.DEFINE_float("decoder_seconds", 3.0, "how long each of a decoder row's three rates is measured")
flags.DEFINE_string("cache", "", "fractions of the store for the device cache to hold, comma-separated; "
                    "'sharded:F' for the device cache split over the batch's row blocks, 'host:F' for the host cache, "
                    "'tiered:FD:FH' for FD on the devices (as sharded) and the next FH in the host's memory ('' none)")
flags.DEFINE_list("group_rows", [str(cache.GROUP_ROWS)], "the host and tiered caches' rows a put takes together "
                  "(cache.cached_put's group_rows), each a row; 0: a batch a put")
flags.DEFINE_string("json", None, "write the rows here")
IMAGENET_TRAIN = 1_281_167


def cache_rows(config, dataset, setup, step, fractions: list[str], workers: int, steps: int, host: float,
               synthetic: float, group_rows: list[int], windows: int = 3) -> list[dict]:
  """The cache rows: per fraction ('F' on the devices, 'sharded:F' a block on each of the devices that split the
  rows, 'host:F' in the host's memory, 'tiered:FD:FH' FD as sharded and FH in the host's memory), the first epoch's
  images/s and the later epochs', the model's."""
  batch, out = config.batch_size, []
  runs = [(text, rows) for text in fractions
          for rows in (group_rows if text.split(":")[0] in ("host", "tiered") else group_rows[:1])]
  for text, group_rows in runs:
    where, *numbers = text.split(":") if ":" in text else ("", text)
    if (where, len(numbers)) not in (("", 1), ("sharded", 1), ("host", 1), ("tiered", 2)):
      raise ValueError(f"--cache {text!r}: a fraction F (the device cache), sharded:F, host:F or tiered:FD:FH")
    fraction, on_devices = sum(map(float, numbers)), float(numbers[0]) if where == "tiered" else 0.0
    rule = cache.Schedule(round(fraction * dataset.num_train), dataset.num_train, batch, setup.batch_layout.blocks, 0,
                          device_slots=round(on_devices * dataset.num_train))
    made = time.perf_counter()
    put = cache.cached_put(where or "device", setup.batch_layout, dataset.size, setup.image_size, rule, group_rows)
    feed = Feed(iterate(train_batches(dataset, batch, cached=rule), 0, workers), put)
    warm, filled, ahead = settling(workers, put.group), rule.fill_end // batch + 1, built_ahead(workers, put.group)
    for _ in range(warm):
      jax.block_until_ready(step(next(feed)[0]))
    timed = filled - warm - 1  # the first epoch's steps left
    first, first_from, first_feed, first_put = None, None, None, None
    if timed >= 3 * ahead:
      before, put_before, start = feed.seconds, dict(put.seconds), time.perf_counter()
      first_from = start - made
      first = images_per_s(lambda: step(next(feed)[0]), batch, timed, windows=1)  # noqa: B023
      first_feed, first_put = shares(feed.seconds, before, start), shares(put.seconds, put_before, start)
    else:
      print(f"{text}: the first epoch is not timed: {max(0, timed)} of its steps are left after start-up, fewer than "
            f"{3 * ahead}; it needs a store of at least "
            f"{(warm + 1 + 3 * ahead) * batch / max(fraction, 1e-3):,.0f} images at batch {batch}",
            flush=True)
      for _ in range(max(0, timed)):
        jax.block_until_ready(step(next(feed)[0]))
    # the batches the fill's last steps built ahead; the reading assembly compiles
    for _ in range((AHEAD + 2) * put.group):
      jax.block_until_ready(step(next(feed)[0]))
    before, put_before, start = feed.seconds, dict(put.seconds), time.perf_counter()
    # The median of several windows: the first batch of a row count not met before compiles the devices' assembly
    # once (a tenth of a second), which one window of a few dozen steps would count as the cache's speed.
    later = images_per_s(lambda: step(next(feed)[0]), batch, steps, windows)  # noqa: B023
    # read before close: the feed goes on building batches after the window, which is not the window's time
    split, put_split = shares(feed.seconds, before, start), shares(put.seconds, put_before, start)
    feed.close()
    model = synthetic if fraction >= 1 else min(synthetic, host / (1 - fraction))
    held = {"host": 0, "tiered": rule.device_slots}.get(where, rule.slots)  # of them, on the devices
    out.append(dict(fraction=fraction, cache=where or "device", group=put.group, images=rule.slots, device_images=held,
                    first_epoch_steps=max(0, timed), first_epoch_images_per_s=first,
                    first_epoch_of_host=first and first / host, first_epoch_from_s=first_from,
                    host_pages_s=getattr(getattr(put, "pages", None), "seconds", None), first_feed=first_feed,
                    first_put=first_put,
                    later_images_per_s=later, later_feed=split, later_put=put_split,
                    of_synthetic=later / synthetic, model_images_per_s=model))
    print(out[-1], flush=True)
  return out


def shares(seconds: dict, before: dict, start: float) -> dict:
  """Each of `seconds`' counts since `before` was read, at perf_counter `start`, as a share of the time since."""
  elapsed = time.perf_counter() - start
  return {k: (v - before[k]) / elapsed for k, v in seconds.items()}


def imagenet_fits(jitted_step, batch: int, dataset, setup, state, key) -> dict:
  """How many of ImageNet's training images at this store's S the cache would hold on each device beside the step
  (jitted_step, at `batch`)."""
  need = loop.step_bytes(jitted_step, setup, dataset, batch, state, key)
  try:
    held = cache.slots(0, IMAGENET_TRAIN, dataset.size, setup.mesh, need)
  except ValueError as e:  # devices that do not report their memory
    return dict(error=str(e))
  return dict(step_bytes=need, images=held, of_imagenet=held / IMAGENET_TRAIN)


def main(argv):
  del argv
  args = flags.FLAGS
  config = args.config
  apply_process_settings(config)
  config.dataset.update(dict(name="store", data_dir=args.store, eval_split="validation", num_classes=0))
  config.mesh.model = min(config.mesh.model, len(jax.devices()))  # one device: both towers on it, grouped
  dataset = get_dataset(config)
  setup = train.dataset_setup(config, dataset)
  steps = train.jitted(setup)  # the step as training runs it
  state, p_train_step = steps.into_step(train.create_train_state(setup, jax.random.key(0))), steps.step
  key = jax.random.key(1)

  def step(batch):
    nonlocal state
    state, metrics = p_train_step(state, batch, key)
    return metrics

  batch = config.batch_size
  synthetic = setup.batch_layout.put(random_batch(batch, config.image_size, dataset.num_classes,
                                                   size=dataset.size))
  out = dict(batch=batch, dtype=config.dtype, kernel_backend=config.kernel_backend, cores=os.cpu_count(),
             cpus=len(os.sched_getaffinity(0)), devices=len(jax.devices()), rows=[])
  out["synthetic_images_per_s"] = images_per_s(lambda: step(synthetic), batch, args.steps)
  print(f"synthetic: {out['synthetic_images_per_s']:,.0f} images/s", flush=True)
  out["decoders"] = [decoder_rates(dataset, setup, batch, backends, lambda: step(synthetic), args.decoder_seconds)
                     for backends in filter(None, args.decoder_rows.split(","))]
  for row in out["decoders"]:
    print(f"device decoder: {row}", flush=True)
  for setting in args.settings.split(","):
    decoder, workers, threads, *share = setting.split(":")
    workers, (decoder, _, backends) = int(workers), decoder.partition("-")
    config.dataset.update(dict(decoder=decoder, workers=workers, threads=int(threads),
                               host_share=float(share[0]) if share else 0.0, gpu_backends=backends or "all"))
    data = get_dataset(config)
    host = pipeline_rate(data, batch, args.steps, workers)
    spread = train.dataset_setup(config, data).batch_layout  # the devices' decoders take spread rows
    put = batch_placer(config, data, spread, config.image_size)
    feed = Feed(iterate(train_batches(data, batch), 0, workers), put)
    decoding = put.seconds
    for _ in range(settling(workers)):
      jax.block_until_ready(step(next(feed)[0]))
    before, decoding_before, start = feed.seconds, dict(decoding), time.perf_counter()
    rate = images_per_s(lambda: step(next(feed)[0]), batch, args.steps, windows=1)  # noqa: B023
    elapsed = time.perf_counter() - start
    split = {k: (v - before[k]) / elapsed for k, v in feed.seconds.items()}  # before close, as cache_rows reads it
    decoder_split = {k: (decoding[k] - decoding_before[k]) / elapsed for k in decoding}
    feed.close()
    row = dict(decoder=setting.split(":")[0], workers=workers, threads=int(threads), host_share=data.host_share,
               host_images_per_s=host, images_per_s=rate, of_synthetic=rate / out["synthetic_images_per_s"],
               feed=split, decoding=decoder_split)
    out["rows"].append(row)
    print(row, flush=True)
  if args.cache:
    first = args.settings.split(",")[0].split(":")
    config.dataset.update(dict(decoder="cpu", workers=int(first[1]), threads=int(first[2]), host_share=0.0))
    data = get_dataset(config)
    host = pipeline_rate(data, batch, args.steps, int(first[1]))
    out["cache_host_images_per_s"] = host
    out["cache"] = cache_rows(config, data, setup, step, args.cache.split(","), int(first[1]), args.steps, host,
                              out["synthetic_images_per_s"], [int(r) for r in args.group_rows], args.windows)
    out["imagenet_in_cache"] = imagenet_fits(p_train_step, batch, data, setup, state, key)
    print(f"ImageNet in the cache: {out['imagenet_in_cache']}", flush=True)
  print(f"{'decoder':>12} {'workers':>7} {'threads':>7} {'host share':>10} {'host alone':>10} {'images/s':>9} "
        f"{'of synthetic':>12}  feed thread: host / put / loop")
  for r in out["rows"]:
    print(f"{r['decoder']:>12} {r['workers']:>7} {r['threads']:>7} {r['host_share']:>10.2f} "
          f"{r['host_images_per_s']:>10,.0f} {r['images_per_s']:>9,.0f} {r['of_synthetic']:>12.0%}  "
          + " / ".join(f"{r['feed'][k]:.0%}" for k in ("host", "put", "loop")))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  cli.run(main, required=["config", "store"])
