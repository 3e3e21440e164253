"""Training on a store, end to end, against the same step on synthetic data, on the devices present:

  python scripts/bench_end_to_end.py --store DIR [--batch 512] [--steps 48] [--settings cpu:8:16,gpu:4:16]
      [--backend triton] [--json OUT.json]

The paper's config at `--batch` (bf16, Triton kernels, the two-tower split; another mesh or backend with
--config-like flags is a job for benchmark.py). Rows, all in one process and one compiled step:
  synthetic   the step on a batch of random 256×256 images already on the devices, steps back to back;
  decoder     nvdecode.DeviceDecoder alone on the store's first batch: images/s of all devices together, and per
              device (each decodes its own rows at the same time);
  host        for each setting decoder:workers:threads[:host_share], the host's batches alone (Grain over the
              store with `workers` worker processes of `threads` threads: bench_input.pipeline_rate);
  end to end  the training loop's input path as train.py runs it (those host batches, data.feed.Feed putting or
              decoding them from its thread, steps back to back); images/s and the ratio to synthetic.
The end-to-end rows time `--steps` steps after the batches built ahead during start-up have been used up.
"""

import argparse
import functools
import json
import os
import statistics
import time

import jax
import numpy as np

from alexnet_jax import train
from alexnet_jax.config import paper_config
from alexnet_jax.data import get_dataset, iterate, nvdecode, train_batches
from alexnet_jax.data.feed import AHEAD, Feed
from alexnet_jax.data.pipeline import BATCHES_AHEAD
from bench_input import pipeline_rate  # scripts/, beside this file


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


def decoder_rate(dataset, setup, batch: int, seconds: float = 3.0) -> dict:
  host_batch, _ = dataset.train.jpeg_batch(np.arange(batch), np.zeros(0, np.int32))
  decoder = nvdecode.DeviceDecoder(train.batch_sharding(setup.mesh, 4), batch, dataset.train, nvdecode.THREADS)
  jax.block_until_ready(decoder(host_batch)[0])
  start, done = time.perf_counter(), 0
  while time.perf_counter() - start < seconds:
    images, _, _ = decoder(host_batch)
    done += batch
  jax.block_until_ready(images)
  seconds = time.perf_counter() - start
  decoder.close()
  busy = [device.decode_s / seconds for device in decoder.devices]  # includes the first call's
  return dict(images_per_s=done / seconds, per_device=done / seconds / len(decoder.devices),
              devices=len(decoder.devices), processes_busy=busy)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--store", required=True)
  parser.add_argument("--batch", type=int, default=512)
  parser.add_argument("--steps", type=int, default=48)
  parser.add_argument("--settings", default="cpu:8:16,gpu:4:16,gpu:8:4:0.25",
                      help="decoder:workers:threads[:host_share], comma-separated")
  parser.add_argument("--backend", default="triton", help="kernel_backend (xla for a quick run on CPU)")
  parser.add_argument("--json")
  args = parser.parse_args()
  config = paper_config()
  config.dataset.update(dict(name="store", data_dir=args.store, eval_split="validation"))
  config.batch_size, config.dtype, config.kernel_backend = args.batch, "bfloat16", args.backend
  dataset = get_dataset(config)
  setup = train.dataset_setup(config, dataset)
  state = train.create_train_state(setup, config, jax.random.key(0))
  p_train_step = jax.jit(functools.partial(train.train_step, setup=setup), donate_argnums=0)
  key = jax.random.key(1)

  def step(batch):
    nonlocal state
    state, metrics = p_train_step(state, batch, key)
    return metrics

  synthetic = train.put_batch(setup.mesh, train.random_batch(args.batch, 224, 1000, size=dataset.size))
  out = dict(batch=args.batch, cores=os.cpu_count(), devices=len(jax.devices()), rows=[])
  out["synthetic_images_per_s"] = images_per_s(lambda: step(synthetic), args.batch, args.steps)
  print(f"synthetic: {out['synthetic_images_per_s']:,.0f} images/s", flush=True)
  out["decoder"] = decoder_rate(dataset, setup, args.batch)
  print(f"device decoder alone: {out['decoder']}", flush=True)
  for setting in args.settings.split(","):
    decoder, workers, threads, *share = setting.split(":")
    workers = int(workers)
    config.dataset.update(dict(decoder=decoder, workers=workers, threads=int(threads),
                               host_share=float(share[0]) if share else 0.0))
    data = get_dataset(config)
    host = pipeline_rate(data, args.batch, args.steps, workers)
    feed = Feed(iterate(train_batches(data, args.batch), 0, workers), train.device_put_fn(config, setup, data))
    for _ in range(BATCHES_AHEAD * max(1, workers) + AHEAD + 2):  # start-up: workers' first batches, compile
      jax.block_until_ready(step(next(feed)[0]))
    rate = images_per_s(lambda: step(next(feed)[0]), args.batch, args.steps, windows=1)  # noqa: B023
    feed.close()
    row = dict(decoder=decoder, workers=workers, threads=int(threads), host_share=data.host_share,
               host_images_per_s=host, images_per_s=rate, of_synthetic=rate / out["synthetic_images_per_s"])
    out["rows"].append(row)
    print(row, flush=True)
  print(f"{'decoder':>7} {'workers':>7} {'threads':>7} {'host share':>10} {'host alone':>10} {'images/s':>9} "
        f"{'of synthetic':>12}")
  for r in out["rows"]:
    print(f"{r['decoder']:>7} {r['workers']:>7} {r['threads']:>7} {r['host_share']:>10.2f} "
          f"{r['host_images_per_s']:>10,.0f} {r['images_per_s']:>9,.0f} {r['of_synthetic']:>12.0%}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
