"""Classifies images with a trained run, or with an exported artifact:

  python scripts/predict.py --workdir DIR PATH… [--top 5] [--crops 1|10] [--json OUT.json] [--csv OUT.csv]
  python scripts/predict.py --artifact model.jaxexport PATH…

PATHs are image files or folders of them (JPEG, PNG, BMP, GIF, TIFF, WebP; a folder's images in name order, not its
subfolders). Each image is resized as training stored its images (shorter side S, the central S×S) and scored on its
centre crop or the paper's 10 crops (with a run; an artifact takes the centre crop). Prints each image's likeliest
classes with their probabilities; --json and --csv write them too. Runs on one device of whatever the host has.
"""

import csv
import json
import os
import sys

from absl import flags

from alexnet_jax import cli

flags.DEFINE_string("workdir", None, "a training run's directory (its run.json and newest checkpoint)")
flags.DEFINE_string("artifact", None, "an inference artifact of scripts/export.py, in place of --workdir")
flags.DEFINE_integer("top", 5, "classes to list per image")
flags.DEFINE_enum("crops", "1", ["1", "10"], "1: centre crop; 10: the paper's 10 crops, their softmax averaged")
flags.DEFINE_string("json", None, "write the predictions here as JSON")
flags.DEFINE_string("csv", None, "write the predictions here as CSV (path, rank, class, probability)")
flags.DEFINE_integer("batch", 32, "images per call")

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def image_paths(paths: list[str]) -> list[str]:
  """The image files that `paths` name, folders expanded (their images, in name order); one ValueError for a path
  that is neither."""
  found = []
  for path in paths:
    if os.path.isdir(path):
      found += [os.path.join(path, f) for f in sorted(os.listdir(path))
                if f.lower().endswith(IMAGE_SUFFIXES) and os.path.isfile(os.path.join(path, f))]
    elif os.path.isfile(path):
      found.append(path)
    else:
      raise ValueError(f"{path}: no such file or folder")
  if not found:
    raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {', '.join(paths)}")
  return found


def read_images(paths: list[str], size: int):
  """(readable paths, their images as training stored them (N, size, size, 3)), each unreadable one named on
  stderr."""
  import numpy as np  # noqa: PLC0415

  from alexnet_jax.api import stored  # noqa: PLC0415

  kept, images = [], []
  for path in paths:
    try:
      images.append(stored([path], size)[0])
      kept.append(path)
    except (OSError, ValueError) as e:
      print(f"skipped {path}: {e}", file=sys.stderr)
  if not kept:
    raise ValueError("none of the images can be read")
  return kept, np.stack(images)


def artifact_probabilities(path: str, paths: list[str], batch: int):
  """(classes, readable paths, probabilities) of images under an inference artifact."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from alexnet_jax import export  # noqa: PLC0415

  artifact = export.load(path)
  facts = artifact.facts
  if facts.get("input") != "uint8" or not artifact.classes:
    raise ValueError(f"{path} is not an inference artifact of uint8 images (scripts/export.py --input uint8)")
  kept, images = read_images(paths, facts["size"])
  (shape,) = artifact.exported.in_avals
  fixed = shape.shape[0] if isinstance(shape.shape[0], int) else None
  step, out = fixed or batch, []
  for start in range(0, len(images), step):
    chunk = images[start:start + step]
    padded = np.concatenate([chunk, np.repeat(chunk[-1:], step - len(chunk), 0)]) if fixed else chunk
    out.append(np.asarray(jax.nn.softmax(artifact.exported.call(padded)))[:len(chunk)])
  return artifact.classes, kept, np.concatenate(out)


def main(argv):
  args = flags.FLAGS
  if bool(args.workdir) == bool(args.artifact):
    sys.exit("error: give --workdir (a training run) or --artifact (an exported model), one of them")
  if len(argv) < 2:
    sys.exit("error: name the images to classify: files or folders")
  try:
    if args.workdir:
      from alexnet_jax.training import run  # noqa: PLC0415

      run.read(args.workdir)  # a wrong workdir is said before the images are looked for
    paths = image_paths(argv[1:])
    if args.artifact:
      if args.crops != "1":
        raise ValueError("an artifact scores the centre crop: --crops 10 needs --workdir")
      classes, kept, probs = artifact_probabilities(args.artifact, paths, args.batch)
    else:
      import alexnet_jax  # noqa: PLC0415

      model = alexnet_jax.load(args.workdir, eval_batch_size=args.batch)
      kept, images = read_images(paths, model.run.size)
      classes, probs = model.classes, model.predict(images, int(args.crops))
  except ValueError as e:
    sys.exit(f"error: {e}")
  rows = []
  for path, p in zip(kept, probs):
    best = sorted(range(len(classes)), key=lambda c: (-p[c], c))[:args.top]
    rows.append(dict(path=path, top=[{"rank": r + 1, "class": classes[c], "probability": float(p[c])}
                                     for r, c in enumerate(best)]))
    print(f"{path}: " + ", ".join(f"{t['class']} {t['probability']:.3f}" for t in rows[-1]["top"]))
  try:
    if args.json:
      with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
    if args.csv:
      with open(args.csv, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["path", "rank", "class", "probability"])
        out.writerows([r["path"], t["rank"], t["class"], f"{t['probability']:.6f}"] for r in rows for t in r["top"])
  except OSError as e:
    sys.exit(f"error: cannot write {e.filename}: {e.strerror}; the predictions are above")


if __name__ == "__main__":
  cli.run(main)
