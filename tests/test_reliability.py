"""What happens when things go wrong (docs/reliability.md): divergence, a collapsed network, preemption, odd images,
broken metrics files, busy or unusable workdirs: each stops or recovers with one clear line. Checkpoints that cannot
be read or saved: test_checkpoints.py; what the scripts say of broken inputs: test_command_line.py; both use this
file's tiny run."""

import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import ml_collections
import numpy as np
import pytest
from PIL import Image

from alexnet_jax.config import KEYS, describe, paper_config, validate
from alexnet_jax.data import DataError, decode, pipeline, sources
from alexnet_jax.network import interchange, table
from alexnet_jax.network.table import Layer, Table
from alexnet_jax.training import checkpoints, guard, loop, metrics, train, workdirs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ten steps of a two-tower network small enough to compile in a moment, on 32×32 procedural images; a config file,
# so that the command-line tests run it too. In bfloat16: the step then holds the kernels the update narrows, which
# checkpoints leave out and a resumed run makes again.
TINY_CONFIG = """
from alexnet_jax.network import table
from alexnet_jax.config import paper_config
from alexnet_jax.network.table import Layer, Table


@table.register("reliability_test_net")
def net(*, num_classes, width, towers, lrn_alpha_over_n):
  return Table((Layer("conv1", "conv", filters=round(32 * width), size=5, stride=2),
                Layer("pool1", "pool", size=3, stride=2),
                Layer("fc2", "fc", filters=round(256 * width), inputs="all"),
                Layer("fc3", "fc", filters=num_classes, split="sum", relu=False)), towers)


def get_config():
  c = paper_config()
  c.cpu_devices, c.network, c.image_size, c.weight_init = 2, "reliability_test_net", 32, "he"
  c.dtype = "bfloat16"
  c.dataset.name, c.dataset.num_classes = "procedural", 10
  c.dataset.num_train_examples, c.dataset.num_eval_examples = 320, 50
  c.batch_size, c.eval_batch_size, c.learning_rate = 32, 50, 0.01
  c.num_epochs, c.lr_drop_epochs = 1.0, ()
  c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps = 2, 100, 4
  return c
"""
_namespace = {}
exec(compile(TINY_CONFIG, "tiny_config", "exec"), _namespace)  # registers the network in this process


def tiny_config(**changes):
  c = _namespace["get_config"]()
  c.update(changes)
  return c


@pytest.fixture
def tiny_file(tmp_path):
  path = tmp_path / "tiny.py"
  path.write_text(TINY_CONFIG)
  return str(path)


def strict_rows(path) -> list[dict]:
  def refuse(constant):
    raise ValueError(f"{constant} is not JSON")
  return [json.loads(line, parse_constant=refuse) for line in open(path)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A tiny run of 10 steps with checkpoints 4, 8 and 10, and its final metrics."""
  workdir = str(tmp_path_factory.mktemp("finished"))
  return workdir, loop.train_and_evaluate(tiny_config(), workdir)


@pytest.fixture(scope="module")
def template():
  """A state of tiny_config()'s network (other values than any checkpoint's) for restore to lay out like."""
  config = tiny_config()
  setup = train.make_setup(config, 10, config.dataset.num_train_examples)
  return train.create_train_state(setup, jax.random.key(7))


# Divergence, and a network that no longer learns.

@table.register("dead_relu_test_net")
def dead_net(*, num_classes, width, towers, lrn_alpha_over_n):
  """conv1's biases so negative that no ReLU after it ever fires: the paper's recipe's collapse, from step 1."""
  del width, lrn_alpha_over_n
  return Table((Layer("conv1", "conv", filters=8, size=5, stride=2, bias_init=-100.0),
                Layer("pool1", "pool", size=3, stride=2), Layer("fc2", "fc", filters=16, inputs="all"),
                Layer("fc3", "fc", filters=num_classes, split="sum", relu=False)), towers)


