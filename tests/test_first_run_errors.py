"""A first run that stops on a mistake in its data settings: one line that says what is wrong and which key to set,
and no workdir left behind that the run made for nothing (a directory the user made stays)."""

import json
import os
import subprocess
import sys

import pytest

from alexnet_jax.data import store
from alexnet_jax.training import workdirs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(workdir, *flags) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "scripts/train.py", "--config", "configs/demo.py", "--workdir", str(workdir),
                         *flags], cwd=ROOT, capture_output=True, text=True, timeout=180)


def folders(root, *inside):
  os.makedirs(root)
  for path in inside:
    os.makedirs(root / path)
  return root


def write_manifest(root, splits):
  """A finished store's manifest, as make prepare writes it, without shards: enough to look its splits up."""
  os.makedirs(root)
  (root / store.MANIFEST).write_text(json.dumps(dict(
      format=store.FORMAT, version=store.VERSION, size=256, num_classes=2, classes=["cat", "dog"],
      source=dict(folder="photos"), splits={s: dict(count=10, shards=1) for s in splits})))
  return root


CASES = {
    "store not there": (lambda p: p / "wrong", "store", (), "no such directory: {data}"),
    "store dir empty": (lambda p: folders(p / "empty"), "store", (),
                        "{data} holds no store (no manifest.json): make prepare ARGS='--name=… --data_dir=… "
                        "--store={data}' writes one"),
    "store half-written": (lambda p: folders(p / "half", "parts"), "store", (),
                           "{data} is not a finished store (no manifest.json); rerun make prepare ARGS='--name=… "
                           "--data_dir=… --store={data}' with the arguments that began it"),
    "store train split": (lambda p: write_manifest(p / "store", ["train", "val"]), "store",
                          ("--config.dataset.train_split=training", "--config.dataset.eval_split=val"),
                          "no split 'training' in the store {data} (it holds: train, val): set "
                          "--config.dataset.train_split=train"),
    "folder not there": (lambda p: p / "wrong", "folder", (), "no such directory: {data}"),
    "folder eval split": (lambda p: folders(p / "photos", "train/cat", "val/cat"), "folder", (),
                          "no split 'validation' in {data} (it holds: train, val): set "
                          "--config.dataset.eval_split=val"),
    "folder train split": (lambda p: folders(p / "photos", "training/cat", "testing", "val/cat"), "folder",
                           ("--config.dataset.eval_split=val",), "no split 'train' in {data} (it holds: testing, "
                           "training, val): set --config.dataset.train_split to one of them"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_data_mistake_says_what_is_wrong_in_one_line_and_leaves_no_workdir(tmp_path, case):
  make, name, flags, said = CASES[case]
  data = make(tmp_path)
  workdir = tmp_path / "runs" / "first"  # neither it nor runs/ exists: the run makes both
  run = train(workdir, f"--config.dataset.name={name}", f"--config.dataset.data_dir={data}",
              "--config.dataset.num_classes=0", *flags)
  assert run.returncode == 1, run.stderr
  assert run.stderr.strip().splitlines()[-1] == "error: " + said.format(data=data)
  assert "Traceback" not in run.stderr
  assert not os.path.exists(tmp_path / "runs")


@pytest.mark.parametrize("held", [["notes.txt"], []])
def test_a_workdir_the_user_made_stays(tmp_path, held):
  workdir = tmp_path / "mine"
  workdir.mkdir()
  for name in held:
    (workdir / name).write_text("mine")
  run = train(workdir, "--config.dataset.name=folder", f"--config.dataset.data_dir={tmp_path / 'wrong'}")
  assert run.returncode == 1 and run.stderr.strip().endswith(f"error: no such directory: {tmp_path / 'wrong'}")
  assert sorted(os.listdir(workdir)) == sorted(held + [workdirs.LOCK])


@pytest.mark.parametrize("written", ["run.json", "checkpoints/1/state", None])
def test_a_workdir_the_run_made_is_kept_once_anything_was_written_in_it(tmp_path, written):
  workdir = tmp_path / "a" / "run"
  with pytest.raises(ValueError, match="stopped"):
    with workdirs.claim(str(workdir)):
      os.makedirs(workdir / "checkpoints" / "tmp")  # empty folders, as orbax makes them: nothing of value
      if written:
        os.makedirs(os.path.dirname(workdir / written), exist_ok=True)
        (workdir / written).write_text("")
      raise ValueError("stopped")
  assert (workdir / written).exists() if written else not (tmp_path / "a").exists()
