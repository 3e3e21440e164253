"""Images per second of the training input pipeline on this machine's cores (decode to the stored S×S images, the
crop, flip and PCA draws, batch; the device's crops, flips, shifts and normalisation), how many host cores keep a
GPU pair fed, and the CPU decoder of fixed-size JPEGs alone:

  python scripts/dev/bench_input.py [--folder ROOT] [--images 512] [--store STORE] [--threads 1,2,4] [--workers 0,2]
      [--json OUT]

Without --folder it first writes an ImageNet-like folder: JPEGs of the procedural images at the sizes and file sizes
ImageNet's training photos commonly have. Each setting reads the same batches from a fresh iterator, the start-up
batches untimed; each stage is also timed alone on one core: cores needed = model images/s ÷ pipeline images/s per
core. The decoder section decodes --jpegs 256×256 JPEGs (a store's kind) a batch at a time with decode.Decoder on
1…--decode_threads threads, with and without libjpeg-turbo's fast DCT and upsampling, against PIL on one thread;
the 'store' rows put the same images through the whole pipeline; the 'disk' rows read --store's store as training
does, through the worker processes.
"""

import argparse
import dataclasses
import io
import json
import os
import tempfile
import time

import numpy as np
from PIL import Image

from alexnet_jax.config import paper_config
from alexnet_jax.data import augment, decode, get_dataset, iterate, procedural, sources, train_batches
from alexnet_jax.data.pipeline import BATCHES_AHEAD, make_dataset

# 2×H200, paper net, bf16, Triton kernels, batch 512, steps back to back (docs/BENCHMARKS.md, scripts/benchmark.py)
MODEL_IMAGES_PER_S = 83_839
SIZES = ((500, 375), (500, 333), (375, 500), (500, 400), (400, 300))  # (width, height) of typical ImageNet photos


def photo(split: str, i: int) -> tuple[np.ndarray, int]:
  """(An ImageNet-like photo (H, W, 3) uint8, its label): a procedural image at a typical ImageNet size."""
  w, h = SIZES[i % len(SIZES)]
  pixels, labels = procedural.generate(0, split, i, 1, max(w, h))
  # Sensor-like noise brings the files to ImageNet's typical ~110 KB and decode cost; clean gratings are 46 KB.
  noisy = pixels[0, :h, :w] * 255 + np.random.default_rng(i).normal(0, 24, (h, w, 3))
  return np.clip(noisy, 0, 255).astype(np.uint8), int(labels[0])


def write_folder(root: str, n: int, classes: int = 10) -> None:
  """n JPEGs in root/train/<class>/ (and one more of each class that the n missed: a class folder may not be
  empty) and a few in root/validation/<class>/."""
  seen, i = set(), 0
  while i < n or len(seen) < classes:
    image, label = photo("train", i)
    if i < n or label not in seen:
      _save(image, os.path.join(root, "train", f"class_{label}"), i)
      seen.add(label)
    i += 1
  for i in range(classes):
    image, label = photo("test", i)
    _save(image, os.path.join(root, "validation", f"class_{label}"), i)


def _save(image: np.ndarray, directory: str, i: int) -> None:
  os.makedirs(directory, exist_ok=True)
  Image.fromarray(image).save(os.path.join(directory, f"{i:05d}.jpg"), quality=90)


class MemoryStore:
  """n of the photos stored as the paper did (shorter side 256, the central 256×256), as quality-90 JPEGs in memory:
  {'jpeg': bytes, 'label': int}, what a store's reader gives."""

  resize, statistics = 256, None

  def __init__(self, n: int):
    self.examples = []
    for i in range(n):
      image, label = photo("train", i)
      out = io.BytesIO()
      Image.fromarray(augment.resize_center_crop(image, 256)).save(out, format="JPEG", quality=90)
      self.examples.append(dict(jpeg=out.getvalue(), label=label))

  def __len__(self):
    return len(self.examples)

  def __getitem__(self, i):
    return self.examples[i]


def stage_times(dataset, n: int = 64) -> dict:
  """Milliseconds per image of each host stage alone, in one thread."""
  files = dataset.train.source.files[:n]
  rng = np.random.default_rng(0)
  t = {}
  start = time.perf_counter()
  images = [sources.decode(f, dataset.resize) for f in files]
  t["decode"] = time.perf_counter() - start
  start = time.perf_counter()
  [augment.resize_center_crop(x, dataset.resize) for x in images]
  t["resize+centre"] = time.perf_counter() - start
  start = time.perf_counter()
  dataset.draw(np.arange(len(files)), rng)  # a batch's draws at once, as the pipeline makes them
  t["draws"] = time.perf_counter() - start
  return {k: 1e3 * v / len(files) for k, v in t.items()}