def test_a_collapsed_network_stops_in_one_line_with_what_to_try(tmp_path):
  config = tiny_config(network="dead_relu_test_net", weight_init="paper", log_every_steps=1, num_epochs=1.0)
  with pytest.raises(guard.Collapsed, match=r"^training collapsed: since step 1 the loss is 2.30\d\d ≈ ln 10, .* "
                     r"stopped at step 3, .* Try --config.weight_init=he, a lower --config.learning_rate or "
                     r"--config.warmup_epochs=1$"):
    loop.train_and_evaluate(config, str(tmp_path))
  rows = strict_rows(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2, 3] and all(r["logit_spread"] == 0 for r in rows)
  assert not os.listdir(tmp_path / "checkpoints")  # nothing worth keeping was saved
  # A live network does not: the same steps of the tiny net give each image its own logits.
  healthy = tiny_config(log_every_steps=1, num_epochs=0.3)
  loop.train_and_evaluate(healthy, str(tmp_path / "healthy"))
  rows = strict_rows(tmp_path / "healthy" / "metrics.jsonl")
  assert all(r["logit_spread"] > 0 for r in rows if r["split"] == "train")


def test_the_paper_s_recipe_stalled_at_chance_is_said_in_one_line_while_it_runs(tmp_path, capsys):
  # The paper's initialisation (N(0, 0.01), unit biases) and rate on a narrow AlexNet and ten classes: the loss falls
  # to ln 10 and stays, top-1 at chance, while the logits still vary (not collapsed, so the run goes on).
  config = paper_config()
  config.width, config.image_size = 0.125, 64
  config.dataset.name, config.dataset.num_classes = "procedural", 10
  config.dataset.num_train_examples, config.dataset.num_eval_examples = 3200, 100
  config.batch_size, config.eval_batch_size, config.num_steps = 32, 100, 150
  config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps = 10, 150, 150
  loop.train_and_evaluate(config, str(tmp_path))
  rows = strict_rows(tmp_path / "metrics.jsonl")
  train_rows = [r for r in rows if r["split"] == "train"]
  assert all(abs(r["loss"] - np.log(10)) < 0.05 and r["top1"] < 0.15 for r in train_rows[-10:])
  assert all(r["logit_spread"] > 0.01 for r in train_rows)
  (note,) = [r for r in rows if r["split"] == "note"]
  assert note["step"] == 150 and train_rows[-1]["steps_at_chance"] >= guard.STALL_STEPS
  assert re.fullmatch(r"warning: training has stalled: for \d+ steps \(since step \d+\) the loss has stayed near or "
                      r"above ln 10 = 2.303 \(now 2.3\d\d\) and top-1 at chance: the network is not learning. Try "
                      r"--config.weight_init=he, .*", note["message"])
  assert capsys.readouterr().out.count(note["message"]) == 1  # said once, as the run goes


def test_a_stall_is_measured_per_step_against_a_batch_s_noise():
  chance = np.log(10)
  learning = lambda loss, top1, count=32: bool(guard.above_chance(loss, top1, count, 10))  # noqa: E731
  assert not learning(chance, 0.1) and not learning(2.4, 0.25) and not learning(11.3, 0.0)  # noise, or worse
  assert learning(0.9 * chance, 0.1) and learning(chance, 0.3)
  assert learning(chance, 0.2, count=1024)  # 10 points above chance is far beyond a large batch's noise
  stall = guard.Stall(start=0, classes=10, steps_per_epoch=40)
  assert stall.steps(dict(learning_at=0), 60) == 60 and stall.message(60, 60, 2.30) is None
  assert stall.steps(dict(learning_at=0), 99) == 99 and stall.message(99, 99, 2.30) is None
  assert stall.message(stall.steps(dict(learning_at=0), 100), 100, 2.30).startswith("warning: training has stalled")
  assert stall.message(stall.steps(dict(learning_at=0), 200), 200, 2.30) is None  # once
  resumed = guard.Stall(start=500, classes=10, steps_per_epoch=1000)  # an epoch longer than STALL_STEPS: it counts
  assert resumed.steps(dict(learning_at=0), 1200) == 700 and resumed.message(700, 1200, 2.3) is None
  assert resumed.steps(dict(learning_at=1150), 1200) == 50


def test_the_metrics_window_keeps_the_first_nonfinite_step_the_widest_spread_the_last_learning_step_and_sums():
  def step(loss, nonfinite_from, spread, learning_at):
    return dict(loss=jax.numpy.float32(loss), top1=jax.numpy.int32(3), count=jax.numpy.int32(8),
                nonfinite_from=jax.numpy.int32(nonfinite_from), logit_spread=jax.numpy.float32(spread),
                learning_at=jax.numpy.int32(learning_at))
  window = None
  for metrics in [step(1.5, guard.NEVER, 0.5, 1), step(np.nan, 2, 2.0, 0), step(2.5, 3, 1.0, 3),
                  step(0.5, guard.NEVER, 0.25, 0)]:
    window = guard.accumulate(window, metrics)
  window = jax.device_get(window)
  assert np.isnan(window["loss"]) and window["top1"] == 12 and window["count"] == 32
  assert window["nonfinite_from"] == 2 and window["logit_spread"] == 2.0 and window["learning_at"] == 3
  finite = jax.device_get(guard.accumulate(step(1.5, guard.NEVER, 0.5, 1), step(0.5, guard.NEVER, 0.25, 0)))
  assert finite["loss"] == 2.0 and finite["nonfinite_from"] == guard.NEVER


