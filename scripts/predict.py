"""Classifies images with a trained run, or with an exported artifact:

  python scripts/predict.py --workdir DIR PATH… [--top 5] [--crops 1|5|10] [--json OUT.json] [--csv OUT.csv]
  python scripts/predict.py --artifact model.jaxexport PATH…

PATHs are image files or folders (a folder's images and its subfolders', sorted by path, as
alexnet_jax.api.image_files takes them). Each image is turned upright by its EXIF orientation, resized as training
stored its images and scored on its centre crop or the paper's 10 crops (an artifact takes the centre crop). Prints
each image's likeliest classes with their probabilities; --json and --csv write them too, each file whole or not at
all, never over a file of the run, the artifact or an image. A file that cannot be read is skipped and said so: on
stderr ("skipped PATH: why"), in --json as {"path": …, "skipped": why}, in --csv (columns path, rank, class,
probability, skipped) as the row PATH,,,,why. Runs on one device.
"""

import csv
import io
import json
import os
import sys

from absl import flags

from alexnet_jax import cli
from alexnet_jax.training import workdirs

flags.DEFINE_string("workdir", None, "a training run's directory (its run.json and newest checkpoint)")
flags.DEFINE_string("artifact", None, "an inference artifact of scripts/export.py, in place of --workdir")
flags.DEFINE_integer("top", 5, "classes to list per image (≥ 1; all of them where more than the classes)")
flags.DEFINE_enum("crops", "1", ["1", "5", "10"], "1: centre crop; 5: corners and centre; 10: those and their "
                  "mirrors, the paper's; their softmax averaged")
flags.DEFINE_string("json", None, "write the predictions here as JSON")
flags.DEFINE_string("csv", None, "write the predictions here as CSV (path, rank, class, probability, skipped)")
flags.DEFINE_integer("batch", 32, "images per call")


def image_paths(paths: list[str]) -> list[str]:
  """The image files that `paths` name, folders expanded as the Python API expands them; one ValueError for a path
  that is neither file nor folder, or a folder without images."""
  from alexnet_jax.api import images_of  # noqa: PLC0415

  return [file for path in paths for file in images_of(path)]


def check_outputs(args, paths: list[str]) -> None:
  """Refuses --json or --csv where writing would destroy what is read: the run's files (workdirs.check_output, the
  rule of every script's output), the artifact, an image, or the other output."""
  outputs = [(f"--{name}", getattr(args, name)) for name in ("json", "csv") if getattr(args, name)]
  inputs = {os.path.realpath(p) for p in [*paths, args.artifact] if p}
  for flag, out in outputs:
    workdirs.check_output(flag, out, args.workdir)
    if os.path.realpath(out) in inputs:
      raise ValueError(f"{flag} {out} is one of the inputs: write the predictions elsewhere")
  if len(outputs) == 2 and os.path.realpath(args.json) == os.path.realpath(args.csv):
    raise ValueError(f"--json and --csv name the same file, {args.json}")


def read_images(paths: list[str], size: int):
  """(the readable images as training stored them (N, size, size, 3), per path None or why it is skipped), each
  skipped one named on stderr."""
  import numpy as np  # noqa: PLC0415

  from alexnet_jax.api import read  # noqa: PLC0415

  images, whys = [], []
  for image, skipped in read(paths, size):
    if skipped:
      print(f"skipped {skipped[0]}: {skipped[1]}", file=sys.stderr)
    else:
      images.append(image)
    whys.append(skipped and skipped[1])
  if not images:
    raise ValueError("none of the images can be read")
  return np.stack(images), whys