def pipeline_rate(dataset, batch_size: int, batches: int, workers: int, seconds: float = 3.0) -> float:
  """Steady-state images/s over at least `batches` batches and `seconds`: the batches that every process computed
  while the first was awaited arrive at once and are not timed."""
  iterator = iterate(train_batches(dataset, batch_size), 0, workers)
  for _ in range(BATCHES_AHEAD * max(1, workers) + 1):
    next(iterator)
  start, done = time.perf_counter(), 0
  while done < batches or time.perf_counter() - start < seconds:
    next(iterator)
    done += 1
  rate = done * batch_size / (time.perf_counter() - start)
  getattr(iterator, "close", lambda: None)()
  return rate


def with_threads(dataset, threads: int):
  return dataclasses.replace(dataset, train=decode.Decoder(dataset.train.source, dataset.size,
                                                           dataset.train.fast, threads))


def timed(fn, seconds: float = 2.0) -> float:
  """Calls of fn per second, over at least `seconds` after one untimed call."""
  fn()
  start, calls = time.perf_counter(), 0
  while calls == 0 or time.perf_counter() - start < seconds:
    fn()
    calls += 1
  return calls / (time.perf_counter() - start)


def decoder_rates(store: MemoryStore, threads: list[int], cores: int, batch: int = 256) -> list[dict]:
  """images/s of PIL on one thread and of decode.Decoder (accurate and fast) on each thread count."""
  indices = list(range(min(batch, len(store))))
  pil = timed(lambda: [sources.decode(store[i]["jpeg"]) for i in indices]) * len(indices)
  rows = [dict(decoder="PIL", threads=1, images_per_s=pil)]
  for fast in (False, True):
    for t in threads:
      decoder = decode.Decoder(store, 256, fast, t)
      rate = timed(lambda: decoder.batch(indices)) * len(indices)  # noqa: B023  (called before the loop moves on)
      rows.append(dict(decoder="simplejpeg" + (" fast" if fast else ""), threads=t, images_per_s=rate))
  for r in rows:
    r["per_core"] = r["images_per_s"] / min(r["threads"], cores)
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--folder", help="an image folder root/train/<class>/*.jpg (default: a generated one)")
  parser.add_argument("--images", type=int, default=512, help="images to generate when --folder is not given")
  parser.add_argument("--store", help="a store (make prepare … --store): its rows too, as training reads it")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--batches", type=int, default=24, help="batches timed per setting")
  parser.add_argument("--threads", default="1,2,4")
  parser.add_argument("--workers", default="0,2")
  parser.add_argument("--jpegs", type=int, default=256, help="256×256 JPEGs for the decoder and 'store' rows")
  parser.add_argument("--decode_threads", default="", help="thread counts of the decoder alone (default: 1, 2, "
                      "4, … up to the cores)")
  parser.add_argument("--json", help="write the results here")
  args = parser.parse_args()

  cores, rows, stages = os.cpu_count(), [], {}
  threads, workers = list(map(int, args.threads.split(","))), list(map(int, args.workers.split(",")))
  config = paper_config()
  with tempfile.TemporaryDirectory() as tmp:
    root = args.folder or os.path.join(tmp, "full")
    if not args.folder:
      write_folder(root, args.images)
    config.dataset.update(dict(name="folder", data_dir=root, eval_split="validation"))
    dataset = get_dataset(config)
    stages["full"] = stage_times(dataset)
    rows += [dict(images="full", threads=t, workers=w,
                  images_per_s=pipeline_rate(with_threads(dataset, t), args.batch, args.batches, w))
             for w in workers for t in threads]
  if args.store:
    config.dataset.update(dict(name="store", data_dir=args.store, num_classes=0))
    on_disk = get_dataset(config)
    rows += [dict(images="disk", threads=t, workers=w,
                  images_per_s=pipeline_rate(with_threads(on_disk, t), args.batch, args.batches, w))
             for w in workers for t in threads]
  store = MemoryStore(args.jpegs)
  config.dataset.name = "store"
  stored = make_dataset(config, store, store, tuple(map(str, range(1000))))
  rows += [dict(images="store", threads=t, workers=0,
                images_per_s=pipeline_rate(with_threads(stored, t), args.batch, args.batches, 0)) for t in threads]
  decode_threads = ([int(t) for t in args.decode_threads.split(",")] if args.decode_threads
                    else sorted({2 ** k for k in range(cores.bit_length()) if 2 ** k <= cores} | {cores}))
  decoders = decoder_rates(store, decode_threads, cores)

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
  kb = np.mean([len(x["jpeg"]) for x in store.examples]) / 1e3
  print(f"CPU decoder, {len(store)} 256×256 JPEGs at quality 90 ({kb:.0f} KB on average), batches of "
        f"{min(256, len(store))} into one buffer:")
  print(f"{'decoder':>15} {'threads':>7} {'images/s':>9} {'per core':>8}")
  for r in decoders:
    print(f"{r['decoder']:>15} {r['threads']:>7} {r['images_per_s']:>9.0f} {r['per_core']:>8.0f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(cores=cores, batch=args.batch, stages_ms=stages, rows=rows, decoder=decoders, jpeg_kb=kb,
                     model_images_per_s=MODEL_IMAGES_PER_S), f, indent=1)


if __name__ == "__main__":
  main()
