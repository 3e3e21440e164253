"""The training run's input path, from its config: which images the cache keeps (cache.py), how many processes decode
(pipeline.py), how batches reach the devices (device_batches.py, nvdecode.py) and the thread that keeps them ahead of
the steps (feed.py). `input_feed` builds it; the training loop only takes `batch, skipped = next(feed)`.
"""

import os

import jax

from alexnet_jax.data import cache
from alexnet_jax.data.device_batches import DevicePut, HostPut, BatchLayout
from alexnet_jax.data.feed import Feed
from alexnet_jax.data.pipeline import iterate, train_batches
from alexnet_jax.data.workers import left_to_this_thread


def input_feed(config, dataset, rows: BatchLayout, image_size: int, total_steps: int, *, start: int,
               step_memory) -> Feed:
  """The feed of (device batch, skipped) of a run's steps from `start` on, through the cache config.dataset.cache
  keeps (cache_schedule; `step_memory()` says the compiled step's device memory, asked only where the cache is sized by
  what the step leaves), its batches placed as `rows` say and cropped to `image_size`; total_steps: the run's. The
  feed's thread and the decoding processes leave the stop signals to training (workers.left_to_this_thread)."""
  rule = cache_schedule(config, dataset, rows, total_steps, start, step_memory)
  batches = train_batches(dataset, config.batch_size, rows=rows.process_rows(config.batch_size), cached=rule)
  with left_to_this_thread():
    return Feed(iterate(batches, start, input_workers(config)), batch_placer(config, dataset, rows, image_size, rule))


def batch_placer(config, dataset, rows: BatchLayout, image_size: int, cached: cache.Schedule | None = None):
  """What puts the feed's host batches on the devices: the host's images, with a cache (`cached`) the host's and the
  cache's, or, where the devices decode (dataset.decoder 'gpu'), their JPEGs handed to the devices' decoding
  processes."""
  if cached is not None and cached.slots:
    return cache.cached_put(config.dataset.cache, rows, dataset.size, image_size, cached)
  if dataset.decoder != "gpu":
    return HostPut(rows, dataset.size, image_size)
  return DevicePut(rows, dataset.size, image_size, config.batch_size, dataset.train, config.dataset.gpu_backends)


def cache_schedule(config, dataset, rows: BatchLayout, total_steps: int, start: int,
                   step_memory) -> cache.Schedule | None:
  """The cache's rule for a run that starts at step `start` (config.dataset.cache 'device', 'sharded', 'host' or
  'tiered'), each tier sized where its key (config.dataset.cache_bytes on the devices, host_cache_bytes in this
  process) leaves it to the memory: the devices' beside the compiled step (its bytes: `step_memory()`), or the host's;
  None without a cache."""
  kind = config.dataset.cache
  if kind == "none":
    return None
  on_devices = in_host = 0
  shards = 1 if kind == "device" else rows.blocks  # 'sharded' and the device tier: a block of the slots on each
  if kind != "host":
    limit = config.dataset.cache_bytes
    on_devices = cache.slots(limit, dataset.num_train, dataset.size, rows.mesh, 0 if limit else step_memory(), shards)
  if kind in ("host", "tiered"):
    in_host = cache.host_slots(config.dataset.host_cache_bytes, dataset.num_train - on_devices, dataset.size)
  rule = cache.Schedule(on_devices + in_host, dataset.num_train, config.batch_size, rows.blocks, start,
                        device_slots=on_devices if kind == "tiered" else 0)
  gib = cache.image_bytes(dataset.size) / 2**30
  devices = "on each device" if shards == 1 else f"over {shards} devices' memory (a block on each)"
  if kind == "tiered":
    held = (f": {on_devices:,} {devices} ({on_devices * gib:.1f} GiB), {in_host:,} in this process's memory "
            f"({in_host * gib:.1f} GiB), {dataset.num_train - rule.slots:,} decoded every epoch;")
  else:
    where = "in this process's memory" if kind == "host" else devices
    held = f" {where} ({rule.slots * gib:.1f} GiB),"
  print(f"cache: {rule.slots:,} of {dataset.num_train:,} training images{held} read there from step "
        f"{min(total_steps, rule.fill_end // config.batch_size)}", flush=True)
  return rule


def input_workers(config) -> int:
  """config.dataset.workers, with -1 resolved: none on CPU (XLA's compute needs the cores), else a process per 2
  cores, which fed training fastest of the splits of a 32-core host into processes and threads tried
  (docs/BENCHMARKS.md)."""
  if config.dataset.workers >= 0:
    return config.dataset.workers
  return 0 if jax.default_backend() == "cpu" else max(1, (os.cpu_count() or 4) // 2)
