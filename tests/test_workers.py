"""Worker processes end with the process that started them, however it ends: Grain's data workers of training
(data/pipeline.py's iterate) and make prepare's shard writers (data/prepare.py), after a SIGKILL of their parent."""

import glob
import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from PIL import Image

from alexnet_jax.data import rings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)
GONE_WITHIN_S = 5

# Three of training's Grain workers, two of them past their first batch, then a parent that waits to be killed.
ITERATE = """
import time
from alexnet_jax.configs import demo
from alexnet_jax.data import get_dataset, iterate, train_batches

config = demo.get_config()
config.dataset.update(dict(num_train_examples=64, num_eval_examples=8))
batches = iterate(train_batches(get_dataset(config), 8), 0, 3)
next(batches), next(batches)  # one from each of the first two workers
print("ready", batches.reader.tag, flush=True)
time.sleep(600)
"""


def workers_of(parent: psutil.Process, at_least: int, timeout_s: float = 120) -> list[psutil.Process]:
  """The processes `parent` started, once it has started `at_least` of them."""
  deadline = time.monotonic() + timeout_s
  while len(children := parent.children(recursive=True)) < at_least:
    assert time.monotonic() < deadline, f"{parent.pid} started {len(children)} processes, not {at_least}"
    time.sleep(0.05)
  return children


def assert_gone_after_kill(run: subprocess.Popen, children: list[psutil.Process]) -> None:
  run.send_signal(signal.SIGKILL)
  run.wait()
  deadline = time.monotonic() + GONE_WITHIN_S
  try:
    while alive := [p for p in children if _alive(p)]:
      assert time.monotonic() < deadline, f"alive {GONE_WITHIN_S} s after their parent's SIGKILL: {alive}"
      time.sleep(0.05)
  finally:
    for p in children:  # what a failure left, so that it does not outlive the test
      if _alive(p):
        p.kill()


def _alive(p: psutil.Process) -> bool:
  try:
    return p.status() != psutil.STATUS_ZOMBIE  # ended, not yet reaped by whoever inherited it
  except psutil.NoSuchProcess:
    return False


def test_training_data_workers_end_with_a_killed_run():
  run = subprocess.Popen([sys.executable, "-c", ITERATE], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
  try:
    assert select.select([run.stdout], [], [], 120)[0], "no batch from the workers in 120 s"
    word, tag = run.stdout.readline().split()
    assert word == "ready"
    children = workers_of(psutil.Process(run.pid), 3)
    assert sum("spawn_main" in " ".join(p.cmdline()) for p in children) >= 3, children
    deadline = time.monotonic() + 60  # the third worker's ring, made for its first batch, which nobody took
    while not (rings_left := glob.glob(f"{rings.ring_prefix(tag)}*")):
      assert time.monotonic() < deadline, "no ring that the parent has not mapped"
      time.sleep(0.05)
    assert_gone_after_kill(run, children)
    assert not [path for path in rings_left if os.path.exists(path)]  # removed by the worker as it ended
  finally:
    run.kill()
    run.wait()


@pytest.fixture(scope="module")
def big_images(tmp_path_factory):
  """root/train/{a,b}/: small images that a store of 4096 pixels a side takes a while to encode."""
  root = tmp_path_factory.mktemp("photos")
  rng = np.random.default_rng(0)
  for name in "ab":
    os.makedirs(root / "train" / name)
    for i in range(8):
      Image.fromarray(rng.integers(0, 256, (24, 32, 3), np.uint8)).save(root / "train" / name / f"{i}.png")
  return root


def test_prepare_workers_end_with_a_killed_prepare(big_images, tmp_path):
  out = tmp_path / "store"
  run = subprocess.Popen([sys.executable, "scripts/prepare_data.py", "--name=folder", f"--data_dir={big_images}",
                          f"--store={out}", "--size=4096", "--shard_size=1", "--workers=2"], cwd=ROOT, env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    parent = psutil.Process(run.pid)
    workers_of(parent, 2)
    while not (os.path.isdir(out / "parts") and os.listdir(out / "parts")):  # a worker has written a shard
      assert run.poll() is None, "prepare ended before it could be killed"
      time.sleep(0.01)
    children = parent.children(recursive=True)
    assert_gone_after_kill(run, children)
    assert not os.path.exists(out / "manifest.json"), "prepare ended before it was killed"
  finally:
    run.kill()
    run.wait()