def test_the_watch_stops_a_run_for_what_its_logs_and_checks_saw_with_one_line_each():
  ln10 = float(np.log(10))

  def logged(watch, done, loss=ln10, spread=0.5, nonfinite_from=guard.NEVER, learning_at=0, signalled=None):
    watch.after(done, signalled)  # as the loop feeds it: a window fetched to the host, as numpy scalars
    return watch.log(dict(learning_at=np.int32(learning_at), nonfinite_from=np.int32(nonfinite_from),
                          logit_spread=np.float32(spread)), loss)

  nothing = guard.Watch(start=0, classes=10, steps_per_epoch=40)  # a stall is said once, and the run goes on
  assert logged(nothing, 99) is None and nothing.at_chance == 99
  assert logged(nothing, 100).startswith("warning: training has stalled: for 100 steps (since step 1)")
  assert logged(nothing, 150) is None and not nothing.stop and nothing.raise_stop(None, "ckpt") is None
  # Three logs in a row of the same logits for every image at ln 10, from the step after the last live log.
  dead = guard.Watch(start=10, classes=10, steps_per_epoch=40)
  for done, spread in ((12, 0.0), (14, 0.5), (16, 0.0), (18, 0.0)):
    logged(dead, done, spread=spread)
  assert not dead.stop
  logged(dead, 20, spread=0.0)
  assert dead.stop and dead.failed
  with pytest.raises(guard.Collapsed, match=r"^training collapsed: since step 15 the loss is 2.3026 .* stopped at "
                     r"step 20,"):
    dead.raise_stop(None, "ckpt")
  # A loss not finite at the run's first step is not the learning rate's doing; later it is, whatever else came.
  first = guard.Watch(start=10, classes=10, steps_per_epoch=40)
  logged(first, 11, loss=float("nan"), nonfinite_from=11)
  with pytest.raises(guard.Diverged, match=r"^a non-finite loss at step 11, the first of this run, before any"):
    first.raise_stop(None, "ckpt")
  later = guard.Watch(start=10, classes=10, steps_per_epoch=40)
  logged(later, 14, loss=float("nan"), nonfinite_from=13, signalled=signal.SIGTERM)
  with pytest.raises(guard.Diverged, match=r"^training diverged: a non-finite loss at step 13; stopped without "
                     r"saving, the last finite checkpoint is step 10 in ckpt: rerun"):
    later.raise_stop(10, "ckpt")
  # A state found not finite before a save is never saved, even at the first step.
  state = guard.Watch(start=0, classes=10, steps_per_epoch=40)
  state.after(1, None)
  assert state.finite(dict(w=np.ones(3, np.float32))) and not state.stop
  assert not state.finite(dict(w=np.array([1.0, np.nan], np.float32))) and state.failed
  with pytest.raises(guard.Diverged, match=r"^training diverged: a non-finite state at step 1; .* and no checkpoint"):
    state.raise_stop(None, "ckpt")
  # A signal stops the run after the step it came at, which saves it.
  signalled = guard.Watch(start=0, classes=10, steps_per_epoch=40)
  logged(signalled, 6, learning_at=6, signalled=signal.SIGTERM)
  assert signalled.stop and not signalled.failed and signalled.at_chance == 0
  with pytest.raises(guard.Interrupted, match=r"^stopped by SIGTERM after step 6, saved in ckpt; rerun"):
    signalled.raise_stop(6, "ckpt")