def artifact_probabilities(path: str, paths: list[str], batch: int):
  """(classes, per path None or why it is skipped, probabilities of the readable) under an inference artifact."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from alexnet_jax import export  # noqa: PLC0415

  artifact = export.load(path)
  facts = artifact.facts
  if facts.get("input") != "uint8" or not artifact.classes:
    raise ValueError(f"{path} is not an inference artifact of uint8 images (scripts/export.py --input uint8)")
  images, whys = read_images(paths, facts["size"])
  (shape,) = artifact.exported.in_avals
  fixed = shape.shape[0] if isinstance(shape.shape[0], int) else None
  step, out = fixed or batch, []
  for start in range(0, len(images), step):
    chunk = images[start:start + step]
    padded = np.concatenate([chunk, np.repeat(chunk[-1:], step - len(chunk), 0)]) if fixed else chunk
    out.append(np.asarray(jax.nn.softmax(artifact.exported.call(padded)))[:len(chunk)])
  return artifact.classes, whys, np.concatenate(out)


def rows_of(paths: list[str], whys: list, classes, probs, top: int) -> list[dict]:
  """A row per path, in order: its `top` classes, or why it was skipped."""
  rows, scored = [], iter(probs)
  for path, why in zip(paths, whys):
    if why:
      rows.append(dict(path=path, skipped=why))
      continue
    p = next(scored)
    best = sorted(range(len(classes)), key=lambda c: (-p[c], c))[:top]
    rows.append(dict(path=path, top=[{"rank": r + 1, "class": classes[c], "probability": float(p[c])}
                                     for r, c in enumerate(best)]))
  return rows


def as_csv(rows: list[dict]) -> str:
  text = io.StringIO(newline="")
  out = csv.writer(text)
  out.writerow(["path", "rank", "class", "probability", "skipped"])
  for r in rows:
    if "top" in r:
      out.writerows([r["path"], t["rank"], t["class"], f"{t['probability']:.6f}", ""] for t in r["top"])
    else:
      out.writerow([r["path"], "", "", "", r["skipped"]])
  return text.getvalue()


def write(rows: list[dict], json_path: str | None, csv_path: str | None) -> list[str]:
  """Writes --json and --csv, each whole or not at all, one whether or not the other can be; why each could not."""
  failed = []
  for path, text in ((json_path, lambda: json.dumps(rows, indent=1)), (csv_path, lambda: as_csv(rows))):
    if not path:
      continue
    try:  # a file name that is not UTF-8 goes back as the bytes it was listed with
      workdirs.write_file(path, text().encode("utf-8", "surrogateescape"))
    except ValueError as e:
      failed.append(str(e))
  return failed


def main(argv):
  args = flags.FLAGS
  if bool(args.workdir) == bool(args.artifact):
    sys.exit("error: give --workdir (a training run) or --artifact (an exported model), one of them")
  if len(argv) < 2:
    sys.exit("error: name the images to classify: files or folders")
  from alexnet_jax.api import check_top  # noqa: PLC0415  (the API's rule for its k, said of the flag)

  try:
    check_top(args.top)
  except ValueError:
    sys.exit(f"error: --top must be ≥ 1 (the classes to name per image), not {args.top}")
  if args.batch < 1:
    sys.exit("error: --batch must be ≥ 1")
  try:
    if args.workdir:
      from alexnet_jax.training import run  # noqa: PLC0415

      run.read(args.workdir)  # a wrong workdir is said before the images are looked for
    paths = image_paths(argv[1:])
    check_outputs(args, paths)
    if args.artifact:
      if args.crops != "1":
        raise ValueError(f"an artifact scores the centre crop: --crops {args.crops} needs --workdir")
      classes, whys, probs = artifact_probabilities(args.artifact, paths, args.batch)
    else:
      import alexnet_jax  # noqa: PLC0415

      model = alexnet_jax.load(args.workdir, eval_batch_size=args.batch)
      images, whys = read_images(paths, model.run.size)
      classes, probs = model.classes, model.predict(images, int(args.crops))
  except ValueError as e:
    sys.exit(f"error: {e}")
  rows = rows_of(paths, whys, classes, probs, args.top)
  for row in rows:
    if "top" in row:
      print(f"{row['path']}: " + ", ".join(f"{t['class']} {t['probability']:.3f}" for t in row["top"]))
  if failed := write(rows, args.json, args.csv):
    sys.exit(f"error: {'; '.join(failed)}; the predictions are above")


if __name__ == "__main__":
  cli.run(main)
