"""Images per second of the training input pipeline (JPEG decode, resize, random crop and flip, PCA colour shift,
batch; the device normalises) on this machine's cores, and how many host cores keep a GPU pair fed:

  python scripts/bench_input.py [--folder ROOT] [--images 512] [--threads 1,2,4] [--workers 0,2] [--json OUT]

Without --folder it writes an ImageNet-like folder first: JPEGs (quality 90) of the built-in procedural images at
the sizes ImageNet's training photos commonly have (shorter side 300–400, aspect 4:3 to 3:2), with noise
that gives them ImageNet's typical file size (~110 KB). Each setting reads
the same batches from a fresh iterator; the batches made during start-up are not timed. The stages are also timed alone
on one core, so the cost per image is visible. cores needed = model images/s ÷ (pipeline images/s per core).
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np
from PIL import Image

from alexnet_jax.config import paper_config
from alexnet_jax.data import augment, get_dataset, iterate, prepare, procedural, sources, train_batches

MODEL_IMAGES_PER_S = 36_472  # 2×H200, paper net, bf16, Triton kernels (docs/BENCHMARKS.md, bench_step.py)
SIZES = ((500, 375), (500, 333), (375, 500), (500, 400), (400, 300))  # (width, height) of typical ImageNet photos


def write_folder(root: str, n: int, classes: int = 10) -> None:
  """n JPEGs in root/train/<class>/ and a few in root/validation/<class>/."""
  for split, count in (("train", n), ("validation", classes)):
    for i in range(count):
      w, h = SIZES[i % len(SIZES)]
      pixels, labels = procedural.generate(0, "train" if split == "train" else "test", i, 1, max(w, h))
      directory = os.path.join(root, split, f"class_{labels[0]}")
      os.makedirs(directory, exist_ok=True)
      # Sensor-like noise brings the files to ImageNet's typical ~110 KB and decode cost; clean gratings are 46 KB.
      noisy = pixels[0, :h, :w] * 255 + np.random.default_rng(i).normal(0, 24, (h, w, 3))
      Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(
          os.path.join(directory, f"{i:05d}.jpg"), quality=90)
  for c in range(classes):  # every class needs a training directory, even if the sample missed it
    os.makedirs(os.path.join(root, "train", f"class_{c}"), exist_ok=True)


def stage_times(dataset, n: int = 64) -> dict:
  """Milliseconds per image of each stage alone, in one thread."""
  files = dataset.train.source.files[:n]
  rng = np.random.default_rng(0)
  t = {}
  start = time.perf_counter()
  images = [sources.decode(f, dataset.resize) for f in files]
  t["decode"] = time.perf_counter() - start
  start = time.perf_counter()
  resized = [augment.resize_shorter(x, dataset.resize) for x in images]
  t["resize"] = time.perf_counter() - start
  start = time.perf_counter()
  crops = [augment.random_crop_flip(x, dataset.image_size, rng) for x in resized]
  t["crop+flip"] = time.perf_counter() - start
  start = time.perf_counter()
  [augment.pca_shift(rng, dataset.statistics.eigval, dataset.statistics.eigvec, dataset.pca_sigma) for _ in crops]
  t["pca shift"] = time.perf_counter() - start
  return {k: 1e3 * v / len(files) for k, v in t.items()}


def pipeline_rate(dataset, batch_size: int, batches: int, threads: int, workers: int, seconds: float = 3.0) -> float:
  """Steady-state images/s over at least `batches` batches and `seconds`: the batches that every thread of every
  process computed while the first was awaited arrive at once and are not timed."""
  iterator = iterate(train_batches(dataset, batch_size), 0, threads, workers)
  for _ in range(threads * max(1, workers) + 1):
    next(iterator)
  start, done = time.perf_counter(), 0
  while done < batches or time.perf_counter() - start < seconds:
    next(iterator)
    done += 1
  rate = done * batch_size / (time.perf_counter() - start)
  getattr(iterator, "close", lambda: None)()
  return rate


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--folder", help="an image folder root/train/<class>/*.jpg (default: a generated one)")
  parser.add_argument("--images", type=int, default=512, help="images to generate when --folder is not given")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--batches", type=int, default=24, help="batches timed per setting")
  parser.add_argument("--threads", default="1,2,4")
  parser.add_argument("--workers", default="0,2")
  parser.add_argument("--sizes", default="full,256", help="'full': the folder as it is; '256': a copy resized to "
                      "shorter side 256 first, as make prepare writes it")
  parser.add_argument("--json", help="write the results here")
  args = parser.parse_args()

  cores, rows, stages = os.cpu_count(), [], {}
  with tempfile.TemporaryDirectory() as tmp:
    root = args.folder or os.path.join(tmp, "full")
    if not args.folder:
      write_folder(root, args.images)
    for size in args.sizes.split(","):
      data_dir = root if size == "full" else os.path.join(tmp, size)
      if size != "full":
        prepare.resize_folder(root, data_dir, int(size))
      config = paper_config()
      config.dataset.update(dict(name="folder", data_dir=data_dir, eval_split="validation"))
      dataset = get_dataset(config)
      stages[size] = stage_times(dataset)
      rows += [dict(images=size, threads=t, workers=w,
                    images_per_s=pipeline_rate(dataset, args.batch, args.batches, t, w))
               for w in map(int, args.workers.split(",")) for t in map(int, args.threads.split(","))]

  print(f"{dataset.num_train} training images ({args.folder or 'generated'}), batch {args.batch}, {cores} cores")
  for size, times in stages.items():
    print(f"one {size} image, one core: " + ", ".join(f"{k} {v:.2f} ms" for k, v in times.items())
          + f"; total {sum(times.values()):.2f} ms")
  print(f"{'images':>6} {'threads':>7} {'workers':>7} {'images/s':>9} {'per core':>8} {'cores for 2×H200':>16}")
  for r in rows:
    r["cores_needed"] = MODEL_IMAGES_PER_S / (r["images_per_s"] / cores)
    print(f"{r['images']:>6} {r['threads']:>7} {r['workers']:>7} {r['images_per_s']:>9.0f} "
          f"{r['images_per_s'] / cores:>8.0f} {r['cores_needed']:>16.0f}")
  print(f"cores for 2×H200 = {MODEL_IMAGES_PER_S:,} images/s (the paper step, bf16, Triton) ÷ images/s per core")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(cores=cores, batch=args.batch, stages_ms=stages, rows=rows,
                     model_images_per_s=MODEL_IMAGES_PER_S), f, indent=1)


if __name__ == "__main__":
  main()