@pytest.mark.parametrize("seen_in", ["loss", "state"])
def test_divergence_stops_without_saving_a_nonfinite_state(tmp_path, template, seen_in):
  # Logged every step and never saved, the run sees the first non-finite loss in its metrics window; saved every
  # step and never logged, it sees the non-finite state before saving it, and keeps the step before.
  every = dict(log_every_steps=1, checkpoint_every_steps=100) if seen_in == "loss" else dict(
      log_every_steps=100, checkpoint_every_steps=1)
  config = tiny_config(learning_rate=1e3, checkpoints_to_keep=1, **every)
  with pytest.raises(guard.Diverged, match=f"training diverged: a non-finite {seen_in} at step ") as e:
    loop.train_and_evaluate(config, str(tmp_path))
  step = e.value.step
  assert "stopped without saving" in str(e.value) and "rerun with a lower config.learning_rate" in str(e.value)
  if seen_in == "loss":
    rows = strict_rows(tmp_path / "metrics.jsonl")  # valid JSON: no NaN literal
    assert [r["loss"] is None for r in rows] == [False] * (step - 1) + [True]
    assert e.value.last_checkpoint is None and not os.listdir(tmp_path / "checkpoints")
    return
  assert e.value.last_checkpoint == step - 1 and os.listdir(tmp_path / "checkpoints") == [str(step - 1)]
  state, _ = checkpoints.restore(checkpoints.manager(str(tmp_path), config), template)
  assert guard.all_finite(state)  # checkpoints_to_keep=1 did not rotate the last finite checkpoint away


def test_a_loss_not_finite_before_any_update_does_not_blame_the_learning_rate(tmp_path):
  # Weights near float32's largest overflow the logits at once: the first step's loss, taken before its update,
  # is not finite, whatever the learning rate.
  config = tiny_config(log_every_steps=1)
  setup = train.make_setup(config, 10, config.dataset.num_train_examples)
  weights = interchange.to_torch(train.create_train_state(setup, jax.random.key(0)).params, setup.net.table)
  weights["fc3.weight"] = np.full_like(weights["fc3.weight"], 3e38)
  np.savez(tmp_path / "w.npz", **weights)
  config.init_from = str(tmp_path / "w.npz")
  with pytest.raises(guard.Diverged) as e:
    loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert str(e.value).startswith("a non-finite loss at step 1, the first of this run, before any update: the images "
                                 "or the weights the run starts from give no finite loss")
  assert "learning_rate" not in str(e.value)


# Validation.

@pytest.mark.parametrize("key,value,message", [
    ("learning_rate", float("nan"), r"config.learning_rate must be a number in \[1e-12, 1e\+06\], got nan"),
    ("learning_rate", float("inf"), r"config.learning_rate must be a number in \[1e-12, 1e\+06\], got inf"),
    ("num_epochs", float("inf"), r"config.num_epochs must be a number in \[1e-06, 1e\+06\], got inf"),
    ("width", float("nan"), r"config.width must be a number in \[0.001, 64\], got nan"),
    ("momentum", 1.0, r"config.momentum must be a number in \[0, 0.999999\], got 1.0"),
    ("mesh.model", 0, r"config.mesh.model must be an integer in \[1, 4,096\], got 0"),
    ("mesh.data", 0, r"config.mesh.data must be an integer in \[1, 65,536\], or -1: every other device, got 0"),
    ("dataset.pca_sigma", -0.1, r"config.dataset.pca_sigma must be a number in \[0, 10\], got -0.1"),
    ("seed", -1, r"config.seed must be an integer in \[0, 2,147,483,647\], got -1"),
    ("cpu_devices", 100_000, r"config.cpu_devices must be an integer in \[0, 1,024\], got 100000"),
    ("batch_size", 2.0, r"config.batch_size must be an integer in \[1, 1,048,576\], got 2.0"),
    ("lr_drop_epochs", ("abc",), r"config.lr_drop_epochs must be a tuple of epochs in \[0, 1e\+06\], got \('abc',\)"),
    ("lr_drop_epochs", (30.0, float("nan")), r"config.lr_drop_epochs must be .* got \(30.0, nan\)"),
    ("lr_drop_epochs", (1e9,), r"config.lr_drop_epochs must be .* got \(1000000000.0,\)"),
    ("network", "lenet", "config.network must be one of 'alexnet', .*got 'lenet'"),
    ("gather_input", "yes", "config.gather_input must be one of False, True, got 'yes'"),
])
def test_values_out_of_range_or_not_finite_are_refused_naming_the_key(key, value, message):
  config = tiny_config()
  *parents, last = key.split(".")
  node = config
  for part in parents:
    node = node[part]
  with config.ignore_type():
    node[last] = value
  with pytest.raises(ValueError, match=message):
    validate(config)


