"""Where the scripts write (predict.py --json and --csv, export.py --out, evaluate.py --out): never over a run's own
files (alexnet_jax.training.workdirs.check_output, the one rule of the three), beside them in the workdir if asked,
every file whole or not at all, and a path that cannot be written said in one line with its reason; predict.py among
images one of which is a decompression bomb."""

import json
import os
import stat
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image
from test_reliability import finished  # noqa: F401  (a tiny trained run with all of a run's files: the fixture)

from alexnet_jax import export
from alexnet_jax.training import workdirs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FULL = "/dev/full"  # Linux's device on which every write fails with ENOSPC


def script(name: str, *args, timeout=300) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, f"scripts/{name}", *map(str, args)], cwd=ROOT, capture_output=True,
                        text=True, timeout=timeout)


def last_line(done: subprocess.CompletedProcess) -> str:
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  return done.stderr.strip().splitlines()[-1]


def images(folder, names=("a.png", "b.png")) -> str:
  os.makedirs(folder, exist_ok=True)
  for i, name in enumerate(names):
    Image.fromarray(np.random.default_rng(i).integers(0, 256, (40, 48, 3), np.uint8)).save(os.path.join(folder, name))
  return str(folder)


def test_every_file_a_run_writes_is_refused_as_an_output_and_a_new_file_beside_them_is_not(finished, tmp_path):
  workdir = finished[0]
  written = [os.path.join(root, name) for root, dirs, files in os.walk(workdir) for name in dirs + files]
  assert {os.path.relpath(p, workdir) for p in written} >= {".lock", "run.json", "metrics.jsonl", "curves.png",
                                                            "conv1_filters.png", "conv1_learned.png", "checkpoints",
                                                            "tensorboard"}
  alias, link = tmp_path / "alias", tmp_path / "link.json"
  alias.symlink_to(workdir)
  link.symlink_to(os.path.join(workdir, "run.json"))
  outputs = [workdir, *written, os.path.join(workdir, "metrics.jsonl.1"), os.path.join(workdir, "checkpoints", "p"),
             str(alias / "run.json"), str(link)]
  for path in outputs:
    with pytest.raises(ValueError, match=f"^--out {path} is a file of the run in {workdir}: write it elsewhere$"):
      workdirs.check_output("--out", path, workdir)
  moved = tmp_path / "moved"  # a run whose checkpoints/ links to another disk
  (moved / "elsewhere").mkdir(parents=True)
  (moved / "run").mkdir()
  (moved / "run" / "checkpoints").symlink_to(moved / "elsewhere")
  with pytest.raises(ValueError, match="is a file of the run"):
    workdirs.check_output("--json", str(moved / "run" / "checkpoints" / "p.json"), str(moved / "run"))
  for path in ("model.jaxexport", "eval_10.json", "predictions.csv", "../run.json"):
    workdirs.check_output("--out", os.path.join(workdir, path), workdir)


@pytest.mark.parametrize("name, flag, target", [("export.py", "--out", "run.json"),
                                                ("evaluate.py", "--out", "metrics.jsonl"),
                                                ("predict.py", "--csv", "conv1_learned.png")])
def test_the_scripts_refuse_an_output_over_a_run_s_file_in_one_line_and_touch_nothing(finished, tmp_path, name, flag,
                                                                                       target):
  workdir = finished[0]
  path = os.path.join(workdir, target)
  before = open(path, "rb").read()
  inputs = [images(tmp_path / "photos")] if name == "predict.py" else []
  done = script(name, "--workdir", workdir, flag, path, *inputs)
  assert done.returncode == 1
  assert last_line(done) == f"error: {flag} {path} is a file of the run in {workdir}: write it elsewhere"
  assert open(path, "rb").read() == before


def test_export_writes_an_artifact_into_the_run_s_workdir(finished):
  out = os.path.join(finished[0], "model.jaxexport")
  done = script("export.py", "--workdir", finished[0], "--out", out)
  assert done.returncode == 0, done.stderr[-3000:]
  assert len(export.load(out).classes) == 10 and not os.path.exists(out + ".tmp")
  os.remove(out)


@pytest.mark.skipif(not os.path.exists(FULL), reason=f"needs {FULL}")
@pytest.mark.parametrize("name", ["predict.py", "export.py", "evaluate.py"])
def test_an_output_on_a_full_device_is_named_with_the_reason_in_one_line(finished, tmp_path, name):
  workdir = finished[0]
  more = {"predict.py": ["--json", FULL, "--csv", tmp_path / "out.csv", images(tmp_path / "photos")],
          "export.py": ["--out", FULL], "evaluate.py": ["--out", FULL, "--crops", "1"]}[name]
  done = script(name, "--workdir", workdir, *more)
  assert done.returncode == 1
  then = {"predict.py": "; the predictions are above", "evaluate.py": "; the results are above"}.get(name, "")
  assert last_line(done) == f"error: cannot write {FULL}: No space left on device{then}"
  assert stat.S_ISCHR(os.stat(FULL).st_mode)  # written into, not renamed over
  if name == "predict.py":  # the other output is written all the same, and the predictions are printed
    assert len(done.stdout.splitlines()) == 2 and (tmp_path / "out.csv").read_text().startswith("path,rank")


def test_a_file_that_cannot_be_written_whole_is_left_as_it_was(tmp_path):
  out = tmp_path / "predictions.json"
  out.write_text("the earlier predictions")
  code = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
          "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000)); from alexnet_jax.training import workdirs; "
          f"workdirs.write_file({str(out)!r}, bytes(5000))")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert done.returncode == 1 and done.stderr.strip().endswith(f"ValueError: cannot write {out}: File too large")
  assert out.read_text() == "the earlier predictions" and os.listdir(tmp_path) == ["predictions.json"]


def bomb_png(path, side: int = 20_000) -> None:
  """A 1-bit grey PNG of side² pixels, all black: 50 MB of rows that compress to about 50 KB."""
  def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

  rows = zlib.compress(bytes((1 + side // 8) * side))  # each row: its filter byte, then side / 8 bytes
  path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
                   + chunk(b"IDAT", rows) + chunk(b"IEND", b""))


def test_predict_skips_a_decompression_bomb_among_good_images(finished, tmp_path):
  photos = images(tmp_path / "photos", ("a.png", "c.png"))
  bomb = tmp_path / "photos" / "b.png"
  bomb_png(bomb)
  with pytest.raises(Image.DecompressionBombError):
    Image.open(bomb)
  done = script("predict.py", "--workdir", finished[0], "--json", tmp_path / "out.json", photos)
  assert done.returncode == 0, done.stderr[-3000:]
  assert [line.split(": ")[0] for line in done.stdout.splitlines()] == [f"{photos}/a.png", f"{photos}/c.png"]
  (skipped,) = [line for line in done.stderr.splitlines() if line.startswith("skipped")]
  assert skipped.startswith(f"skipped {bomb}: Image size (400000000 pixels) exceeds limit"), skipped
  rows = json.loads((tmp_path / "out.json").read_text())
  assert ["top" in r for r in rows] == [True, False, True] and rows[1]["skipped"].startswith("Image size")
