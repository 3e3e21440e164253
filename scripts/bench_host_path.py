"""Where the host's time goes when training reads a store, on the devices present:

  python scripts/bench_host_path.py STORE_DIR [--json OUT.json]

Times, at batch 512 of the paper's config (bf16, Triton kernels, the two-tower split): the input pipeline alone
(bench_input's steady-state images/s over the store, for a few worker-process × thread counts), `train.put_batch` alone (the
uint8 batch to the mesh), the train step on a batch already on the devices, and put_batch + step back to back, as
the training loop runs them.
"""

import argparse
import functools
import json
import time

import jax

from alexnet_jax import train
from alexnet_jax.config import paper_config
from alexnet_jax.data import get_dataset, train_batches
from bench_input import pipeline_rate, with_threads  # scripts/, beside this file

BATCH = 512


def per_call_ms(fn, calls=20):
  jax.block_until_ready(fn())
  start = time.perf_counter()
  for _ in range(calls):
    out = fn()
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / calls * 1e3


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("store")
  parser.add_argument("--json")
  args = parser.parse_args()
  config = paper_config()
  config.dataset.update(dict(name="store", data_dir=args.store, eval_split="validation"))
  config.batch_size, config.dtype, config.kernel_backend = BATCH, "bfloat16", "triton"
  dataset = get_dataset(config)
  out = {f"pipeline_images_per_s_{workers}x{threads}": pipeline_rate(with_threads(dataset, threads), BATCH, 24, workers)
         for workers, threads in ((8, 16), (16, 8), (4, 16))}
  setup = train.dataset_setup(config, dataset)
  batch, _ = train_batches(dataset, BATCH)[0]
  state = train.create_train_state(setup, config, jax.random.key(0))
  step = jax.jit(functools.partial(train.train_step, setup=setup), donate_argnums=0)
  on_device, key = train.put_batch(setup.mesh, batch), jax.random.key(1)

  def train_step(b):
    nonlocal state
    state, m = step(state, b, key)
    return m

  out["put_batch_ms"] = per_call_ms(lambda: train.put_batch(setup.mesh, batch))
  out["step_on_device_ms"] = per_call_ms(lambda: train_step(on_device))
  out["put_and_step_ms"] = per_call_ms(lambda: train_step(train.put_batch(setup.mesh, batch)))
  for k, v in out.items():
    print(f"{k:36} {v:10.1f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