def test_every_key_has_a_doc_and_an_allowed_range_and_the_paper_value_is_allowed():
  def leaves(config, prefix=""):
    for k, v in config.items():
      if isinstance(v, ml_collections.ConfigDict):
        yield from leaves(v, f"{prefix}{k}.")
      else:
        yield prefix + k
  config = paper_config()
  assert sorted(leaves(config)) == sorted(KEYS)
  validate(config)
  lines = describe(config).splitlines()
  assert len(lines) == 2 * len(KEYS) and lines[0].startswith("seed") and "an integer in [0, " in lines[1]


# Checkpoints that cannot be read.

def _largest_data_file(step_dir):
  files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(step_dir, "state", "ocdbt.process_0")) for f in fs]
  return max(files, key=os.path.getsize)


def _overwrite(path):
  with open(path, "r+b") as f:
    f.write(os.urandom(os.path.getsize(path)))


def _flip(path, n=8):
  """n bytes in the middle of the file with their lowest bit flipped: numbers a little off, still finite."""
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    flipped = bytes(b ^ 0x01 for b in f.read(n))
    f.seek(os.path.getsize(path) // 2)
    f.write(flipped)


def _empty(step_dir):
  for entry in os.listdir(step_dir):
    path = os.path.join(step_dir, entry)
    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


CORRUPTIONS = {
    "truncated data file": lambda d: os.truncate(_largest_data_file(d), 1000),
    "overwritten data file": lambda d: _overwrite(_largest_data_file(d)),
    "8 bytes flipped in a data file": lambda d: _flip(_largest_data_file(d)),
    "emptied step directory": _empty,
    "deleted manifest.ocdbt": lambda d: os.remove(os.path.join(d, "state", "manifest.ocdbt")),
    "garbled data/metadata": lambda d: open(os.path.join(d, "data", "metadata"), "w").write('{"next_batch": 1'),
    "deleted state/_METADATA": lambda d: os.remove(os.path.join(d, "state", "_METADATA")),
}


# Preemption.

def final_params(workdir: str, template):
  state, _ = checkpoints.restore(checkpoints.existing(workdir, tiny_config()), template)
  return jax.tree.map(np.asarray, state.params)


def test_a_run_stopped_by_sigterm_and_resumed_past_an_unreadable_checkpoint_ends_as_an_uninterrupted_run(
    finished, template, tmp_path):
  # A preemption saves the step it stopped after; that checkpoint is then found unreadable, and the rerun resumes
  # from the one before: the same metrics and, bit for bit, the same parameters as a run never stopped.
  assert threading.current_thread() is threading.main_thread()  # Python runs signal handlers there
  workdir = str(tmp_path / "run")
  jsonl = os.path.join(workdir, "metrics.jsonl")

  def preempt():  # as a cluster does, while the loop runs
    while not (os.path.exists(jsonl) and len(open(jsonl).readlines()) >= 5):
      time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=preempt, daemon=True).start()
  with pytest.raises(guard.Interrupted, match="stopped by SIGTERM after step ") as e:
    loop.train_and_evaluate(tiny_config(num_epochs=20.0, log_every_steps=1), workdir)
  stopped = e.value.step
  assert e.value.exit_status == 128 + signal.SIGTERM and 5 <= stopped < 10
  assert str(stopped) in os.listdir(os.path.join(workdir, "checkpoints"))
  assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handlers are the caller's again
  CORRUPTIONS["truncated data file"](os.path.join(workdir, "checkpoints", str(stopped)))
  assert loop.train_and_evaluate(tiny_config(), workdir) == finished[1]
  assert f"{stopped}.unreadable" in os.listdir(os.path.join(workdir, "checkpoints"))
  jax.tree.map(np.testing.assert_array_equal, final_params(workdir, template), final_params(finished[0], template))
  resumed_from = 8 if stopped == 9 else 4  # the last readable checkpoint: every 4 steps
  assert [r["step"] for r in strict_rows(jsonl) if r["split"] == "train"] == [
      *range(1, resumed_from + 1), *range(resumed_from + 2, 11, 2)]  # nothing logged twice


def _start(args, **kwargs):
  return subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs)


def _wait_for_training(process):
  """Reads stdout until the line train_and_evaluate prints once its signal handlers are in place."""
  for line in process.stdout:
    if " parameters, mesh " in line:
      return
  raise AssertionError(process.stderr.read())


@pytest.mark.parametrize("signals,status", [
    ((signal.SIGINT,), 128 + signal.SIGINT),  # Ctrl-C: the step finishes and is saved
    ((signal.SIGHUP,), 128 + signal.SIGHUP),  # the terminal closed: the same
    ((signal.SIGTERM, signal.SIGTERM), -signal.SIGTERM),  # a second signal: at once, nothing saved
])
def test_command_line_stops_on_a_signal_in_one_line(tmp_path, tiny_file, signals, status):
  tmp_path = tmp_path / "run"
  process = _start(["scripts/train.py", "--config", tiny_file, "--workdir", str(tmp_path)])
  _wait_for_training(process)
  process.send_signal(signals[0])
  if len(signals) > 1:  # signals of one kind sent at once are delivered once: wait for the handler's line
    for line in process.stderr:
      if "stopping after this step" in line:
        break
    process.send_signal(signals[1])
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == status, stderr
  assert "Traceback" not in stderr
  name = signal.Signals(signals[0]).name
  if len(signals) == 1:
    assert stderr.strip().splitlines()[-1] == (f"stopped by {name} after step 1, saved in {tmp_path}/checkpoints; "
                                               "rerun the same command to resume")
    assert os.listdir(tmp_path / "checkpoints") == ["1"]
  else:
    assert stderr.strip().splitlines()[-1] == f"{name} again: stopping at once"
    saved = os.listdir(tmp_path / "checkpoints") if os.path.exists(tmp_path / "checkpoints") else []
    assert not any(name.isdigit() for name in saved)  # at most a temporary directory, which orbax removes


def test_sigterm_to_the_process_group_with_data_workers_saves_once_and_ends(tmp_path, tiny_file):
  # What Slurm's scancel and a container's stop do: the signal reaches the data-loading worker processes too.
  for split, n in (("train", 64), ("validation", 8)):
    for name in ("cat", "dog"):
      os.makedirs(tmp_path / "images" / split / name)
      for i in range(n):
        Image.fromarray(np.full((40, 40, 3), 60 * i % 256, np.uint8)).save(tmp_path / "images" / split / name /
                                                                            f"{i}.png")
  process = _start(["scripts/train.py", "--config", tiny_file, "--workdir", str(tmp_path / "run"),
                    "--config.dataset.name=folder", f"--config.dataset.data_dir={tmp_path / 'images'}",
                    "--config.dataset.num_classes=0", "--config.dataset.num_train_examples=0",
                    "--config.dataset.num_eval_examples=0", "--config.dataset.workers=1", "--config.num_epochs=50"],
                   start_new_session=True)
  _wait_for_training(process)
  os.killpg(process.pid, signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)  # a worker that died before the save used to leave it waiting
  assert process.returncode == 128 + signal.SIGTERM, stderr
  last = stderr.strip().splitlines()[-1]
  assert re.fullmatch(rf"stopped by SIGTERM after step (\d+), saved in {tmp_path}/run/checkpoints; rerun the same "
                      "command to resume", last), stderr
  assert "Traceback" not in stderr and "leaked" not in stderr  # the workers let go of their shared memory
  deadline = time.time() + 30  # nothing of the run is left: the workers and multiprocessing's tracker end with it
  with pytest.raises(ProcessLookupError):
    while time.time() < deadline:
      os.killpg(process.pid, 0)
      time.sleep(0.5)


# Images.

def test_high_bit_depth_images_are_scaled_or_refused_naming_the_file(tmp_path, caplog):
  for name in ("a", "b"):
    os.makedirs(tmp_path / "train" / name)
  Image.fromarray(np.full((40, 40), 32768, np.uint16)).save(tmp_path / "train" / "a" / "grey16.png")
  Image.fromarray(np.full((40, 40), 70000, np.int32)).save(tmp_path / "train" / "a" / "int32.tif")
  Image.fromarray(np.full((40, 40), 0.5, np.float32)).save(tmp_path / "train" / "b" / "float.tif")
  Image.fromarray(np.full((40, 40, 3), 200, np.uint8)).save(tmp_path / "train" / "b" / "rgb8.png")
  folder = sources.ImageFolder(str(tmp_path), "train", ("a", "b"), 32)
  assert (folder[0]["image"] == 128).all()  # mid-grey, not clipped to white
  for i in (1, 2):
    with pytest.raises(ValueError, match="of unknown range: store the image with 8 or 16 bits"):
      folder[i]
  with caplog.at_level(logging.WARNING):
    images, labels, skipped = decode.Decoder(folder, 32).batch([1, 2])
  assert skipped == 3 and (images == 200).all() and list(labels) == [1, 1]  # 1 and 2, then 2: for rgb8.png
  assert sum("int32.tif" in r.getMessage() for r in caplog.records) == 1
  # A tfds dataset's 16-bit arrays (tfds.features.Image(dtype=uint16)) take the same path as PIL's.
  tfds_like = sources._Tfds([dict(image=np.full((8, 8, 1), 32768, np.uint16), label=0)], 32, None)
  assert (tfds_like[0]["image"] == 128).all() and tfds_like[0]["image"].shape == (8, 8, 3)


def test_a_constant_colour_channel_is_normalised_with_a_floor_and_said(tmp_path, caplog):
  # Images whose blue is always 0 measure a blue std of 0: divided by it, every image would be NaN at step 1.
  rng = np.random.default_rng(0)
  for split, n in (("train", 32), ("validation", 8)):
    for c, name in enumerate(("cat", "dog")):
      os.makedirs(tmp_path / "images" / split / name)
      for i in range(n):
        pixels = rng.integers(0, 256, (40, 40, 3), np.uint8) // (1 + c)
        pixels[..., 2] = 0
        Image.fromarray(pixels).save(tmp_path / "images" / split / name / f"{i}.png")
  config = tiny_config(log_every_steps=1, num_epochs=2.0)
  config.dataset.update(name="folder", data_dir=str(tmp_path / "images"), num_classes=0, num_train_examples=0,
                        num_eval_examples=0)
  with caplog.at_level(logging.WARNING):
    final = loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert ["the blue channel of the training images is almost constant (std below 1/255 in the sample): normalised "
          "with std 1/255, so it is about 0 in every image"] == [
              r.getMessage() for r in caplog.records if "channel" in r.getMessage()]
  rows = strict_rows(tmp_path / "run" / "metrics.jsonl")
  assert all(r["loss"] is not None for r in rows if "loss" in r) and np.isfinite(final["loss"])
  std = json.load(open(tmp_path / "run" / "run.json"))["dataset"]["statistics"]["std"]
  assert std[2] == pytest.approx(1 / 255) and min(std[:2]) > 0.1


def test_non_finite_logits_are_never_counted_as_a_hit():
  logits = np.array([[np.nan] * 4, [1, np.nan, 0, 0], [np.inf, 0, 0, 0], [3, 2, 1, 0]], np.float32)
  m = jax.device_get(train.metrics_of(logits, np.array([0, 0, 0, 0]), np.ones(4, bool)))
  assert (m["top1"], m["top5"], m["count"]) == (1, 1, 4)  # only the finite row scores


def test_a_batch_of_one_image_is_drawn():
  # Grain measures an endless dataset in batches of one as longer than an index can be.
  dataset = pipeline.get_dataset(tiny_config())
  batch, skipped = pipeline.train_batches(dataset, 1)[7]
  assert batch["image"].shape[0] == 1 and skipped == 0


def test_an_empty_class_folder_is_reported(tmp_path):
  for name in ("cat", "dog", "emu"):
    os.makedirs(tmp_path / "train" / name)
  Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "train" / "cat" / "1.png")
  (tmp_path / "train" / "emu" / "notes.txt").write_text("not an image")
  with pytest.raises(DataError, match=r"train has class folders without images \(.*\): dog, emu; add images or "):
    sources.ImageFolder(str(tmp_path), "train", sources.folder_classes(str(tmp_path), "train"), 32)


# metrics.jsonl.

def test_metrics_jsonl_is_strict_json_appended_and_cut_in_place(tmp_path, caplog):
  jsonl = tmp_path / "metrics.jsonl"
  writer = metrics.MetricWriter(str(tmp_path))
  for step in (2, 4, 6):
    writer.write("train", step, dict(loss=float("nan") if step == 6 else 1.0 / step, top1=float("inf")))
  writer.close()
  assert strict_rows(jsonl)[-1] == dict(step=6, split="train", loss=None, top1=None)
  with open(jsonl, "a") as f:
    f.write('{"step": 8, "split": "tr')  # a run killed mid-write
  inode, head = os.stat(jsonl).st_ino, jsonl.read_text().splitlines()[:2]
  with caplog.at_level(logging.WARNING):
    metrics.MetricWriter(str(tmp_path), resume_step=4).close()  # resumed from checkpoint 4
  assert f"{jsonl}: dropped its half-written last line" in caplog.text
  assert os.stat(jsonl).st_ino == inode and jsonl.read_text().splitlines() == head  # cut, not rewritten
  metrics.MetricWriter(str(tmp_path), resume_step=0).close()  # no checkpoint: a run from scratch
  assert not jsonl.exists() and len(strict_rows(tmp_path / "metrics.jsonl.1")) == 2  # the history is kept
  jsonl.write_text('{"step": 2, "split": "train"}\nnot json\n{"step": 4, "split": "train"}\n')
  with pytest.raises(metrics.MetricsError, match=f"{jsonl} line 2 is not a JSON object of a step"):
    metrics.MetricWriter(str(tmp_path), resume_step=4)


# The workdir.

def test_a_second_run_on_a_workdir_is_refused(tmp_path):
  with workdirs.claim(str(tmp_path)):  # a run holds it
    with pytest.raises(workdirs.WorkdirError, match=f"another run .pid {os.getpid()}. is using --workdir {tmp_path}"):
      loop.train_and_evaluate(tiny_config(), str(tmp_path))
  with workdirs.claim(str(tmp_path)):  # released when the run ends
    pass


@pytest.mark.parametrize("where,message", [
    ("a file", "is a file, not a directory"),
    ("under a file", "cannot write in .*: Not a directory"),
    ("/proc", "cannot write in /proc/alexnet_jax_test: No such file or directory"),
    # A read-only checkpoints/ (a read-only mount, here sysfs, which refuses new files even to root).
    ("read-only checkpoints", r"cannot write in .*/run: Permission denied \(.*/run/checkpoints/\w+\): pass a "
                              "writable directory as --workdir"),
    # Orbax's paths below a workdir this long would pass the system's 4,096 bytes: refused before training.
    ("4,000 characters", r"--workdir is 4,000 bytes long: the checkpoints below it need 160 more, over this "
                         "system's 4,096-byte limit on a path; pass a shorter one"),
])
def test_an_unusable_workdir_stops_naming_it(tmp_path, where, message):
  (tmp_path / "file").write_text("")
  os.makedirs(tmp_path / "run")
  os.symlink("/sys/kernel", tmp_path / "run" / "checkpoints")
  long = str(tmp_path)
  while len(long) < 3800:
    long = os.path.join(long, "d" * 200)
  long = os.path.join(long, "d" * (3999 - len(long)))
  workdir = {"a file": tmp_path / "file", "under a file": tmp_path / "file" / "run",
             "/proc": "/proc/alexnet_jax_test", "read-only checkpoints": tmp_path / "run",
             "4,000 characters": long}[where]
  with pytest.raises(workdirs.WorkdirError, match=message):
    loop.train_and_evaluate(tiny_config(), str(workdir))
  assert not os.path.exists(os.path.join(tmp_path, "d" * 200))  # nothing made where nothing can be kept


def test_an_empty_workdir_flag_is_refused_rather_than_meaning_the_default(tiny_file):
  run = subprocess.run([sys.executable, "scripts/train.py", "--config", tiny_file, "--workdir="], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 1
  assert run.stderr.strip() == "error: --workdir is empty: give it a path, or leave the flag out"


@pytest.mark.parametrize("limit,where", [(200_000, "checkpoint"), (5_000, "metrics")])
def test_a_full_disk_stops_with_one_line(tmp_path, tiny_file, limit, where):
  # A file size limit fails writes as a full disk does (EFBIG rather than ENOSPC), without root or a filesystem:
  # the metrics fit in 200 kB, a checkpoint (1.2 MB of weights) does not; in 5 kB, TensorBoard's events of a few
  # logs do not either (checkpoints only at the end).
  tmp_path = tmp_path / "run"
  limited = (f"import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
             "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
  more = ["--config.log_every_steps=1", "--config.checkpoint_every_steps=1000"] if where == "metrics" else []
  run = subprocess.run([sys.executable, "-c", limited, "scripts/train.py", "--config", tiny_file, "--workdir",
                        str(tmp_path), *more], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 1
  said = {"checkpoint": f"error: cannot save a checkpoint in {tmp_path}/checkpoints: {os.strerror(errno.EFBIG)};",
          "metrics": f"error: cannot write in {tmp_path}: {os.strerror(errno.EFBIG)} ({tmp_path}):"}[where]
  assert run.stderr.strip().splitlines()[-1].endswith(
      f"{said} free space, then rerun the same command to resume from the last checkpoint"), run.stderr[-2000:]
  assert "Traceback" not in run.stderr and not re.search(r"^E\d{4} ", run.stderr, re.M)  # nor orbax's error logs
  assert "Exception" not in run.stderr  # nor a thread's or an exit handler's

